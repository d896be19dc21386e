"""FedOV's open-set client in the cohort engine (``trainer.engine: cohort``): one member per
client, with ``OpenSetDetector``'s loss written for one member on one padded batch.

The loss draws random numbers every step: the data-destruction operations (from a generator
seeded at the start of the client's fit) and PROSER's mixup pairs and lambda (from the global
generator). ``OpenSetStreams`` draws them on the host, member by member, from each client's
own generator states, in the order the client's fit alone draws them, so that a member sees
the outliers and pairs it would see per client; FGSM then runs inside the vectorised loss (a
gradient with respect to the input, with the member's parameters held constant).
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F
from torch import Tensor

from fl_lightning.algorithms.fedov.open_set import OpenSetClient, OpenSetLoss, task_loss
from fl_lightning.cohort.members import CohortPlugin, Member, StepStreams, weighted_mean
from fl_lightning.messages import ClientResult

TERMS = ("ce", "dummy", "mixup", "destroyed", "enhanced")


class OpenSetStreams(StepStreams):
    """Each member's outliers, mixup pairs and lambda, drawn as its client's fit draws them:
    the global generator reseeded with the client's seed (``client.train_client``), the
    destruction generator seeded from it at fit start (``DataDestruction.on_fit_start``), then
    per step the destroyed batch, ``randperm`` and ``Beta(alpha, alpha)`` (``loss_terms``)."""

    def __init__(self, loss: OpenSetLoss, num_classes: int, seeds: list[int], member_entry: list[int]) -> None:
        from callbacks.outliers import DataDestruction

        self.loss, self.unknown = loss, num_classes
        weights = loss.weights()
        self.static = {"unknown": num_classes, "weights": tuple(weights[t] for t in TERMS),
                       "fgsm_steps": loss.fgsm_steps if loss.adversarial_weight > 0 else 0,
                       "fgsm_step": self._fgsm_step(loss)}
        outer = torch.get_rng_state()
        self.global_states, self.destruction = [], []
        for entry in member_entry:
            torch.manual_seed(seeds[entry])
            made = DataDestruction(loss.destruction_ops, loss.pixel_mean, loss.pixel_std)
            if loss.needs_destruction:
                made.on_fit_start(None, None)
            self.destruction.append(made)
            self.global_states.append(torch.get_rng_state())
        torch.set_rng_state(outer)

    @staticmethod
    def _fgsm_step(loss: OpenSetLoss) -> tuple[float, ...]:
        """The FGSM step per channel on the standardised inputs (as AdversarialOutlierEnhancement)."""
        if not loss.pixel_std:
            return (loss.fgsm_step_size,)
        return tuple(loss.fgsm_step_size / s for s in loss.pixel_std)

    def inputs(self, x: Tensor, y: Tensor, weight: Tensor, active: Tensor) -> dict[str, Tensor]:
        members, batch = y.shape
        destroyed = torch.zeros_like(x) if self.loss.needs_destruction else x[:, :0]
        perm = torch.arange(batch).repeat(members, 1)
        lam = torch.zeros(members)
        mixup = self.loss.mixup_weight != 0
        outer = torch.get_rng_state()
        for m in torch.nonzero(active.cpu()).flatten().tolist():
            n = int(weight[m].sum().item())  # the member's real samples; the rest is padding
            torch.set_rng_state(self.global_states[m])  # some destruction ops draw from it too
            if self.loss.needs_destruction:
                destroyed[m, :n] = self.destruction[m].destroy(x[m, :n])
            if mixup:
                perm[m, :n] = torch.randperm(n)
                lam[m] = torch.distributions.Beta(self.loss.mixup_alpha, self.loss.mixup_alpha).sample().item()
            self.global_states[m] = torch.get_rng_state()
        torch.set_rng_state(outer)
        return {"destroyed": destroyed, "perm": perm.to(y.device), "lam": lam.to(x.device)}


def _fgsm_away_from_unknown(forward, params, x: Tensor, weight: Tensor, unknown: int, steps: int,
                            step: Tensor) -> Tensor:
    """``callbacks.outliers.fgsm_away_from`` for one member: signed input-gradient steps that
    make the outliers look less "unknown"; the parameters are held constant."""
    from torch.func import grad

    frozen = {n: p.detach() for n, p in params.items()}
    target = torch.full(weight.shape, unknown, dtype=torch.long, device=x.device)

    def outlier_loss(inputs):
        return (F.cross_entropy(forward(frozen, inputs).float(), target, reduction="none") * weight).sum()

    x = x.detach()
    for _ in range(steps):
        x = (x + step * grad(outlier_loss)(x).sign()).detach()
    return x


class OpenSetCohort(CohortPlugin):
    def stack_key(self, task):
        if task.settings.get("architecture") is not None:
            return None
        return json.dumps({"open_set": task.settings["open_set"], "num_classes": task.settings["num_classes"]},
                          sort_keys=True)

    def member_count(self, task):
        return 1

    def members(self, task, client_state):
        return [Member(dict(task.params))]

    def step_streams(self, ctx, tasks, seeds, member_entry):
        return OpenSetStreams(task_loss(tasks[0]), int(tasks[0].settings["num_classes"]), seeds, member_entry)

    def loss(self, forward, params, consts, x, y, weight, *, unknown, weights, fgsm_steps, fgsm_step, destroyed,
             perm, lam):
        w = dict(zip(TERMS, weights))
        outliers = []
        if w["destroyed"] or fgsm_steps:
            outliers.append(destroyed)
        if fgsm_steps:
            step = torch.tensor(fgsm_step, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
            outliers.append(_fgsm_away_from_unknown(forward, params, destroyed, weight, unknown, fgsm_steps, step))
        features = forward(params, torch.cat([x, *outliers]), "features")
        logits = forward(params, features, "head").float()
        chunks = logits.split([len(x)] * (1 + len(outliers)))
        real = chunks[0]
        target_unknown = torch.full_like(y, unknown)

        def ce(out, target, mask):
            return weighted_mean(F.cross_entropy(out, target, reduction="none"), mask)

        total = ce(real, y, weight)
        if w["dummy"]:
            true_class = torch.arange(real.shape[1], device=y.device) == y[:, None]  # one_hot checks values: no vmap
            without_true = real.masked_fill(true_class, float("-inf"))
            total = total + w["dummy"] * ce(without_true, target_unknown, weight)
        if w["destroyed"]:
            total = total + w["destroyed"] * ce(chunks[1], target_unknown, weight)
        if fgsm_steps and w["enhanced"]:
            total = total + w["enhanced"] * ce(chunks[-1], target_unknown, weight)
        if w["mixup"]:
            # pairs of different classes only (padding pairs with itself: never different)
            different = (y != y[perm]).float() * weight
            real_features = features[: len(x)]
            mixed = lam * real_features + (1 - lam) * real_features[perm]
            total = total + w["mixup"] * ce(forward(params, mixed, "head").float(), target_unknown, different)
        return total

    def result(self, task, params, losses, steps, num_samples, client_state):
        return ClientResult(task.client_id, params[0], num_samples, task.classes, losses[0], steps)


OpenSetClient.cohort = OpenSetCohort()
