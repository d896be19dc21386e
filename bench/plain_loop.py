"""The baseline a user would write by hand: plain PyTorch, clients and detectors one after
another, the same model, optimizer, batches and number of steps as fl_lightning."""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F

from fl_lightning.client import client_seed
from fl_lightning.data import ClientBatches
from fl_lightning.federation import sample_clients


def plain_federation(fed, rounds: int) -> list[float]:
    """Runs ``rounds`` rounds of fed's algorithm by hand on fed's data/partition/initial
    state; returns test accuracy per round."""
    fed.setup()
    if fed.strategy.name == "fedov":
        return [plain_fedov(fed)]
    d, f, opt_cfg = fed._data, fed.federation, fed.optimizer
    sampler = torch.Generator().manual_seed(fed.seed + 1)
    device = d.train_x.device  # the GPU when fed runs there (its data are then on it)
    state = {k: v.to(device) for k, v in fed.strategy.initial_state(torch.Generator().manual_seed(fed.seed)).items()}
    one_vs_all = fed.strategy.name == "fedova"
    accuracies = []
    for r in range(1, rounds + 1):
        updates = []
        for k in sample_clients(sampler, fed.partition.num_clients, f.client_fraction):
            idx = torch.from_numpy(fed.client_indices[k]).to(device)
            classes = torch.unique(d.train_y[idx]).tolist() if one_vs_all else [None]
            for row, c in enumerate(classes):
                model = copy.deepcopy(fed.template).to(device)
                model.load_state_dict({n: (v[c] if one_vs_all else v) for n, v in state.items()})
                opt = torch.optim.SGD(model.parameters(), lr=opt_cfg.lr, momentum=opt_cfg.momentum,
                                      weight_decay=opt_cfg.weight_decay)
                gen = torch.Generator().manual_seed(client_seed(fed.seed, r, k))
                for _ in range(f.local_epochs):
                    for x, y in ClientBatches(d.train_x, d.train_y, idx, f.batch_size, gen):
                        opt.zero_grad()
                        out = model(x)
                        loss = (F.binary_cross_entropy_with_logits(out.squeeze(-1), (y == c).float())
                                if one_vs_all else F.cross_entropy(out, y))
                        loss.backward()
                        opt.step()
                updates.append((c, {n: p.detach().clone() for n, p in model.state_dict().items()}))
        if one_vs_all:
            for c in {c for c, _ in updates}:
                group = [u for cc, u in updates if cc == c]
                for n in state:
                    state[n][c] = torch.stack([u[n] for u in group]).mean(0)
        else:
            state = {n: torch.stack([u[n] for _, u in updates]).mean(0) for n in state}
        accuracies.append(_accuracy(fed, state, one_vs_all))
    return accuracies


@torch.inference_mode()
def _accuracy(fed, state, one_vs_all: bool) -> float:
    d = fed._data
    model = copy.deepcopy(fed.template).to(d.test_x.device)
    correct = 0
    for start in range(0, len(d.test_x), 500):
        x = d.test_x[start:start + 500]
        if one_vs_all:
            scores = []
            for c in range(d.num_classes):
                model.load_state_dict({n: v[c] for n, v in state.items()})
                scores.append(model(x).squeeze(-1))
            pred = torch.stack(scores, 1).argmax(1)
        else:
            model.load_state_dict(state)
            pred = model(x).argmax(1)
        correct += int((pred == d.test_y[start:start + 500]).sum())
    return correct / len(d.test_x)


def plain_fedov(fed) -> float:
    """FedOV's one round written by hand (W4): every client, one after another, trains its
    (n + 1)-way model with the same loss terms, batched destruction and FGSM as fl_lightning
    (the same functions, so only the framework around them differs); then open-set voting."""
    from fl_lightning.algorithms.fedov.destruction import destroy
    from fl_lightning.algorithms.fedov.objective import fgsm_away_from
    from fl_lightning.functional import functional_forward
    from fl_lightning.algorithms.fedov.voting import open_set_vote

    fed.setup()
    d, f, opt_cfg, s = fed._data, fed.federation, fed.optimizer, fed.strategy
    unknown = d.num_classes
    state = s.initial_state(torch.Generator().manual_seed(fed.seed))
    models = []
    for k in range(fed.partition.num_clients):
        idx = torch.from_numpy(fed.client_indices[k])
        model = copy.deepcopy(fed.template)
        model.load_state_dict({n: v[k] for n, v in s.models(state).items()})
        opt = torch.optim.Adam(model.parameters(), lr=opt_cfg.lr, weight_decay=opt_cfg.weight_decay)
        torch.manual_seed(client_seed(fed.seed, 1, k))
        gen = torch.Generator().manual_seed(client_seed(fed.seed, 1, k))
        outlier_gen = torch.Generator().manual_seed(k)
        for _ in range(f.local_epochs):
            for x, y in ClientBatches(d.train_x, d.train_y, idx, f.batch_size, gen):
                destroyed = destroy(x, outlier_gen)
                enhanced = fgsm_away_from(functional_forward(model), dict(model.named_parameters()), destroyed,
                                          torch.ones(len(destroyed)), unknown, s.fgsm_steps, s.fgsm_step_size)
                opt.zero_grad()
                feats = model.features(torch.cat([x, destroyed, enhanced]))
                real, out_d, out_e = model.head(feats).split(len(x))
                target = torch.full_like(y, unknown)
                loss = F.cross_entropy(real, y) + F.cross_entropy(out_d, target) + F.cross_entropy(out_e, target)
                masked = real.masked_fill(F.one_hot(y, unknown + 1).bool(), float("-inf"))
                loss = loss + s.dummy_weight * F.cross_entropy(masked, target)
                pair = torch.randperm(len(y))
                keep = y != y[pair]
                if bool(keep.any()):
                    lam = float(torch.distributions.Beta(1.0, 1.0).sample())
                    mixed = lam * feats[: len(y)][keep] + (1 - lam) * feats[: len(y)][pair][keep]
                    loss = loss + s.mixup_weight * F.cross_entropy(model.head(mixed), target[keep])
                loss.backward()
                opt.step()
        models.append(model.eval())
    correct = 0
    with torch.inference_mode():
        for start in range(0, len(d.test_x), 500):
            x = d.test_x[start:start + 500]
            probs = torch.stack([m(x).softmax(1) for m in models])
            correct += int((open_set_vote(probs).argmax(1) == d.test_y[start:start + 500]).sum())
    return correct / len(d.test_x)
