"""Batch norm and dropout in the cohort engine: the masked batch statistics against
nn.BatchNorm2d's on the real samples (and by hand), dropout masks drawn from each client's
own generator, and the cohort against per-client training for the FedAvg family's networks
with both (a small network; the FedAvg-MobileNet baseline; ATHENA-FL's MobileNet probe).

A note on tolerances: MobileNet's last blocks normalise 1x1 feature maps, so a batch of few
samples has few values per channel and its gradient is ill-conditioned (a batch of 2: float32
against float64 differ by 0.6 % of the gradient). At the tiny run's lr 0.05, perturbing the
per-client engine's own starting point by 1e-7 (relative) moved its parameters by 3e-5 after one
round and 9e-3 after two, and the cohort differed from it by as much; so the MobileNet runs
compare one round at lr 0.01 (measured: FedAvg 1.1e-6, ATHENA-FL's probe vectors 7e-7).
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fl_lightning.algorithms.baselines.classifier import ClassifierClient, MultiClassClassifier, classifier_task
from fl_lightning.client import ClientContext, make_trainer
from fl_lightning.cohort.batch_norm import weighted_batch_norm
from fl_lightning.cohort.dropout import DropoutMasks, drawn_dropout, dropout_layers
from fl_lightning.cohort.engine import CohortTrainer, stacks
from fl_lightning.config import FederationConfig, OptimizerConfig, TrainerConfig
from fl_lightning.models.architectures import ARCHITECTURES
from fl_lightning.models.mobilenets import MobileNet
from tests.test_cohort import run_engine


class SmoothReLU6(nn.Module):
    """ReLU6's smooth stand-in (``tests.conftest.smoothed`` says why): 6 - softplus(6 - softplus(x))."""

    def forward(self, x):
        return 6 - F.softplus(6 - F.softplus(x))


def smoothed_relu6(network: nn.Module) -> nn.Module:
    for name, layer in network.named_children():
        if isinstance(layer, nn.ReLU6):
            setattr(network, name, SmoothReLU6())
        else:
            smoothed_relu6(layer)
    return network


def small_network() -> nn.Module:
    """Batch norm after convolutions and on pooled 1-value features, dropout before the head."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, stride=2), nn.BatchNorm2d(4), SmoothReLU6(), nn.Conv2d(4, 8, 3, stride=2),
                         nn.BatchNorm2d(8, momentum=None), SmoothReLU6(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.BatchNorm1d(8), nn.Dropout(0.3), nn.Linear(8, 10))


@pytest.mark.parametrize("momentum", [0.1, None])
def test_masked_batch_statistics_are_batch_norms_on_the_real_samples(momentum):
    x = torch.randn(5, 3, 4, 4, dtype=torch.float64)
    weight = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0])  # three real samples, two padding
    layer = nn.BatchNorm2d(3, momentum=momentum).double()
    layer.running_mean.uniform_(-1, 1)
    layer.running_var.uniform_(0.5, 2)
    layer.num_batches_tracked.fill_(4)
    running = (layer.running_mean.clone(), layer.running_var.clone(), layer.num_batches_tracked.clone())
    gamma, beta = torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    layer.weight.data.copy_(gamma)
    layer.bias.data.copy_(beta)

    out, (mean, var, batches) = weighted_batch_norm(x, weight, running, gamma, beta, momentum, layer.eps)
    reference = layer(x[:3])

    # by hand: per channel over the 3 x 16 real values; biased variance normalises, the unbiased
    # one enters running_var; the factor is the momentum, or 1 / batches without one
    real = x[:3].numpy().transpose(1, 0, 2, 3).reshape(3, -1)
    factor = momentum if momentum is not None else 1 / 5
    normalised = (real - real.mean(1, keepdims=True)) / np.sqrt(real.var(1, keepdims=True) + layer.eps)
    by_hand = normalised * gamma.numpy()[:, None] + beta.numpy()[:, None]
    np.testing.assert_allclose(out[:3].numpy().transpose(1, 0, 2, 3).reshape(3, -1), by_hand, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mean.numpy(), (1 - factor) * running[0].numpy() + factor * real.mean(1), rtol=1e-5)
    np.testing.assert_allclose(var.numpy(), (1 - factor) * running[1].numpy() + factor * real.var(1, ddof=1),
                               rtol=1e-5)
    # and nn.BatchNorm2d on the short batch, to float32 rounding (computed in float32)
    torch.testing.assert_close(out[:3].double(), reference, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mean.double(), layer.running_mean, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(var.double(), layer.running_var, rtol=1e-6, atol=1e-6)
    assert int(batches) == int(layer.num_batches_tracked) == 5
    assert torch.equal(out[3:], torch.zeros_like(out[3:]))  # padding stays finite (zeros) through the network


def test_a_batch_without_real_samples_stays_finite():
    out, (mean, var, _) = weighted_batch_norm(torch.randn(4, 2, 3, 3), torch.zeros(4),
                                              (torch.zeros(2), torch.ones(2), torch.tensor(0)), None, None, 0.1, 1e-5)
    assert torch.isfinite(out).all() and torch.isfinite(mean).all() and torch.isfinite(var).all()


def test_dropout_masks_are_the_clients_own_draws_in_order():
    network = small_network()
    layers = dropout_layers(network, (1, 28, 28))
    assert layers == {"9": (0.3, (8,))}
    a, b, other = DropoutMasks(layers, 7), DropoutMasks(layers, 7), DropoutMasks(layers, 8)
    first = a.take(0, 3, 5)["9"]
    assert first.shape == (5, 8) and not first[3:].any()  # padding drops everything
    assert torch.equal(first, b.take(0, 3, 5)["9"]) and not torch.equal(first, other.take(0, 3, 5)["9"])
    with pytest.raises(RuntimeError, match="out of turn"):
        a.take(0, 3, 5)
    # applied as nn.Dropout scales: kept units times 1 / (1 - p)
    step = drawn_dropout(network)
    step.masks = {"9": first[:3]}
    features = torch.ones(3, 8)
    torch.testing.assert_close(network[9](features), first[:3].float() / 0.7)


def client_context(template: nn.Module, batch_size: int, epochs: int = 1) -> ClientContext:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(200, 1, 28, 28, generator=g), torch.randint(0, 10, (200,), generator=g)
    return ClientContext(x, y, template, FederationConfig(batch_size=batch_size, local_epochs=epochs),
                         TrainerConfig(threads=1), seed=0)


def train_both(ctx: ClientContext, sizes: list[int], seeds: list[int], optimizer: OptimizerConfig):
    """The clients of ``sizes`` (consecutive samples) trained per client and as one cohort."""
    starts = np.cumsum([0, *sizes])
    tasks = [(classifier_task(k, {n: t.clone() for n, t in ctx.template.state_dict().items()}, optimizer),
              np.arange(starts[k], starts[k + 1])) for k in range(len(sizes))]
    plugin = ClassifierClient()
    alone = [plugin.train(ctx, task, idx, seed, [], {}) for (task, idx), seed in zip(tasks, seeds)]
    epochs = ctx.federation.local_epochs
    cohort = CohortTrainer(ctx, make_trainer).train(plugin.cohort, tasks, 0, seeds, [epochs] * len(sizes),
                                                    [{}] * len(sizes))
    return alone, cohort


def test_cohort_trains_batch_norm_and_dropout_as_each_client_alone():
    # B = 10: 29 samples end on a padded batch of 9 and stop after 3 steps while the 35-sample
    # member takes a 4th (masked: its statistics must stay); 21 samples end on a lone sample,
    # which the per-client module skips (counted as a step, changing nothing) and so must the cohort
    ctx = client_context(small_network(), 10)
    alone, cohort = train_both(ctx, [29, 21, 35], [11, 12, 13], OptimizerConfig("sgd", lr=0.05, momentum=0.9))

    for ref, ours in zip(alone, cohort):
        assert list(ours.params) == list(ref.params)  # the state dict, running statistics included
        worst = max((ours.params[k].double() - ref.params[k].double()).abs().max().item() for k in ref.params)
        assert worst < 1e-5, f"client {ref.client_id}: differs by {worst}"  # measured 9e-7
        assert ours.steps == ref.steps and ours.train_loss == pytest.approx(ref.train_loss, rel=1e-6)
    tracked = [int(r.params["1.num_batches_tracked"]) for r in cohort]
    assert tracked == [3, 2, 4]  # batches each member normalised: none after its last, none for the lone sample
    assert [r.steps for r in cohort] == [3, 3, 4]


def test_last_epoch_loss_leaves_out_the_skipped_lone_sample_in_both_engines():
    # 21 samples at B = 10 over two epochs: each epoch trains two batches and skips its lone
    # sample; the reported loss is the mean of the second epoch's two, by hand and in both engines
    ctx = client_context(small_network(), 10, epochs=2)
    recorded = []
    original = MultiClassClassifier.training_step

    def recording(self, batch, batch_idx):
        loss = original(self, batch, batch_idx)
        recorded.append(None if loss is None else (self.current_epoch, loss.item()))
        return loss

    MultiClassClassifier.training_step = recording
    try:
        alone, cohort = train_both(ctx, [21], [12], OptimizerConfig("sgd", lr=0.05, momentum=0.9))
    finally:
        MultiClassClassifier.training_step = original
    assert [r is None for r in recorded] == [False, False, True] * 2
    by_hand = np.mean([loss for r in recorded if r is not None for epoch, loss in [r] if epoch == 1])
    assert alone[0].train_loss == pytest.approx(by_hand, rel=1e-6)
    assert cohort[0].train_loss == pytest.approx(by_hand, rel=1e-5)


def test_dropout_draws_follow_the_client_seed():
    # the masks are the client's: another seed drops other units and trains otherwise
    ctx = client_context(small_network(), 10)
    _, first = train_both(ctx, [29], [11], OptimizerConfig("sgd", lr=0.05))
    _, other = train_both(ctx, [29], [99], OptimizerConfig("sgd", lr=0.05))
    assert not torch.equal(first[0].params["10.weight"], other[0].params["10.weight"])


def test_plugins_whose_loss_does_not_allow_batch_norm_train_such_networks_per_client():
    # the open-set loss runs the network on the batch and its outliers together: per client
    from fl_lightning.algorithms.fedova.detectors import DetectorCohort
    from fl_lightning.algorithms.fedov.open_set_cohort import OpenSetCohort

    network = small_network()
    assert stacks(network, ClassifierClient.cohort) and stacks(network, DetectorCohort())
    assert not stacks(network, OpenSetCohort())
    channels = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Dropout2d(0.5))  # whole-channel dropout: not drawn here
    assert not stacks(channels, ClassifierClient.cohort)


@pytest.fixture
def smooth_mobilenet(monkeypatch):
    monkeypatch.setitem(ARCHITECTURES, "mobilenet", lambda **kwargs: smoothed_relu6(MobileNet(**kwargs)))


def cohort_kinds(monkeypatch) -> list[str]:
    """The task kinds (and architectures) the cohort engine trains, recorded."""
    trained = []
    train = CohortTrainer.train

    def recording(self, plugin, entries, *args, **kwargs):
        trained.extend((task.kind, task.settings.get("architecture")) for task, _ in entries)
        return train(self, plugin, entries, *args, **kwargs)

    monkeypatch.setattr(CohortTrainer, "train", recording)
    return trained


# 300 synthetic samples, Dirichlet: unequal clients (FedAvg: 29, 29 and 32; ATHENA-FL's 4: 69, 71,
# 77 and 53), B = 8 gives padded last batches (of 5, of 7); one local epoch; lr 0.01 (at the tiny
# run's 0.05 the per-client engine alone amplifies a 1e-7 perturbation 300-fold in a round: see
# the module's note).
MOBILENET = ["--partition.scheme", "dirichlet", "--data.synthetic_size", "300", "--federation.batch_size", "8",
             "--federation.local_epochs", "1", "--optimizer.lr", "0.01"]


def test_fedavg_mobilenet_in_the_cohort_equals_per_client(tmp_path, smooth_mobilenet, monkeypatch):
    extra = ["--algorithm", "FedAvg", "--model.architecture", "mobilenet", "--federation.rounds", "1", *MOBILENET]
    reference, ref_history = run_engine(tmp_path, "per_client", *extra)
    trained = cohort_kinds(monkeypatch)

    state, history = run_engine(tmp_path, "cohort", *extra)

    assert trained == [("classifier", None)] * 3  # every client in the cohort, none per client
    assert any(k.endswith("running_var") for k in state) and state.keys() == reference.keys()
    worst = max((state[k].double() - reference[k].double()).abs().max().item() for k in state)
    assert worst < 1e-5, f"FedAvg-MobileNet: parameters and statistics differ by {worst}"
    assert [m["train/steps"] for m in history] == [m["train/steps"] for m in ref_history]
    assert history[0]["train/loss"] == pytest.approx(ref_history[0]["train/loss"], rel=1e-5)


def test_athena_mobilenet_probe_in_the_cohort_equals_per_client(tmp_path, smooth_mobilenet, monkeypatch):
    # round 1 is ATHENA-FL's probe: every client trains MobileNet and uploads its last layer,
    # on which the server clusters; the detectors (athena_cnn) come after
    from fl_lightning.algorithms.athena.strategy import CLIENT_CLUSTER, PROBE_VECTORS

    extra = ["--algorithm", "AthenaFL", "--algorithm.probe_architecture", "mobilenet", "--data.image_size", "32",
             "--model.architecture", "athena_cnn", "--partition.validation_fraction", "0.1",
             "--partition.num_clients", "4", "--federation.rounds", "1", *MOBILENET]
    reference, _ = run_engine(tmp_path, "per_client", *extra)
    trained = cohort_kinds(monkeypatch)

    state, _ = run_engine(tmp_path, "cohort", *extra)

    assert trained == [("classifier", "mobilenet")] * 4
    worst = (state[PROBE_VECTORS] - reference[PROBE_VECTORS]).abs().max().item()
    assert worst < 1e-5, f"ATHENA-FL's probe vectors differ by {worst}"
    assert torch.equal(state[CLIENT_CLUSTER], reference[CLIENT_CLUSTER])


def test_fedova_detectors_on_mobilenet_in_the_cohort_equal_per_client(tmp_path, smooth_mobilenet, monkeypatch):
    # each client's detectors keep their own running statistics and share the client's dropout masks
    extra = ["--algorithm", "FedOVA", "--model.architecture", "mobilenet", "--federation.rounds", "1", *MOBILENET]
    reference, ref_history = run_engine(tmp_path, "per_client", *extra)
    trained = cohort_kinds(monkeypatch)

    state, history = run_engine(tmp_path, "cohort", *extra)

    assert trained and all(kind == "detectors" for kind, _ in trained)  # no client per client
    assert any(k.endswith("running_var") for k in state) and state.keys() == reference.keys()
    worst = max((state[k].double() - reference[k].double()).abs().max().item() for k in state)
    assert worst < 1e-5, f"FedOVA on MobileNet: detectors and statistics differ by {worst}"
    assert [m["train/steps"] for m in history] == [m["train/steps"] for m in ref_history]
    assert history[0]["train/loss"] == pytest.approx(ref_history[0]["train/loss"], rel=1e-5)


def test_athena_detectors_on_mobilenet_in_the_cohort_equal_per_client(tmp_path, smooth_mobilenet, monkeypatch):
    # round 1: the probe; round 2: the clusters' detectors, on MobileNet as the probe
    from fl_lightning.algorithms.athena.strategy import DET

    extra = ["--algorithm", "AthenaFL", "--algorithm.probe_architecture", "mobilenet", "--data.image_size", "32",
             "--model.architecture", "mobilenet", "--partition.validation_fraction", "0.1",
             "--partition.num_clients", "4", "--federation.rounds", "2", *MOBILENET, "--data.synthetic_size", "160"]
    reference, _ = run_engine(tmp_path, "per_client", *extra)
    trained = cohort_kinds(monkeypatch)

    state, _ = run_engine(tmp_path, "cohort", *extra)

    assert ("detectors", None) in trained and all(kind in ("classifier", "detectors") for kind, _ in trained)
    detectors = [k for k in state if k.startswith(DET)]
    assert any(k.endswith("running_var") for k in detectors)
    worst = max((state[k].double() - reference[k].double()).abs().max().item() for k in detectors)
    assert worst < 1e-5, f"ATHENA-FL's MobileNet detectors differ by {worst}"  # measured 1.2e-6
