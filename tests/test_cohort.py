"""The cohort engine (trainer.engine cohort) against the per-client engine, the reference:
same seeds, same batches, final parameters equal to float tolerance; and its parts alone
(the batch plan against ClientBatches, the stacked optimizers against torch.optim, the
masking of members whose local training has ended)."""

import contextlib

import numpy as np
import pytest
import torch
from torch import nn

from fl_lightning.client import cohort_groups
from fl_lightning.cohort.optim import StackedOptimizer
from fl_lightning.cohort.plan import build_plan
from fl_lightning.config import OptimizerConfig
from fl_lightning.data.batches import ClientBatches
from fl_lightning.models.architectures import ARCHITECTURES, SimpleCNN
from fl_lightning.settings import build_federation
from tests.conftest import smoothed, tiny_args


def smooth_simple_cnn(**kwargs) -> nn.Module:
    """SimpleCNN (the same layers, the same ``features`` / ``head`` split that FedOV's PROSER
    mixes at), smoothed (``tests.conftest.smoothed`` says why). The papers' CNN is checked
    on one step (``test_cohort_steps_the_papers_cnn_like_per_client``)."""
    return smoothed(SimpleCNN(**kwargs))


@pytest.fixture
def smooth_network(monkeypatch):
    """``--model.architecture simple_cnn`` builds ``smooth_simple_cnn`` in this test."""
    monkeypatch.setitem(ARCHITECTURES, "simple_cnn", smooth_simple_cnn)
    return ["--model.architecture", "simple_cnn"]


def run_engine(tmp_path, engine: str, *extra: str, initial: bool = False):
    """2 rounds of the shrunk real CLI with ``engine``: (final global state, history), and
    the initial global state first if ``initial``."""
    fed = build_federation(["fit", *tiny_args(tmp_path / engine, "--federation.rounds", "2", "--trainer.engine", engine,
                                              *extra)], callbacks=[])[2]
    fed.setup()  # fit's own setup then finds it done
    start = {k: v.clone() for k, v in fed.state.items()}
    summary = fed.fit()
    return (start, fed.state, summary["history"]) if initial else (fed.state, summary["history"])


# Measured on the smooth network: every SGD case agrees to 5e-8 (one float32 ulp of the
# parameters), at the tiny run's lr 0.05 as at 0.01.
CASES = {
    "fedova_sgd": ([], 1e-6),
    "fedova_sgd_momentum_weight_decay": (["--optimizer.momentum", "0.9", "--optimizer.weight_decay", "0.001"], 1e-6),
    # Adam divides by sqrt(v): a gradient entry that sums terms cancelling to near zero is
    # rounding noise, and Adam scales it to a step of ~lr whatever its size (2e-5 measured at
    # lr 0.001; its arithmetic alone is pinned exactly below)
    "fedova_adam": (["--optimizer.name", "adam", "--optimizer.lr", "0.001"], 1e-3),
    "fedavg_dirichlet_unequal_sizes": (["--algorithm", "FedAvg", "--partition.scheme", "dirichlet"], 1e-6),
    "fedavg_whole_local_set": (["--algorithm", "FedAvg", "--partition.scheme", "dirichlet",
                                "--federation.batch_size", "0"], 1e-6),
    "fedprox": (["--algorithm", "FedProx", "--algorithm.mu", "0.1", "--partition.scheme", "dirichlet"], 1e-6),
    "scaffold": (["--algorithm", "SCAFFOLD", "--partition.scheme", "dirichlet"], 1e-6),
    # FedOV's open-set loss: data destruction, FGSM (5 signed input-gradient steps) and PROSER's
    # dummy and mixup terms, one objective in both engines, every member reading the draws of
    # its own client's generators (one random number drawn out of turn per member moves the
    # parameters by 3e-3; a draw taken out of turn raises)
    "fedov_one_shot": (["--algorithm", "FedOV", "--federation.rounds", "1", "--partition.scheme", "dirichlet"], 1e-6),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_cohort_equals_per_client_training(tmp_path, smooth_network, case):
    extra, tolerance = CASES[case]
    reference, ref_history = run_engine(tmp_path, "per_client", *smooth_network, *extra)

    state, history = run_engine(tmp_path, "cohort", *smooth_network, *extra)

    assert state.keys() == reference.keys()
    worst = max((state[k] - reference[k]).abs().max().item() for k in state)
    assert worst < tolerance, f"{case}: parameters differ by {worst}"
    for ours, theirs in zip(history, ref_history):
        assert ours["train/steps"] == theirs["train/steps"]  # every member took exactly its own steps
        assert ours["bytes/up"] == theirs["bytes/up"] and ours["bytes/down"] == theirs["bytes/down"]
        assert ours["train/loss"] == pytest.approx(theirs["train/loss"], rel=1e-5)


# bf16-mixed means the same in both engines (docs/architecture.md, "Precision"): forward passes
# under bf16 autocast, FedOV's outliers (destruction, FGSM's input gradient) and the optimizer in
# float32. The engines then differ by bf16 rounding of differently ordered sums: measured on the
# smooth network, 2 rounds, 0.4 % (FedAvg), 1.3 % (FedOVA) and 0.35 % (FedOV) of the update's norm.
BF16_CASES = {"fedova": [], "fedavg_dirichlet": ["--algorithm", "FedAvg", "--partition.scheme", "dirichlet"],
              "fedov_one_shot": ["--algorithm", "FedOV", "--federation.rounds", "1", "--partition.scheme", "dirichlet"]}


@pytest.mark.parametrize("case", sorted(BF16_CASES))
def test_cohort_equals_per_client_training_under_bf16_mixed(tmp_path, smooth_network, case):
    extra = [*smooth_network, "--trainer.precision", "bf16-mixed", *BF16_CASES[case]]
    start, reference, ref_history = run_engine(tmp_path, "per_client", *extra, initial=True)

    state, history = run_engine(tmp_path, "cohort", *extra)

    update = torch.cat([(reference[k] - start[k]).flatten() for k in start])
    error = torch.cat([(state[k] - reference[k]).flatten() for k in start])
    assert error.norm() / update.norm() < 0.03, f"{case}: updates differ by {error.norm() / update.norm():.2e}"
    assert [m["train/steps"] for m in history] == [m["train/steps"] for m in ref_history]


@pytest.mark.parametrize("algorithm", ["FedOVA", "FedAvg"])
def test_cohort_steps_the_papers_cnn_like_per_client(tmp_path, algorithm):
    # FedOVA's CNN (ReLU, max pooling) under vmap: one full-batch step per client, so a kink
    # flipped by rounding moves one sample's term of one gradient and nothing amplifies it
    # (measured: FedOVA 6e-5 of the update, FedAvg 5e-7); a padded sample counted, another
    # client's batch or a wrong loss changes the update by tens of per cent
    extra = ["--algorithm", algorithm, "--federation.rounds", "1", "--federation.local_epochs", "1",
             "--federation.batch_size", "0", "--partition.scheme", "dirichlet"]
    start, reference, _ = run_engine(tmp_path, "per_client", *extra, initial=True)

    state, _ = run_engine(tmp_path, "cohort", *extra)

    update = torch.cat([(reference[k] - start[k]).flatten() for k in start])
    error = torch.cat([(state[k] - reference[k]).flatten() for k in start])
    assert update.norm() > 0
    assert error.norm() / update.norm() < 1e-2, f"{algorithm}: updates differ by {error.norm() / update.norm():.2e}"


@pytest.mark.parametrize("algorithm", [[], ["--algorithm", "FedOV", "--federation.rounds", "1"]], ids=["fedova", "fedov"])
def test_chunked_cohorts_equal_one_cohort(tmp_path, smooth_network, algorithm):
    # FedOV: every chunk's members still read their own clients' draws
    whole, _ = run_engine(tmp_path / "whole", "cohort", *smooth_network, *algorithm)

    chunked, _ = run_engine(tmp_path / "chunked", "cohort", *smooth_network, "--trainer.cohort_size", "3", *algorithm)

    assert max((whole[k] - chunked[k]).abs().max().item() for k in whole) < 1e-6


def test_a_runner_loaded_with_the_next_rounds_members_equals_a_fresh_one(monkeypatch):
    # What a captured CUDA graph relies on (it reads the runner's static tensors): a later round's
    # members, batch plan and draws copied into the same tensors train as a new runner would. On a
    # CPU the same static tensors are stepped eagerly; a draw window shorter than the plan is
    # refilled on the way (FedOV's draws).
    from fl_lightning.algorithms.fedov.objective import OpenSetLoss
    from fl_lightning.algorithms.fedov.open_set import open_set_task
    from fl_lightning.algorithms.fedov.open_set_cohort import OpenSetCohort
    from fl_lightning.cohort.engine import CohortRunner

    monkeypatch.setattr(CohortRunner, "DRAW_WINDOW", 4)
    torch.manual_seed(0)
    template = smooth_simple_cnn(in_channels=1, image_size=28, num_outputs=11)
    x, y = torch.randn(60, 1, 28, 28), torch.randint(0, 10, (60,))
    optimizer = OptimizerConfig("adam", lr=1e-3)
    plugin = OpenSetCohort()
    loss = OpenSetLoss(fgsm_steps=1)
    ctx = type("Ctx", (), {"x": x})()

    def cohort(round_seed):
        tasks = [open_set_task(k, {n: t + 0.01 * round_seed for n, t in template.state_dict().items()}, optimizer, 10,
                               loss) for k in range(2)]
        plan = build_plan([torch.arange(0, 25), torch.arange(25, 60)], [round_seed, round_seed + 1], 10, [2, 2])
        draws = plugin.step_draws(ctx, tasks, [round_seed, round_seed + 1], [0, 1])
        return [plugin.members(t, {})[0] for t in tasks], plan, draws

    def train(runner):
        runner.run(contextlib.nullcontext)
        return runner.member_params()

    reused = CohortRunner(template, plugin, *cohort(1)[:2], x, y, optimizer, False, cohort(1)[2])
    train(reused)
    members, plan, draws = cohort(2)
    reused.load(members, plan, draws)
    fresh = CohortRunner(template, plugin, *cohort(2)[:2], x, y, optimizer, False, cohort(2)[2])

    for a, b in zip(train(reused), train(fresh)):
        assert all(torch.equal(a[n], b[n]) for n in a)


def test_tasks_without_a_cohort_plugin_train_per_client_with_the_same_result(tmp_path, monkeypatch):
    # FIM-L-BFGS's curvature clients without their cohort plug-in: the cohort engine hands them to
    # the per-client path, so the run is bit for bit the per-client one
    from fl_lightning.algorithms.fimlbfgs.curvature import CurvatureClient

    monkeypatch.setattr(CurvatureClient, "cohort", None)
    extra = ["--algorithm", "FIMLBFGS", "--federation.rounds", "1"]
    reference, _ = run_engine(tmp_path, "per_client", *extra)

    state, _ = run_engine(tmp_path, "cohort", *extra)

    assert all(torch.equal(state[k], reference[k]) for k in state)


def test_plan_draws_the_batches_of_client_batches():
    x = torch.arange(100).float().view(100, 1)
    streams = [torch.arange(0, 23), torch.arange(40, 47), torch.arange(60, 90)]
    seeds = [11, 12, 13]

    plan = build_plan(streams, seeds, batch_size=5, epochs=[2, 3, 1])

    for k, (idx, seed, epochs) in enumerate(zip(streams, seeds, [2, 3, 1])):
        batches = ClientBatches(x, x, idx, 5, torch.Generator().manual_seed(seed))
        expected = [b.view(-1).long() for _ in range(epochs) for b, _ in batches]
        assert plan.steps[k] == len(expected)
        for s, batch in enumerate(expected):
            real = plan.weight[s, k] > 0
            assert torch.equal(plan.index[s, k][real], batch)
        assert not plan.active[len(expected):, k].any()  # then the member is masked
    # 23 samples in batches of 5: 5 batches per epoch, the last of 3; 7 samples: 2 (5 + 2)
    assert plan.steps == [10, 6, 6] and plan.last_epoch_batches == [5, 2, 6]
    assert plan.weight[4, 0].sum() == 3 and plan.weight[9, 0].sum() == 3 and plan.weight[1, 1].sum() == 2
    assert plan.last_epoch[:, 0].tolist() == [0] * 5 + [1] * 5


def test_whole_local_set_batches_are_padded_to_the_largest_client():
    plan = build_plan([torch.arange(4), torch.arange(10, 19)], [0, 1], batch_size=0, epochs=[2, 2])

    assert plan.index.shape == (2, 2, 9)
    assert plan.weight[:, 0].sum(1).tolist() == [4, 4] and plan.weight[:, 1].sum(1).tolist() == [9, 9]


@pytest.mark.parametrize("cfg", [OptimizerConfig("sgd", 0.05, 0.9, 0.001), OptimizerConfig("sgd", 0.1),
                                 OptimizerConfig("adam", 0.01, 0.0, 0.01)], ids=["sgd_momentum_wd", "sgd", "adam_wd"])
def test_stacked_optimizer_is_torch_optim_per_member_and_skips_masked_steps(cfg):
    gen = torch.Generator().manual_seed(0)
    start = torch.randn(3, 4, generator=gen)
    grads = [torch.randn(3, 4, generator=gen) for _ in range(6)]
    masks = [torch.tensor([1.0, 1.0, 0.0])] * 4 + [torch.tensor([1.0, 0.0, 0.0])] * 2  # members take 6, 4, 0 steps

    rates = [cfg.lr, 2 * cfg.lr, cfg.lr / 2]  # each member its own (a stacked sweep's runs)

    stacked = start.clone()
    optimizer = StackedOptimizer(cfg, [stacked], rates)
    for g, mask in zip(grads, masks):
        optimizer.step([stacked], [g], mask)

    for member in range(3):
        p = start[member].clone().requires_grad_()
        lr = rates[member]
        ref = (torch.optim.SGD([p], lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay) if cfg.name == "sgd"
               else torch.optim.Adam([p], lr=lr, weight_decay=cfg.weight_decay))
        for g, mask in zip(grads, masks):
            if mask[member]:
                p.grad = g[member].clone()
                ref.step()
        torch.testing.assert_close(stacked[member], p.detach(), rtol=1e-6, atol=1e-6)
    assert torch.equal(stacked[2], start[2])  # never active: untouched


def test_cohorts_group_by_plugin_key_and_chunk_by_members():
    class Task:
        def __init__(self, members, kind="k"):
            self.members, self.kind = members, kind

    class Plugin:
        def member_count(self, task):
            return task.members

    plugin = Plugin()
    jobs = [(Task(2), np.arange(5)), (Task(1, "alone"), np.arange(5)), (Task(2), np.arange(5)), (Task(2), np.arange(0)),
            (Task(3), np.arange(5))]

    cohorts, alone = cohort_groups(jobs, lambda p: None if jobs[p][0].kind == "alone" else (plugin, "key"), cohort_size=4)

    assert alone == [1, 3]  # no plug-in; an empty client
    assert [positions for _, positions in cohorts] == [[0, 2], [4]]  # 2 + 2 members, then 3



@pytest.mark.parametrize("setting", [True, False])
def test_trainer_cudnn_benchmark_sets_cudnns_algorithm_search(tmp_path, setting):
    from fl_lightning.client import ClientContext, make_trainer

    fed = build_federation(["fit", *tiny_args(tmp_path, "--trainer.cudnn_benchmark", str(setting).lower())],
                           callbacks=[])[2]
    assert fed.trainer_cfg.cudnn_benchmark is setting
    saved = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = not setting
    try:
        make_trainer(ClientContext(torch.zeros(1), torch.zeros(1), nn.Linear(1, 1), fed.federation, fed.trainer_cfg, seed=0),
                     epochs=1)
        assert torch.backends.cudnn.benchmark is setting
    finally:
        torch.backends.cudnn.benchmark = saved


def test_the_cohort_fit_applies_the_client_time_budget(tmp_path, monkeypatch):
    # the cohort's Trainer runs the run's callbacks: federation.client_timeout is checked after
    # every window of steps, and a cohort past it drops its clients, as a slow client is dropped
    from fl_lightning import client as client_module
    from fl_lightning.errors import RoundFailedError

    now = [0.0]

    def clock():
        now[0] += 10.0  # every look at the clock: 10 s later
        return now[0]

    monkeypatch.setattr(client_module, "_clock", clock)
    with pytest.raises(RoundFailedError, match="ClientTimeout: local training ran past federation.client_timeout=5"):
        run_engine(tmp_path, "cohort", "--federation.client_timeout", "5")


@pytest.fixture
def compact_early(monkeypatch):
    """The cohort drops its finished members at every step where some have finished (the
    defaults wait for a quarter of them and 512 steps left: the tiny runs never get there)."""
    from fl_lightning.cohort import engine

    monkeypatch.setattr(engine, "COMPACT_EVERY", 1)
    monkeypatch.setattr(engine, "COMPACT_MIN_STEPS", 1)
    monkeypatch.setattr(engine, "COMPACT_SHARE", 1.0)
    runners = []
    original = engine.CohortRunner.without_finished

    def counted(self, keep, *args, **kwargs):
        runners.append(len(keep))
        return original(self, keep, *args, **kwargs)

    monkeypatch.setattr(engine.CohortRunner, "without_finished", counted)
    return runners


# unequal clients (Dirichlet): members finish at different steps; Adam's and momentum's state,
# SCAFFOLD's gradient offsets and FedOV's draws must go on where the cohort dropped the others
COMPACTED = ["fedavg_dirichlet_unequal_sizes", "fedova_adam", "scaffold", "fedov_one_shot"]


@pytest.mark.parametrize("case", COMPACTED)
def test_a_cohort_without_its_finished_members_equals_per_client_training(tmp_path, smooth_network, compact_early,
                                                                          case):
    extra, tolerance = CASES[case]
    extra = [*extra, "--partition.scheme", "dirichlet"]
    reference, ref_history = run_engine(tmp_path, "per_client", *smooth_network, *extra)

    state, history = run_engine(tmp_path, "cohort", *smooth_network, *extra)

    assert compact_early, "no member finished before the others: nothing was dropped"
    worst = max((state[k] - reference[k]).abs().max().item() for k in state)
    assert worst < tolerance, f"{case}: parameters differ by {worst}"
    for ours, theirs in zip(history, ref_history):
        assert ours["train/steps"] == theirs["train/steps"]
        assert ours["train/loss"] == pytest.approx(theirs["train/loss"], rel=1e-5)


def test_compaction_points_drop_the_finished_members_where_few_are_left(monkeypatch):
    from fl_lightning.cohort import engine

    monkeypatch.setattr(engine, "COMPACT_EVERY", 2)
    monkeypatch.setattr(engine, "COMPACT_MIN_STEPS", 2)
    active = torch.zeros(12, 4)
    for member, steps in enumerate([2, 3, 8, 12]):
        active[:steps, member] = 1
    # at 2, 3 of 4 still step (<= 3/4 of them): drop member 0; at 4, 2 of 3; at 8, 1 of 2; at 10
    # nobody finished (and 12 leaves fewer than 2 steps)
    assert engine.compaction_points(active) == [(2, [1, 2, 3]), (4, [2, 3]), (8, [3])]
    monkeypatch.setattr(engine, "COMPACT_SHARE", 0.25)
    assert engine.compaction_points(active) == [(8, [3])]  # 1 of 4 members


def test_a_compiled_cohort_step_trains_as_the_eager_one(tmp_path):
    # trainer.compile: FedAvg on logistic regression compiles in seconds; the second round's
    # runner is a new object of the same shapes and reuses the compiled code
    from torch._dynamo.utils import counters

    extra = ["--algorithm", "FedAvg", "--model.architecture", "logistic"]
    eager, eager_history = run_engine(tmp_path / "eager", "cohort", *extra)
    torch._dynamo.reset()  # no compiled code left by another test
    counters.clear()

    state, history = run_engine(tmp_path / "compiled", "cohort", *extra, "--trainer.compile", "true")

    assert counters["stats"]["unique_graphs"] == 1, "the step was not compiled once as one graph"
    assert max((state[k] - eager[k]).abs().max().item() for k in state) < 1e-6
    assert [m["train/loss"] for m in history] == pytest.approx([m["train/loss"] for m in eager_history], rel=1e-5, abs=1e-7)


def test_past_the_compile_limit_a_new_cohort_shape_trains_eagerly_with_the_same_result(tmp_path, monkeypatch):
    # unequal clients: each round's plan has its own number of steps, a new shape; with a
    # limit of one compiled shape the second round runs its step eagerly
    from torch._dynamo.utils import counters

    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 1)
    extra = ["--algorithm", "FedAvg", "--model.architecture", "logistic", "--partition.scheme", "dirichlet"]
    eager, _ = run_engine(tmp_path / "eager", "cohort", *extra)
    torch._dynamo.reset()  # no compiled code left by another test
    counters.clear()

    state, _ = run_engine(tmp_path / "compiled", "cohort", *extra, "--trainer.compile", "true")

    assert counters["stats"]["unique_graphs"] == 1
    assert max((state[k] - eager[k]).abs().max().item() for k in state) < 1e-6


@pytest.mark.slow  # FedOV's step compiles in about a minute on a CPU
def test_a_compiled_fedov_cohort_equals_per_client_training(tmp_path, smooth_network):
    extra, tolerance = CASES["fedov_one_shot"]
    reference, _ = run_engine(tmp_path, "per_client", *smooth_network, *extra)

    state, _ = run_engine(tmp_path, "cohort", *smooth_network, *extra, "--trainer.compile", "true")

    assert max((state[k] - reference[k]).abs().max().item() for k in state) < tolerance


def test_a_step_that_does_not_compile_names_the_setting(monkeypatch):
    from fl_lightning.cohort import engine

    def cannot(step, **settings):
        def run():
            raise torch._dynamo.exc.TorchDynamoException("data-dependent branch")
        return run

    monkeypatch.setattr(torch, "compile", cannot)
    with pytest.raises(RuntimeError, match=r"trainer.compile: .*data-dependent branch.*without --trainer.compile"):
        engine.compiled(lambda: None)()
