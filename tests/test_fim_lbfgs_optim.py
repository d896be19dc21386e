"""The client-side FIM-L-BFGS optimizer (issue 18, item 4): its steps against hand-computed
values, its per-sample Fisher against a loop, its pair history through state_dict."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fl_lightning.algorithms.fimlbfgs.optimizer import FIMLBFGSOptimizer, batch_fisher


def _quadratic_steps(opt, w, fisher, steps):
    values = []
    for _ in range(steps):
        def closure():
            opt.zero_grad()
            loss = ((w - 1) ** 2).sum()  # g = 2 (w - 1)
            loss.backward()
            return loss
        opt.step(closure, fisher=[fisher])
        values.append(w.item() if w.numel() == 1 else w.detach().clone())
    return values


def test_first_step_is_gradient_descent_then_the_pair_scales_the_gradient_by_s_over_y():
    w = nn.Parameter(torch.tensor([2.0]))
    opt = FIMLBFGSOptimizer([w], lr=0.25, damping=1.0)

    values = _quadratic_steps(opt, w, torch.tensor([3.0]), 2)

    # step 1, no pairs: w = 2 - 0.25 * g(2) = 2 - 0.25 * 2 = 1.5; s = -0.5, y = (3 + 1) s = -2
    # step 2: one pair in 1-D, H = s / y = 1/4; g(1.5) = 1; w = 1.5 - 0.25 * (1/4) * 1 = 1.4375
    assert values == [1.5, 1.4375]
    state = opt.state[w]
    assert state["count"] == 2
    assert state["s"][:2].flatten().tolist() == [-0.5, -0.0625]
    assert state["y"][:2].flatten().tolist() == [-2.0, -0.25]


def test_max_step_norm_shortens_the_step():
    w = nn.Parameter(torch.tensor([2.0]))
    opt = FIMLBFGSOptimizer([w], lr=1.0, damping=1.0, max_step_norm=0.5)
    assert _quadratic_steps(opt, w, torch.tensor([0.0]), 1) == [1.5]  # -2 cut to -0.5


def test_batch_fisher_is_the_mean_squared_per_sample_gradient():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    x, y = torch.randn(5, 3), torch.tensor([0, 1, 1, 0, 1])

    fisher = batch_fisher(model, F.cross_entropy, x, y)

    for i, (name, p) in enumerate(model.named_parameters()):
        squares = []
        for xi, yi in zip(x, y):
            model.zero_grad()
            F.cross_entropy(model(xi[None]), yi[None]).backward()
            squares.append(p.grad.detach().clone() ** 2)
        torch.testing.assert_close(fisher[i], torch.stack(squares).mean(0), rtol=1e-5, atol=1e-7)


def test_pair_history_travels_in_state_dict():
    def run(resume_after):
        w = nn.Parameter(torch.tensor([2.0, -1.0]))
        opt = FIMLBFGSOptimizer([w], lr=0.3, history=2, damping=0.5)
        fisher = torch.tensor([1.0, 2.0])
        _quadratic_steps(opt, w, fisher, resume_after)
        saved = opt.state_dict()
        w2 = nn.Parameter(w.detach().clone())
        opt2 = FIMLBFGSOptimizer([w2], lr=0.3, history=2, damping=0.5)
        opt2.load_state_dict(saved)
        _quadratic_steps(opt2, w2, fisher, 4 - resume_after)
        return w2.detach()

    straight = run(4)
    assert torch.equal(run(2), straight) and torch.equal(run(1), straight)


def test_logistic_regression_trained_batch_by_batch_fits_its_data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    model = nn.Linear(4, 2)
    opt = FIMLBFGSOptimizer(model.parameters(), lr=0.5, history=5, damping=1e-2, max_step_norm=1.0)
    before = F.cross_entropy(model(x), y).item()
    for _ in range(5):
        for i in range(0, 64, 16):
            xb, yb = x[i:i + 16], y[i:i + 16]

            def closure():
                opt.zero_grad()
                loss = F.cross_entropy(model(xb), yb)
                loss.backward()
                return loss
            opt.step(closure, fisher=batch_fisher(model, F.cross_entropy, xb, yb))
    after = F.cross_entropy(model(x), y).item()
    assert after < 0.5 * before
    assert (model(x).argmax(1) == y).float().mean() >= 0.9


@pytest.mark.parametrize("kwargs", [{"lr": 0.0}, {"history": 0}, {"damping": -1.0}])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        FIMLBFGSOptimizer([nn.Parameter(torch.zeros(1))], **kwargs)


# ---- wired into the clients: optimizer.name fim_lbfgs -------------------------------------

def test_a_fim_lbfgs_client_fit_equals_the_optimizer_by_hand_on_the_same_batches():
    import copy

    from fl_lightning.algorithms.baselines import classifier_task
    from fl_lightning.client import ClientContext, client_seed, train_client
    from fl_lightning.config import FederationConfig, OptimizerConfig, TrainerConfig
    from fl_lightning.data import ClientBatches

    torch.manual_seed(0)
    template = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(20, 4, generator=g), torch.arange(20) % 3
    cfg = OptimizerConfig("fim_lbfgs", lr=0.5, history=3, damping=0.01)
    ctx = ClientContext(x, y, template, FederationConfig(local_epochs=2, batch_size=8),
                        TrainerConfig(accelerator="cpu", precision="32-true"), seed=0)
    start = {k: v.detach().clone() for k, v in template.state_dict().items()}

    result = train_client(ctx, classifier_task(0, start, cfg), np.arange(20), round_index=1)

    net = copy.deepcopy(template)
    net.load_state_dict(start)
    opt = FIMLBFGSOptimizer(net.parameters(), lr=0.5, history=3, damping=0.01)
    batches = ClientBatches(x, y, torch.arange(20), 8, torch.Generator().manual_seed(client_seed(0, 1, 0)))
    steps = 0
    for _ in range(2):
        for xb, yb in batches:
            fisher = batch_fisher(net, F.cross_entropy, xb, yb)

            def closure():
                opt.zero_grad()
                loss = F.cross_entropy(net(xb), yb)
                loss.backward()
                return loss

            opt.step(closure, fisher=fisher)
            steps += 1
    assert result.steps == steps == 6
    for k, v in net.state_dict().items():
        torch.testing.assert_close(result.params[k], v, rtol=1e-5, atol=1e-6)
    assert not torch.equal(result.params["1.weight"], start["1.weight"])


def test_fedova_fim_lbfgs_detectors_equal_one_optimizer_per_detector_by_hand():
    """Algorithm 2's client-side reading: each detector its own pairs and its own Fisher."""
    from fl_lightning.algorithms.fedova.detectors import detector_task
    from fl_lightning.client import ClientContext, client_seed, train_client
    from fl_lightning.config import FederationConfig, OptimizerConfig, TrainerConfig
    from fl_lightning.data import ClientBatches
    from fl_lightning.modules import stack_models

    torch.manual_seed(0)
    template = nn.Sequential(nn.Flatten(), nn.Linear(4, 1))
    nets = [nn.Sequential(nn.Flatten(), nn.Linear(4, 1)) for _ in range(2)]
    stacked = stack_models(nets)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(20, 4, generator=g), torch.arange(20) % 3
    classes = (0, 2)
    cfg = OptimizerConfig("fim_lbfgs", lr=0.5, history=3, damping=0.01)
    ctx = ClientContext(x, y, template, FederationConfig(local_epochs=2, batch_size=8),
                        TrainerConfig(accelerator="cpu", precision="32-true"), seed=0)

    result = train_client(ctx, detector_task(0, stacked, classes, cfg), np.arange(20), round_index=1)

    opts = [FIMLBFGSOptimizer(net.parameters(), lr=0.5, history=3, damping=0.01) for net in nets]
    batches = ClientBatches(x, y, torch.arange(20), 8, torch.Generator().manual_seed(client_seed(0, 1, 0)))

    def bce(out, target):
        return F.binary_cross_entropy_with_logits(out.squeeze(-1), target)

    for _ in range(2):
        for xb, yb in batches:
            for net, opt, c in zip(nets, opts, classes):
                target = (yb == c).float()
                fisher = batch_fisher(net, bce, xb, target)

                def closure():
                    opt.zero_grad()
                    loss = bce(net(xb), target)
                    loss.backward()
                    return loss

                opt.step(closure, fisher=fisher)
    assert result.steps == 6
    for i, net in enumerate(nets):
        for name, v in net.state_dict().items():
            torch.testing.assert_close(result.params[name][i], v, rtol=1e-5, atol=1e-6)
            assert not torch.equal(result.params[name][i], stacked[name][i])


@pytest.mark.parametrize("algorithm", ["FedAvg", "FedOVA"])
def test_fim_lbfgs_clients_run_under_both_engines(tmp_path, monkeypatch, algorithm):
    # the cohort engine stacks them (its equality with per-client training, on the smooth
    # network: tests/test_cohort_fimlbfgs.py)
    from fl_lightning.cli import main
    from tests.conftest import tiny_args
    from tests.test_cohort_fimlbfgs import cohort_kinds

    args = ["--algorithm", algorithm, "--optimizer.name", "fim_lbfgs", "--optimizer.lr", "0.1",
            "--optimizer.max_step_norm", "1.0", "--federation.rounds", "2"]
    per_client = main(["fit", *tiny_args(tmp_path / "a", *args, "--trainer.engine", "per_client")])
    trained = cohort_kinds(monkeypatch)
    cohort = main(["fit", *tiny_args(tmp_path / "b", *args, "--trainer.engine", "cohort")])

    assert trained  # trained in cohorts
    for history in (per_client["history"], cohort["history"]):
        assert all(np.isfinite([m["train/loss"] for m in history])) and history[0]["train/steps"] > 0
    assert [m["train/steps"] for m in cohort["history"]] == [m["train/steps"] for m in per_client["history"]]


@pytest.mark.parametrize("algorithm", ["FedOV", "CloseSetVoting", "AthenaFL"])
def test_fim_lbfgs_clients_are_refused_where_the_client_module_cannot_take_it(tmp_path, algorithm):
    from fl_lightning.cli import main
    from tests.conftest import tiny_args

    with pytest.raises(ValueError, match="optimizer.name=fim_lbfgs"):
        main(["fit", *tiny_args(tmp_path, "--algorithm", algorithm, "--optimizer.name", "fim_lbfgs")])
    assert not (tmp_path / "partition.csv").exists()
