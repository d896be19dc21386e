"""FIM-based L-BFGS (the FedOVA journal paper, Algorithms 1-2): the two-loop recursion against
the explicit inverse-BFGS matrix, its speed on an ill-conditioned quadratic, the curvature
check, the clients' gradient and diagonal Fisher against hand loops, the server step, and
runs through the CLI (bytes, resume)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fl_lightning.checkpoint import load_checkpoint
from fl_lightning.cli import main
from fl_lightning.client import ClientContext, train_client
from fl_lightning.config import FederationConfig, OptimizerConfig, TrainerConfig
from fl_lightning.algorithms.fimlbfgs.lbfgs import diagonal_fisher, push_pair, two_loop_direction
from fl_lightning.algorithms.fimlbfgs import CurvatureProbe
from fl_lightning.algorithms.fimlbfgs.curvature import FISHER, curvature_task
from fl_lightning.messages import with_prefix
from fl_lightning.strategies import FIMLBFGS, ClientResult, FedOVAFIMLBFGS, ServerContext
from tests.conftest import tiny_args


def explicit_inverse_bfgs(s_hist, y_hist):
    """H from H_0 = gamma I (gamma = s.y / y.y of the newest pair) and, oldest pair first,
    H <- (I - rho s y^T) H (I - rho y s^T) + rho s s^T, rho = 1 / y.s."""
    d = s_hist.shape[1]
    identity = torch.eye(d, dtype=torch.float64)
    H = identity * (s_hist[-1] @ y_hist[-1]) / (y_hist[-1] @ y_hist[-1])
    for s, y in zip(s_hist, y_hist):
        rho = 1.0 / (y @ s)
        V = identity - rho * torch.outer(s, y)
        H = V @ H @ V.T + rho * torch.outer(s, s)
    return H


def random_spd(d, generator, condition=None):
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=generator, dtype=torch.float64))
    eig = (torch.logspace(-np.log10(condition), 0, d, dtype=torch.float64) if condition
           else 0.5 + torch.rand(d, generator=generator, dtype=torch.float64))
    return q @ torch.diag(eig) @ q.T


def test_two_loop_direction_is_minus_explicit_inverse_bfgs_times_gradient():
    g = torch.Generator().manual_seed(0)
    d, k = 7, 4
    A = random_spd(d, g)
    s_hist = torch.randn(k, d, generator=g, dtype=torch.float64)
    y_hist = s_hist @ A  # y = A s: positive curvature
    grad = torch.randn(d, generator=g, dtype=torch.float64)
    expected = -explicit_inverse_bfgs(s_hist, y_hist) @ grad
    torch.testing.assert_close(two_loop_direction(grad, s_hist, y_hist), expected, rtol=1e-10, atol=1e-12)
    # the same from a list of pairs, and -g without pairs (H_0 = I)
    torch.testing.assert_close(two_loop_direction(grad, list(s_hist), list(y_hist)), expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(two_loop_direction(grad, s_hist[:0], y_hist[:0]), -grad)


def _iterations_to_converge(A, b, step_fn, limit=100_000):
    x = torch.zeros_like(b)
    for it in range(limit):
        gradient = A @ x - b
        if torch.linalg.vector_norm(gradient) < 1e-6:
            return it
        x = x + step_fn(gradient)
    raise AssertionError("did not converge")


def test_lbfgs_converges_far_faster_than_gradient_descent_on_ill_conditioned_quadratic():
    g = torch.Generator().manual_seed(1)
    d, m = 20, 10
    A = random_spd(d, g, condition=100)  # eigenvalues 0.01 .. 1, so L = 1
    b = torch.randn(d, generator=g, dtype=torch.float64)
    gd_iterations = _iterations_to_converge(A, b, lambda gradient: -gradient / 1.0)  # step 1/L

    history = {"s": torch.zeros(m, d, dtype=torch.float64), "y": torch.zeros(m, d, dtype=torch.float64), "count": 0}

    def lbfgs_step(gradient):  # Algorithm 1, lines 6-13, eta = 1, exact curvature y = A s
        count = history["count"]
        s = two_loop_direction(gradient, history["s"][:count], history["y"][:count])
        history["s"], history["y"], history["count"], accepted = push_pair(history["s"], history["y"], count, s, A @ s)
        assert accepted
        return s

    lbfgs_iterations = _iterations_to_converge(A, b, lbfgs_step)
    assert lbfgs_iterations < gd_iterations / 5, (lbfgs_iterations, gd_iterations)


def test_push_pair_keeps_the_last_m_pairs_and_skips_non_positive_curvature():
    m, d = 3, 2
    s_hist, y_hist, count = torch.zeros(m, d), torch.zeros(m, d), 0
    for i in range(1, 5):
        s = torch.tensor([float(i), 0.0])
        s_hist, y_hist, count, accepted = push_pair(s_hist, y_hist, count, s, 2 * s)
        assert accepted
    assert count == 3
    torch.testing.assert_close(s_hist[:, 0], torch.tensor([2.0, 3.0, 4.0]))  # oldest first, pair 1 dropped
    torch.testing.assert_close(y_hist[:, 0], torch.tensor([4.0, 6.0, 8.0]))
    # negative curvature (s.y < 0) and none (s.y = 0): skipped, history untouched
    for y in (torch.tensor([-1.0, 0.0]), torch.tensor([0.0, 1.0])):
        new_s, new_y, new_count, accepted = push_pair(s_hist, y_hist, count, torch.tensor([1.0, 0.0]), y)
        assert not accepted and new_count == count
        assert torch.equal(new_s, s_hist) and torch.equal(new_y, y_hist)
    # the inputs are never modified
    s_before = s_hist.clone()
    push_pair(s_hist, y_hist, count, torch.tensor([5.0, 0.0]), torch.tensor([5.0, 0.0]))
    assert torch.equal(s_hist, s_before)


# ---- clients: gradient and diagonal Fisher -------------------------------------------------

def _small_net(outputs):
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(2 * 4 * 4, outputs))


def _probe(template, params, classes, monkeypatch, n=8, batch_size=3, local_epochs=2):
    """Runs a curvature task through the real client path; counts the probe's batches."""
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(n, 1, 6, 6, generator=g), torch.arange(n) % 3
    calls = []
    original = CurvatureProbe.training_step

    def counting(self, batch, batch_idx):
        calls.append(len(batch[1]))
        return original(self, batch, batch_idx)

    monkeypatch.setattr(CurvatureProbe, "training_step", counting)
    ctx = ClientContext(x, y, template, FederationConfig(local_epochs=local_epochs, batch_size=batch_size),
                        TrainerConfig(accelerator="cpu", precision="32-true"), seed=0)
    task = curvature_task(0, params, classes, fisher=True)
    result = train_client(ctx, task, np.arange(n), round_index=1)
    assert calls == [3, 3, 2]  # one pass over 8 samples in batches of 3, although E = 2
    return x, y, result


def _single_sample_grads(network, loss_fn, x, y):
    """Per-sample gradients by a plain loop over single samples (name -> (N, ...))."""
    grads = []
    for i in range(len(x)):
        network.zero_grad()
        loss_fn(network(x[i:i + 1]), y[i:i + 1]).backward()
        grads.append({k: p.grad.detach().clone() for k, p in network.named_parameters()})
    return {k: torch.stack([gr[k] for gr in grads]) for k in grads[0]}


def test_probe_returns_mean_gradient_and_diagonal_fisher_of_its_local_data(monkeypatch):
    template = _small_net(3)
    params = {k: v.detach().clone() for k, v in template.state_dict().items()}
    x, y, result = _probe(template, params, (), monkeypatch)

    per_sample = _single_sample_grads(template, F.cross_entropy, x, y)
    template.zero_grad()
    F.cross_entropy(template(x), y).backward()  # the whole local set's mean loss
    for k, p in template.named_parameters():
        torch.testing.assert_close(result.params[k], p.grad, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(result.payload["fisher." + k], per_sample[k].square().mean(0), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(diagonal_fisher(per_sample)["3.weight"], result.payload["fisher.3.weight"], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(diagonal_fisher(per_sample["3.bias"]), result.payload["fisher.3.bias"], rtol=1e-5, atol=1e-7)
    assert result.steps == 0 and result.num_samples == 8 and 0 < result.train_loss < 10


def test_one_vs_all_probe_returns_each_detectors_gradient_and_fisher(monkeypatch):
    template = _small_net(1)
    g = torch.Generator().manual_seed(4)
    classes = (0, 2)
    stacked = {k: torch.randn((2, *v.shape), generator=g) * 0.3 for k, v in template.state_dict().items()}
    x, y, result = _probe(template, stacked, classes, monkeypatch)

    def bce(out, target):
        return F.binary_cross_entropy_with_logits(out.reshape(-1), target.float())

    for row, c in enumerate(classes):
        template.load_state_dict({k: v[row] for k, v in stacked.items()})
        per_sample = _single_sample_grads(template, bce, x, (y == c))
        for k in per_sample:
            torch.testing.assert_close(result.params[k][row], per_sample[k].mean(0), rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(result.payload["fisher." + k][row], per_sample[k].square().mean(0), rtol=1e-5, atol=1e-7)


# ---- the server's L-BFGS step --------------------------------------------------------------

def _strategy(cls, classes=1, **kwargs):
    strategy = cls(**kwargs)
    template = nn.Linear(2, 1)  # d = 3: weight (1, 2), bias (1,)
    strategy.setup(template, classes, OptimizerConfig(), "loop", ServerContext(num_clients=4))
    return strategy


def _flat(t):
    return torch.cat([t["weight"].reshape(-1), t["bias"].reshape(-1)]).double()


def _vec(values):
    return {"weight": torch.tensor([values[:2]]), "bias": torch.tensor(values[2:])}


def _fisher(values):
    """A diagonal Fisher as a probe sends it (its payload)."""
    return with_prefix(_vec(values), FISHER)


def _fisher_of(make, rows):
    return with_prefix(make(rows), FISHER)


def test_fimlbfgs_server_takes_lbfgs_steps_with_damped_fisher_pairs():
    eta, lam = 0.5, 0.1
    strategy = _strategy(FIMLBFGS, step_size=eta, damping=lam, history=2)
    state = strategy.initial_state(torch.Generator().manual_seed(0))
    assert state["lbfgs.s"].shape == (1, 2, 3) and state["lbfgs.count"].tolist() == [0]
    w0 = _flat(state)
    # round 1: sample-weighted gradient, plain mean of the Fisher; no pairs, so p = -g
    results = [ClientResult(0, _vec([1.0, 0.0, 2.0]), 1, payload=_fisher([1.0, 0.0, 0.0])),
               ClientResult(1, _vec([-1.0, 4.0, 2.0]), 3, payload=_fisher([0.0, 2.0, 4.0]))]
    g1, f1 = torch.tensor([-0.5, 3.0, 2.0], dtype=torch.float64), torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64)
    state, facts = strategy.aggregate(state, results)
    s1 = -eta * g1
    torch.testing.assert_close(_flat(state), w0 + s1, rtol=0, atol=1e-6)
    assert state["lbfgs.count"].tolist() == [1] and facts["lbfgs/pairs"] == 1
    torch.testing.assert_close(state["lbfgs.s"][0, 0].double(), s1, rtol=0, atol=1e-6)
    torch.testing.assert_close(state["lbfgs.y"][0, 0].double(), (f1 + lam) * s1, rtol=0, atol=1e-6)
    # round 2: p = -H g with H the inverse BFGS matrix of the stored pair
    g2 = torch.tensor([0.3, -0.2, 1.0], dtype=torch.float64)
    state2, _ = strategy.aggregate(state, [ClientResult(2, _vec(g2.tolist()), 5, payload=_fisher([1.0, 1.0, 1.0]))])
    H = explicit_inverse_bfgs(state["lbfgs.s"][0, :1].double(), state["lbfgs.y"][0, :1].double())
    torch.testing.assert_close(_flat(state2), _flat(state) - eta * H @ g2, rtol=0, atol=1e-6)
    assert state2["lbfgs.count"].tolist() == [2]
    # a capped step: at most max_step_norm long
    capped = _strategy(FIMLBFGS, step_size=eta, damping=lam, max_step_norm=0.1)
    state3, facts3 = capped.aggregate(capped.initial_state(torch.Generator().manual_seed(0)), results)
    assert torch.linalg.vector_norm(_flat(state3) - w0) == pytest.approx(0.1, rel=1e-5) and facts3["lbfgs/clipped"] == 1


def test_fedova_fimlbfgs_updates_each_probed_detector_from_its_own_group_only():
    strategy = _strategy(FedOVAFIMLBFGS, classes=3, step_size=1.0, damping=0.0)
    state = strategy.initial_state(torch.Generator().manual_seed(0))
    assert state["weight"].shape == (3, 1, 2) and state["lbfgs.y"].shape == (3, 10, 3)
    task = strategy.configure_client(state, 0, np.array([2, 0, 2]))
    assert task.kind == "curvature" and task.settings["fisher"] and task.classes == (0, 2)
    assert set(task.params) == {"weight", "bias"} and task.params["weight"].shape == (2, 1, 2)

    def stacked(rows):
        return {"weight": torch.tensor([[r[:2]] for r in rows]), "bias": torch.tensor([r[2:] for r in rows])}

    # client 0 probes detectors 0 and 2 (10 samples), client 1 detector 0 (30 samples)
    results = [ClientResult(0, stacked([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]]), 10, (0, 2),
                            payload=_fisher_of(stacked, [[1.0] * 3] * 2)),
               ClientResult(1, stacked([[3.0, 0.0, 0.0]]), 30, (0,), payload=_fisher_of(stacked, [[3.0] * 3]))]
    new, facts = strategy.aggregate(state, results)
    w = {c: _flat({k: state[k][c] for k in ("weight", "bias")}) for c in range(3)}
    new_w = {c: _flat({k: new[k][c] for k in ("weight", "bias")}) for c in range(3)}
    torch.testing.assert_close(new_w[0], w[0] - torch.tensor([2.5, 0.0, 0.0], dtype=torch.float64), rtol=0, atol=1e-6)
    torch.testing.assert_close(new_w[2], w[2] - torch.tensor([0.0, 2.0, 0.0], dtype=torch.float64), rtol=0, atol=1e-6)
    torch.testing.assert_close(new_w[1], w[1], rtol=0, atol=0)  # nobody probed detector 1
    assert new["lbfgs.count"].tolist() == [1, 0, 1] and facts["group_size/0"] == 2 and facts["group_size/2"] == 1
    # detector 0's pair: y = mean Fisher (2) * s, lambda = 0
    torch.testing.assert_close(new["lbfgs.y"][0, 0], 2.0 * new["lbfgs.s"][0, 0])
    assert torch.equal(new["lbfgs.s"][1], state["lbfgs.s"][1])


# ---- whole runs through the CLI --------------------------------------------------------------

def _history(summary, key):
    return [m[key] for m in summary["history"]]


def test_fimlbfgs_runs_resumes_and_counts_model_down_gradient_and_fisher_up(tmp_path):
    algo = ("--algorithm", "FIMLBFGS", "--algorithm.step_size", "0.05", "--algorithm.damping", "1.0",
            "--algorithm.max_step_norm", "1.0")
    straight = main(["fit", *tiny_args(tmp_path / "a", "--federation.rounds", "3", *algo)])
    main(["fit", *tiny_args(tmp_path / "b", "--federation.rounds", "2", *algo)])
    resumed = main(["fit", *tiny_args(tmp_path / "c", "--federation.rounds", "3", *algo,
                                      "--ckpt_path", str(tmp_path / "b" / "checkpoints" / "last.ckpt"))])
    assert _history(resumed, "test/accuracy") == _history(straight, "test/accuracy")
    assert _history(resumed, "train/loss") == _history(straight, "train/loss")
    ckpt = load_checkpoint(tmp_path / "a" / "checkpoints" / "last.ckpt")
    assert ckpt["state"]["lbfgs.count"].tolist() == [3]
    model_bytes = sum(v.numel() * v.element_size() for k, v in ckpt["state"].items() if not k.startswith("lbfgs"))
    assert _history(straight, "bytes/down") == [3 * model_bytes] * 3  # w_t to 3 clients
    assert _history(straight, "bytes/up") == [2 * 3 * model_bytes] * 3  # gradient + Fisher from each
    assert _history(straight, "train/steps") == [0] * 3
    # the restored history mattered: round 3's direction is not the plain gradient's
    assert _history(straight, "lbfgs/descent_cos")[0] == pytest.approx(1.0)
    assert _history(straight, "lbfgs/descent_cos")[2] < 0.999


def test_fedova_fimlbfgs_runs_through_the_cli(tmp_path):
    summary = main(["fit", *tiny_args(tmp_path / "ova", "--federation.rounds", "2", "--algorithm", "FedOVAFIMLBFGS",
                                      "--algorithm.step_size", "0.05", "--algorithm.damping", "1.0")])
    assert summary["algorithm"] == "fedova_fimlbfgs"
    first = summary["history"][0]
    detector_bytes = first["bytes/down"] // 6  # 3 clients x 2 labels (non-IID-2)
    assert first["bytes/up"] == 2 * 6 * detector_bytes
    assert sum(first[f"group_size/{c}"] for c in range(10) if f"group_size/{c}" in first) == 6
    assert "test/detector_acc/0" in first


def test_a_pair_needs_curvature_strictly_above_eps():
    from fl_lightning.algorithms.fimlbfgs.lbfgs import has_curvature, push_pair

    s, orthogonal, along = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 2.0]), torch.tensor([3.0, 4.0])
    assert not has_curvature(s, orthogonal, eps=0.0)  # s . y = 0 = eps ||s|| ||y||: no curvature
    assert has_curvature(s, along, eps=0.0) and has_curvature(s, along, eps=0.59)  # cosine 0.6
    assert not has_curvature(s, along, eps=0.61)
    S, Y = torch.zeros(2, 2, dtype=torch.float64), torch.zeros(2, 2, dtype=torch.float64)
    assert push_pair(S, Y, 0, s, along, eps=0.61)[3] is False  # the caller's eps is the one applied
    new_s, new_y, count, accepted = push_pair(S, Y, 0, s, along, eps=0.59)
    assert accepted and count == 1 and new_s[0].tolist() == [1.0, 0.0] and new_y[0].tolist() == [3.0, 4.0]


def test_fimlbfgs_logs_training_accuracy_of_the_new_model_each_round(tmp_path):
    from fl_lightning.settings import build_federation

    algo = ("--federation.rounds", "2", "--algorithm", "FIMLBFGS", "--algorithm.step_size", "0.05",
            "--algorithm.damping", "1.0", "--algorithm.train_accuracy_samples", "1000000")
    summary = main(["fit", *tiny_args(tmp_path / "all", *algo)])
    # more samples asked than the clients hold: every pooled training sample is scored, which
    # here is the whole training set, so the loop's own evaluation on it must agree
    _, _, federation = build_federation(["fit", *tiny_args(tmp_path / "check", *algo)], callbacks=[])
    federation.setup()
    assert sum(len(ix) for ix in federation.client_indices) == len(federation.train_labels)
    federation.state = load_checkpoint(tmp_path / "all" / "checkpoints" / "last.ckpt")["state"]
    assert _history(summary, "train/accuracy")[-1] == pytest.approx(federation.evaluate("train")["train/accuracy"])

    sub = main(["fit", *tiny_args(tmp_path / "sub", *algo[:-1], "50")])
    assert all(a * 50 == pytest.approx(round(a * 50)) for a in _history(sub, "train/accuracy"))  # of 50 samples
    off = main(["fit", *tiny_args(tmp_path / "off", *algo[:-1], "0")])
    assert all("train/accuracy" not in m for m in off["history"])


def test_every_table_ii_method_can_log_training_accuracy(tmp_path):
    # federation.train_accuracy_samples: FedAvg (and any algorithm) scores its new global model on
    # the pooled training data each round, as the server-side FIM-L-BFGS does with its own setting
    from fl_lightning.settings import build_federation

    args = ("--federation.rounds", "2", "--algorithm", "FedAvg", "--federation.train_accuracy_samples", "1000000")
    summary = main(["fit", *tiny_args(tmp_path / "fedavg", *args)])
    _, _, federation = build_federation(["fit", *tiny_args(tmp_path / "check", *args)], callbacks=[])
    federation.setup()
    federation.state = load_checkpoint(tmp_path / "fedavg" / "checkpoints" / "last.ckpt")["state"]
    assert len(_history(summary, "train/accuracy")) == 2
    assert _history(summary, "train/accuracy")[-1] == pytest.approx(federation.evaluate("train")["train/accuracy"])
    assert all("train/accuracy" not in m for m in main(["fit", *tiny_args(tmp_path / "off", *args[:4])])["history"])
