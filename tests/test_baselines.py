"""FedNova, SCAFFOLD and FedDANE: the server maths against hand-computed numbers, SCAFFOLD's
corrected client step, FedDANE's local objective, and multi-round runs through the CLI
(resume, refused optimizers, bytes exchanged)."""

import math

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fl_lightning.aggregation import fedavg, fednova, fednova_norm, scaffold_server_control
from fl_lightning.checkpoint import load_checkpoint, save_atomic
from fl_lightning.cli import main
from fl_lightning.client import ClientContext, train_client
from fl_lightning.config import FederationConfig, OptimizerConfig, TrainerConfig
from fl_lightning.federation import sample_clients
from fl_lightning.algorithms.baselines.classifier import CONTROL, ClassifierClient, classifier_task
from fl_lightning.messages import with_prefix
from fl_lightning.strategies import SCAFFOLD, ClientResult, FedAvg, FedNova, ServerContext
from tests.conftest import tiny_args

# Global model w = [1, 2]; client A: w_A = [0, 1], tau = 2 steps, n = 1 sample;
# client B: w_B = [3, 0], tau = 4 steps, n = 3 samples  ->  p = (1/4, 3/4).
W = {"w": torch.tensor([1.0, 2.0])}
W_A, W_B = {"w": torch.tensor([0.0, 1.0])}, {"w": torch.tensor([3.0, 0.0])}


def test_fednova_plain_sgd_matches_hand_computed_update():
    # a = tau = (2, 4); d_A = [1, 1] / 2 = [.5, .5]; d_B = [-2, 2] / 4 = [-.5, .5]
    # tau_eff = 2/4 + 3*4/4 = 3.5; sum p d = [-.25, .5]; w - 3.5 * [-.25, .5] = [1.875, .25]
    new = fednova(W, [W_A, W_B], steps=[2, 4], num_samples=[1, 3], momentum=0.0)
    torch.testing.assert_close(new["w"], torch.tensor([1.875, 0.25]), rtol=0, atol=1e-6)


def test_fednova_momentum_matches_hand_computed_update():
    # rho = 0.5: a(2) = (2 - .5 (1 - .25) / .5) / .5 = 2.5 (the 1st gradient enters with
    # 1 + rho, the 2nd with 1); a(4) = (4 - .5 (1 - .0625) / .5) / .5 = 6.125.
    assert fednova_norm(2, 0.5) == pytest.approx(2.5)
    assert fednova_norm(4, 0.5) == pytest.approx(6.125)
    # tau_eff = 2.5/4 + 3 * 6.125/4 = 167/32; d_A = [1, 1] / 2.5; d_B = [-2, 2] / 6.125
    # sum p d = [1/10 - 12/49, 1/10 + 12/49] = [-71/490, 169/490]
    expected = torch.tensor([1 + 167 / 32 * 71 / 490, 2 - 167 / 32 * 169 / 490])
    new = fednova(W, [W_A, W_B], steps=[2, 4], num_samples=[1, 3], momentum=0.5)
    torch.testing.assert_close(new["w"], expected, rtol=0, atol=1e-6)


def _setup(strategy, template, optimizer, num_clients=1):
    strategy.setup(template, 3, optimizer, "loop", ServerContext(num_clients=num_clients))
    return strategy


def test_fednova_with_equal_steps_and_no_momentum_is_weighted_fedavg():
    template = nn.Linear(4, 3)
    g = torch.Generator().manual_seed(0)
    state = {k: torch.randn(v.shape, generator=g) for k, v in template.state_dict().items()}
    results = [ClientResult(i, {k: torch.randn(v.shape, generator=g) for k, v in state.items()}, n, steps=7)
               for i, n in enumerate([2, 5, 11])]
    sgd = OptimizerConfig("sgd", lr=0.1, momentum=0.0)
    nova, facts = _setup(FedNova(), template, sgd).aggregate(state, results)
    avg, _ = _setup(FedAvg(weighted=True), template, sgd).aggregate(state, results)
    assert facts["fednova/tau_eff"] == pytest.approx(7)
    for k in state:
        torch.testing.assert_close(nova[k], avg[k], rtol=0, atol=1e-6)
    # unequal steps: no longer FedAvg
    results[0].steps = 1
    nova, _ = _setup(FedNova(), template, sgd).aggregate(state, results)
    assert not torch.allclose(nova["weight"], avg["weight"], atol=1e-3)


# ---- SCAFFOLD ------------------------------------------------------------------------------

def _one_step(control=None, client_control=None, lr=0.1):
    """One local SGD step (8 samples, one full batch, one epoch) through train_client."""
    torch.manual_seed(0)
    template = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 4, generator=g), torch.arange(8) % 3
    ctx = ClientContext(x, y, template, FederationConfig(local_epochs=1, batch_size=0),
                        TrainerConfig(accelerator="cpu", precision="32-true"), seed=0)
    params = {k: v.detach().clone() for k, v in template.state_dict().items()}
    task = classifier_task(0, {k: v.clone() for k, v in params.items()}, OptimizerConfig("sgd", lr=lr, momentum=0.0),
                           control=control)
    kept = with_prefix(client_control, CONTROL) if client_control is not None else {}
    result = train_client(ctx, task, np.arange(8), round_index=1, client_state=kept)
    assert result.steps == 1
    # the full-batch gradient at the start
    net = copy.deepcopy(template)
    F.cross_entropy(net(x), y).backward()
    grad = {name: p.grad.detach().clone() for name, p in net.named_parameters()}
    return params, result, grad


def _controls(scale_c, scale_ci):
    g = torch.Generator().manual_seed(2)
    shapes = {"1.weight": (3, 4), "1.bias": (3,)}
    c = {k: scale_c * torch.randn(s, generator=g) for k, s in shapes.items()}
    ci = {k: scale_ci * torch.randn(s, generator=g) for k, s in shapes.items()}
    return c, ci


def test_scaffold_step_with_zero_controls_is_a_plain_sgd_step():
    c, ci = _controls(0.0, 0.0)
    _, plain, _ = _one_step()
    _, corrected, _ = _one_step(c, ci)
    assert plain.payload == {} and plain.client_state == {}
    for k in plain.params:
        assert torch.equal(plain.params[k], corrected.params[k])


def test_scaffold_step_moves_along_the_corrected_gradient():
    lr = 0.1
    c, ci = _controls(1.0, 0.5)
    start, result, grad = _one_step(c, ci, lr)
    for k in grad:
        # y = x - lr (g + c - c_i), up to float rounding of the batch's (shuffled) mean
        torch.testing.assert_close(result.params[k], start[k] - lr * (grad[k] + c[k] - ci[k]), rtol=0, atol=1e-6)
        # option II after K = 1 step: delta c_i = (x - y) / (K lr) - c = g - c_i
        torch.testing.assert_close(result.payload[CONTROL + k], grad[k] - ci[k], rtol=0, atol=1e-5)
        # the client keeps c_i+ = c_i + delta c_i for its next round, and does not send it
        torch.testing.assert_close(result.client_state[CONTROL + k], ci[k] + grad[k] - ci[k], rtol=0, atol=1e-5)


def test_scaffold_server_updates_model_and_control_variates():
    template = nn.Linear(2, 1)  # weight (1, 2), bias (1,)
    strategy = _setup(SCAFFOLD(), template, OptimizerConfig("sgd", lr=0.1), num_clients=4)
    state = {
        "weight": torch.zeros(1, 2), "bias": torch.zeros(1),
        "control_global/weight": torch.tensor([[0.5, -1.0]]), "control_global/bias": torch.tensor([0.5]),
    }
    assert set(strategy.initial_state(torch.Generator().manual_seed(0))) == set(state)
    results = [
        ClientResult(1, {"weight": torch.tensor([[1.0, 2.0]]), "bias": torch.tensor([1.0])}, 10,
                     payload={"control.weight": torch.tensor([[2.0, 4.0]]), "control.bias": torch.tensor([2.0])}),
        ClientResult(3, {"weight": torch.tensor([[3.0, 6.0]]), "bias": torch.tensor([3.0])}, 30,
                     payload={"control.weight": torch.tensor([[-1.0, 0.0]]), "control.bias": torch.tensor([-1.0])}),
    ]
    new, _ = strategy.aggregate(state, results)
    # x <- mean of the y_i weighted by their samples (the default, as NIID-Bench): 10/40 and 30/40
    torch.testing.assert_close(new["weight"], torch.tensor([[0.25 * 1 + 0.75 * 3, 0.25 * 2 + 0.75 * 6]]))
    torch.testing.assert_close(new["bias"], torch.tensor([0.25 * 1 + 0.75 * 3]))
    # c <- c + (delta c_1 + delta c_3) / N, N = 4 clients (not the 2 sampled)
    torch.testing.assert_close(new["control_global/weight"], torch.tensor([[0.5 + 1 / 4, -1.0 + 4 / 4]]))
    torch.testing.assert_close(new["control_global/bias"], torch.tensor([0.75]))
    # the server holds no c_i: each client keeps its own
    assert set(new) == set(state)
    # a client gets the model and c (counted as sent), nothing else
    task = strategy.configure_client(new, 1, np.array([0, 1]))
    assert set(task.params) == {"weight", "bias"} and set(task.payload) == {"control.weight", "control.bias"}
    torch.testing.assert_close(task.payload["control.bias"], torch.tensor([0.75]))


def _history(summary, key):
    return [m[key] for m in summary["history"]]


def test_scaffold_resumed_run_equals_uninterrupted_run(tmp_path):
    # lr 0.01 as NIID-Bench (tiny_args' 0.05 makes SCAFFOLD's first corrected steps blow up)
    scaffold = ("--algorithm", "SCAFFOLD", "--optimizer.name", "sgd", "--optimizer.momentum", "0.0",
                "--optimizer.lr", "0.01")
    straight = main(["fit", *tiny_args(tmp_path / "a", "--federation.rounds", "2", *scaffold)])
    main(["fit", *tiny_args(tmp_path / "b", "--federation.rounds", "1", *scaffold)])
    round_one = tmp_path / "b" / "checkpoints" / "last.ckpt"
    resumed = main(["fit", *tiny_args(tmp_path / "c", "--federation.rounds", "2", *scaffold,
                                      "--ckpt_path", str(round_one))])

    assert _history(resumed, "test/accuracy") == _history(straight, "test/accuracy")
    assert _history(resumed, "train/loss") == _history(straight, "train/loss")
    a, b = load_checkpoint(tmp_path / "a" / "checkpoints" / "last.ckpt"), load_checkpoint(tmp_path / "c" / "checkpoints" / "last.ckpt")
    assert set(a["state"]) == set(b["state"])
    assert all(torch.equal(a["state"][k], b["state"][k]) for k in a["state"])

    # The equality means something: a client of round 1 trains again in round 2 with its
    # own (nonzero) c_i from the checkpoint, and zeroing those c_i changes round 2.
    sampler = torch.Generator().manual_seed(1)  # the federation's sampler (seed + 1)
    first, second = sample_clients(sampler, 10, 0.3), sample_clients(sampler, 10, 0.3)
    assert set(first) & set(second)
    ckpt = load_checkpoint(round_one)
    assert ckpt["round"] == 1
    kept = ckpt["client_states"]  # the clients' own c_i, checkpointed with the federation
    assert set(kept) == set(first) and all(v.abs().sum() > 0 for k in first for v in kept[k].values())
    for k in first:
        for v in kept[k].values():
            v.zero_()
    save_atomic(ckpt, tmp_path / "zeroed.ckpt")
    zeroed = main(["fit", *tiny_args(tmp_path / "z", "--federation.rounds", "2", *scaffold,
                                     "--ckpt_path", str(tmp_path / "zeroed.ckpt"))])
    assert _history(zeroed, "train/loss")[1] != _history(straight, "train/loss")[1]

    # SCAFFOLD's doubled communication: c down and delta c_i up with each model
    model_bytes = sum(v.numel() * v.element_size() for k, v in a["state"].items() if not k.startswith("control"))
    assert _history(straight, "bytes/down") == _history(straight, "bytes/up") == [2 * 3 * model_bytes] * 2


def test_fednova_runs_several_rounds_and_reduces_to_fedavg_when_clients_are_alike(tmp_path):
    sgd = ("--optimizer.name", "sgd", "--optimizer.momentum", "0.9", "--optimizer.lr", "0.01")
    nova = main(["fit", *tiny_args(tmp_path / "nova", "--federation.rounds", "2", "--algorithm", "FedNova", *sgd)])
    assert nova["algorithm"] == "fednova" and nova["rounds"] == 2
    # every client: 60 samples, 2 epochs x 6 batches of 10 = 12 steps, so
    # a = (12 - .9 (1 - .9^12) / .1) / .1 for all, and FedNova's update is FedAvg's
    assert _history(nova, "fednova/tau_eff") == pytest.approx([fednova_norm(12, 0.9)] * 2)
    avg = main(["fit", *tiny_args(tmp_path / "avg", "--federation.rounds", "2", "--algorithm", "FedAvg", *sgd)])
    assert _history(nova, "train/loss") == pytest.approx(_history(avg, "train/loss"), rel=1e-4)


@pytest.mark.parametrize("algorithm", ["FedNova", "SCAFFOLD"])
def test_baselines_refuse_optimizers_other_than_sgd(tmp_path, algorithm):
    with pytest.raises(ValueError, match="optimizer.name"):
        main(["fit", *tiny_args(tmp_path / algorithm, "--federation.rounds", "1", "--algorithm", algorithm,
                                "--optimizer.name", "adam")])


# ---- FedDANE -------------------------------------------------------------------------------

def test_feddane_local_loss_is_cross_entropy_plus_linear_correction_plus_proximal_term():
    # w_t: W = [[0, 1], [0, 0]], b = 0; the client has moved to W = [[1, 1], [0, 0]].
    template = nn.Linear(2, 2)
    w_t = {"weight": torch.tensor([[0.0, 1.0], [0.0, 0.0]]), "bias": torch.zeros(2)}
    c = {"weight": torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "bias": torch.tensor([0.5, -0.5])}
    global_gradient = {"weight": torch.full((2, 2), 10.0), "bias": torch.full((2,), 10.0)}
    local_gradient = {k: global_gradient[k] - c[k] for k in c}  # c = grad f(w_t) - grad F_k(w_t)
    mu = 0.1
    task = classifier_task(0, w_t, OptimizerConfig("sgd", lr=0.1), prox_mu=mu, global_gradient=global_gradient,
                           params_held=True)
    ctx = ClientContext(torch.zeros(1, 2), torch.zeros(1), template, FederationConfig(), TrainerConfig(), seed=0)
    module = ClassifierClient().build(ctx, task, with_prefix(local_gradient, "local_gradient."))
    with torch.no_grad():
        module.network.weight.copy_(torch.tensor([[1.0, 1.0], [0.0, 0.0]]))
    x, y = torch.tensor([[1.0, 0.0]]), torch.tensor([0])
    loss = module.training_step((x, y), 0)
    # logits [1, 0]: CE = log(1 + e^-1); <c, w> = 1 + 2 = 3; mu/2 ||w - w_t||^2 = 0.05. The module
    # adds <c, w - w_t> = <c, w> - <c, w_t> = 3 - 2: the same gradient, an offset of <c, w_t>.
    paper_objective = math.log(1 + math.exp(-1)) + 3.0 + 0.05
    assert loss.item() == pytest.approx(paper_objective - 2.0, abs=1e-6)
    # and its gradient is FedDANE's: grad CE + c + mu (w - w_t)
    loss.backward()
    p = torch.softmax(torch.tensor([1.0, 0.0]), 0) - torch.tensor([1.0, 0.0])
    expected = torch.outer(p, x[0]) + c["weight"] + mu * torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    torch.testing.assert_close(module.network.weight.grad, expected, rtol=0, atol=1e-6)
    # only the global gradient travels: w_t is cached from the gradient phase
    assert task.sent_bytes() == 6 * 4


def test_feddane_runs_two_client_phases_and_counts_both(tmp_path):
    dane = ("--federation.rounds", "2", "--algorithm", "FedDANE", "--algorithm.mu", "0.1", "--optimizer.lr", "0.01")
    summary = main(["fit", *tiny_args(tmp_path / "dane", *dane)])
    # both phases through worker processes: the same federation
    workers = main(["fit", *tiny_args(tmp_path / "workers", *dane, "--trainer.workers", "2")])
    for key in ("test/accuracy", "train/loss"):
        assert _history(workers, key) == _history(summary, key)
    assert summary["algorithm"] == "feddane" and summary["rounds"] == 2
    state = load_checkpoint(tmp_path / "dane" / "checkpoints" / "last.ckpt")["state"]
    model_bytes = sum(v.numel() * v.element_size() for v in state.values())
    # up: grad F_k(w_t) then w_k; down: w_t then grad f(w_t); 3 clients a round
    assert _history(summary, "bytes/up") == [2 * model_bytes * 3] * 2
    assert _history(summary, "bytes/down") == [2 * model_bytes * 3] * 2
    assert all(v > 0 for v in _history(summary, "feddane/global_grad_norm"))
    assert all(math.isfinite(v) for v in _history(summary, "train/loss"))


# ---- bytes exchanged per round, counted by hand ----------------------------------------------

# Logistic regression on 28x28 inputs: 784 x 10 weights + 10 biases as one 10-class model,
# 784 + 1 as one binary detector; float32, 4 bytes each. 10 clients, C = 0.3: 3 a round,
# each holding 2 labels (non-IID-2).
MODEL, DETECTOR = 784 * 10 + 10, 784 + 1


@pytest.mark.parametrize("algorithm,down,up", [
    ("FedOVA", 3 * 2 * DETECTOR * 4, 3 * 2 * DETECTOR * 4),  # each client's 2 detectors, both ways
    ("SCAFFOLD", 3 * (MODEL + MODEL) * 4, 3 * (MODEL + MODEL) * 4),  # model + c down; model + delta c_i up
    ("FIMLBFGS", 3 * MODEL * 4, 3 * (MODEL + MODEL) * 4),  # w_t down; gradient + Fisher up
    ("FedOVAFIMLBFGS", 3 * 2 * DETECTOR * 4, 3 * 2 * (DETECTOR + DETECTOR) * 4),
])
def test_bytes_per_round_are_four_per_number_sent(tmp_path, algorithm, down, up):
    summary = main(["fit", *tiny_args(tmp_path, "--federation.rounds", "1", "--algorithm", algorithm,
                                      "--model.architecture", "logistic", "--optimizer.name", "sgd",
                                      "--federation.local_epochs", "1")])
    (only,) = summary["history"]
    assert only["clients"] == 3 and (only["bytes/down"], only["bytes/up"]) == (down, up)


def test_fedova_weighted_option_weights_each_detector_group_by_sample_counts():
    from fl_lightning.strategies import FedOVA

    def aggregated(weighted):
        strategy = FedOVA(weighted=weighted)
        strategy.setup(nn.Linear(2, 1), 3, OptimizerConfig(), "loop", ServerContext(num_clients=2))
        state = {"weight": torch.zeros(3, 1, 2), "bias": torch.zeros(3, 1)}
        results = [ClientResult(0, {"weight": torch.full((2, 1, 2), 1.0), "bias": torch.full((2, 1), 1.0)}, 100, (0, 1)),
                   ClientResult(1, {"weight": torch.full((1, 1, 2), 4.0), "bias": torch.full((1, 1), 4.0)}, 300, (1,))]
        new, facts = strategy.aggregate(state, results)
        return new, facts

    plain, facts = aggregated(False)
    weighted, _ = aggregated(True)
    assert facts == {"group_size/0": 1, "group_size/1": 2}
    assert plain["bias"].flatten().tolist() == [1.0, 2.5, 0.0]  # detector 1: (1 + 4) / 2, Eq. (5)
    assert weighted["bias"].flatten().tolist() == [1.0, 3.25, 0.0]  # (100 * 1 + 300 * 4) / 400
    assert weighted["weight"][1].flatten().tolist() == [3.25, 3.25]


def test_client_sampling_draws_from_the_run_sampler_and_checks_the_fraction():
    from fl_lightning.strategy import sample_clients

    drawn = sample_clients(torch.Generator().manual_seed(7), 10, 0.3)
    assert drawn == sorted(torch.randperm(10, generator=torch.Generator().manual_seed(7))[:3].tolist())
    assert sample_clients(torch.Generator().manual_seed(7), 10, 0.01) == drawn[:0] + sorted(
        torch.randperm(10, generator=torch.Generator().manual_seed(7))[:1].tolist())  # at least one
    assert sample_clients(torch.Generator().manual_seed(7), 10, 1.0) == list(range(10))
    for bad in (0.0, 1.01):
        with pytest.raises(ValueError, match="client_fraction"):
            sample_clients(torch.Generator(), 10, bad)
    assert FedAvg().state_num_bytes({"w": torch.zeros(3, 4), "b": torch.zeros(5, dtype=torch.float64)}) == 12 * 4 + 5 * 8


def test_scaffold_server_control_accumulates_in_float64():
    # float32 would lose the 1 between 1e8 and -1e8: (1e8 + 1) - 1e8 = 0 in float32
    c = {"w": torch.zeros(1)}
    deltas = [{"w": torch.tensor([1e8])}, {"w": torch.tensor([1.0])}, {"w": torch.tensor([-1e8])}]

    new = scaffold_server_control(c, deltas, num_clients=1)

    assert new["w"].dtype == torch.float32 and new["w"].item() == 1.0


ONE_SHOT_BASELINES = ["fedavg", "fedprox", "fednova", "scaffold", "feddf"]


def test_one_shot_baseline_configs_follow_the_authors_scripts():
    import yaml

    configs = {name: yaml.safe_load(open(f"configs/{name}_oneshot_fmnist.yaml")) for name in ONE_SHOT_BASELINES}

    # the authors' scripts: default --optimizer sgd, --rho=0.9, --reg 1e-5; FedOV's stated lr 0.001
    assert all(c["optimizer"] == {"name": "sgd", "lr": 0.001, "momentum": 0.9, "weight_decay": 1e-5}
               for c in configs.values()), {n: c["optimizer"] for n, c in configs.items()}
    # NIID-Bench's get_dataloader gives every baseline ToTensor() only: raw [0, 1] pixels
    assert all(c["data"].get("standardize") is False for c in configs.values()), {n: c["data"] for n, c in configs.items()}


def test_one_round_scaffold_equals_one_round_fedavg(tmp_path):
    # In round one c = c_i = 0, so every corrected step g + c - c_i is FedAvg's step g.
    sgd = ("--federation.rounds", "1", "--optimizer.name", "sgd", "--optimizer.lr", "0.001",
           "--optimizer.momentum", "0.9", "--optimizer.weight_decay", "1e-5")
    avg = main(["fit", *tiny_args(tmp_path / "avg", "--algorithm", "FedAvg", *sgd)])
    scaffold = main(["fit", *tiny_args(tmp_path / "scaffold", "--algorithm", "SCAFFOLD", *sgd)])

    a = load_checkpoint(tmp_path / "avg" / "checkpoints" / "last.ckpt")["state"]
    s = load_checkpoint(tmp_path / "scaffold" / "checkpoints" / "last.ckpt")["state"]
    model = {k for k in s if not k.startswith("control_global/")}
    assert model == set(a)
    assert all(torch.equal(a[k], s[k]) for k in model)
    assert _history(scaffold, "test/accuracy") == _history(avg, "test/accuracy")
    assert _history(scaffold, "train/loss") == _history(avg, "train/loss")
    # ...and the equality is not vacuous: the round trained the model and set a nonzero c
    assert _history(avg, "train/steps")[0] > 0
    assert any(s[k].abs().sum() > 0 for k in s if k.startswith("control_global/"))
