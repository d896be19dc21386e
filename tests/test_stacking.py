"""Stacked sweeps (``sweep --stack``, fl_lightning/stacking.py): the runs of a grid trained
together, their clients in shared cohorts, each run equal to the same run alone with the
cohort engine -- with different batch sizes, local epochs and seeds in one cohort, runs at
different rounds (a resumed run beside a fresh one), after an interrupt in the middle of the
grid, and chunked by trainer.cohort_size."""

import json
import time

import pytest

from fl_lightning import stacking, sweep
from fl_lightning.checkpoint import load_checkpoint
from fl_lightning.cohort import engine
from fl_lightning.interrupts import RunInterrupted
from fl_lightning.models.architectures import ARCHITECTURES, SimpleCNN
from tests.conftest import smoothed
from tests.test_sweep import tiny_fixed, write

# two seeds and two local epochs E: --stack (grouped) trains each E's two runs in one cohort
GRID = """\
method: grid
parameters:
  seed: {values: [0, 1]}
  federation.local_epochs: {values: [1, 2]}
"""
# E and B differ: --stack padded trains the four runs in one cohort (B padded, E masked)
E_B_GRID = """\
method: grid
parameters:
  federation.local_epochs: {values: [1, 2]}
  federation.batch_size: {values: [5, 10]}
"""
SEEDS = """\
method: grid
parameters:
  seed: {values: [0, 1, 2]}
"""


@pytest.fixture
def smooth_network(monkeypatch):
    """A smooth network (tests.conftest.smoothed says why exact comparisons need one)."""
    monkeypatch.setitem(ARCHITECTURES, "simple_cnn", lambda **kw: smoothed(SimpleCNN(**kw)))
    return ["--model.architecture", "simple_cnn"]


def fixed(grid, *extra):
    """tiny_args without what ``grid`` sweeps, with the cohort engine and a checkpoint every round."""
    swept = [f"--{line.split(':')[0].strip()}" for line in grid.splitlines() if line.startswith("  ")]
    return [*tiny_fixed(*swept), "--trainer.engine", "cohort", "--run.checkpoint_every", "1", *extra]


def final_states(configs):
    return {c.name: load_checkpoint(c.run_dir / "checkpoints" / "last.ckpt")["state"] for c in configs}


def assert_equal_runs(stacked, alone, tolerance=1e-5):
    assert [c.name for c in stacked] == [c.name for c in alone]
    for ours, theirs in zip(stacked, alone):
        assert ours.summary["rounds"] == theirs.summary["rounds"]
        for a, b in zip(ours.summary["history"], theirs.summary["history"]):
            assert a["train/steps"] == b["train/steps"] and a["bytes/up"] == b["bytes/up"]
            assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-4)
            assert a["test/accuracy"] == pytest.approx(b["test/accuracy"], abs=2e-3)
    ours_states, their_states = final_states(stacked), final_states(alone)
    for name, state in ours_states.items():
        worst = max((state[k] - their_states[name][k]).abs().max().item() for k in state)
        assert worst < tolerance, f"{name}: parameters differ by {worst}"


def run(file, runs, *extra, stack="grouped"):
    return sweep.main([str(file), "--runs-dir", str(runs), *(["--stack", stack] if stack else []), *extra])


def run_counting_cohorts(monkeypatch, file, runs, *extra, stack="grouped"):
    """``run`` stacked, and each cohort trained: (the configurations, [(trainer id, clients)])."""
    trained = []
    real_train = engine.CohortTrainer.train

    def counting(self, plugin, entries, *rest, **kw):
        trained.append((id(self), len(entries)))
        return real_train(self, plugin, entries, *rest, **kw)

    monkeypatch.setattr(engine.CohortTrainer, "train", counting)
    try:
        return run(file, runs, *extra, stack=stack), trained
    finally:
        monkeypatch.setattr(engine.CohortTrainer, "train", real_train)


@pytest.mark.parametrize("mode, grid, cohorts", [("grouped", GRID, [6, 6] * 2), ("padded", E_B_GRID, [12, 12])])
@pytest.mark.parametrize("algorithm", [[], ["--algorithm", "FedAvg", "--partition.scheme", "dirichlet"]],
                         ids=["fedova", "fedavg"])
def test_stacked_runs_equal_each_run_alone(tmp_path, smooth_network, algorithm, mode, grid, cohorts, capsys,
                                           monkeypatch):
    file = write(tmp_path / "grid.yaml", grid)
    args = fixed(grid, "--federation.rounds", "2", *smooth_network, *algorithm)
    stacked, trained = run_counting_cohorts(monkeypatch, file, tmp_path / "stacked", *args, stack=mode)
    alone = run(file, tmp_path / "alone", *args, stack=None)

    assert [c.status for c in stacked] == ["done"] * 4
    # each round, the 4 runs' 3 clients: a cohort per E (two seeds each), or all 12 in one
    assert [n for _, n in trained] == cohorts
    assert_equal_runs(stacked, alone)
    assert "--stack: 4 runs trained together" in capsys.readouterr().out


def test_runs_of_other_learning_rates_share_a_cohort_each_with_its_own(tmp_path, smooth_network, monkeypatch):
    file = write(tmp_path / "lr.yaml", "method: grid\nparameters:\n  optimizer.lr: {values: [0.02, 0.05, 0.1]}\n")
    args = [*tiny_fixed(), "--trainer.engine", "cohort", "--run.checkpoint_every", "1", "--federation.rounds", "2",
            "--algorithm", "FedAvg", "--optimizer.momentum", "0.9", *smooth_network]
    stacked, trained = run_counting_cohorts(monkeypatch, file, tmp_path / "stacked", *args)
    alone = run(file, tmp_path / "alone", *args, stack=None)

    assert [n for _, n in trained] == [9, 9]  # the three runs' 3 clients in one cohort each round
    assert_equal_runs(stacked, alone)


def test_fedov_runs_of_three_seeds_stack_with_their_own_draws(tmp_path, smooth_network):
    # each member reads the outliers and mixup pairs of its own run's client generators
    file = write(tmp_path / "seeds.yaml", SEEDS)
    args = [*tiny_fixed("--federation.local_epochs"), "--federation.local_epochs", "1", "--trainer.engine", "cohort",
            "--run.checkpoint_every", "1", "--algorithm", "FedOV", "--federation.rounds", "1",
            "--partition.scheme", "dirichlet", *smooth_network]

    stacked = run(file, tmp_path / "stacked", *args)
    alone = run(file, tmp_path / "alone", *args, stack=None)

    assert_equal_runs(stacked, alone)


def test_a_stack_resumes_runs_at_different_rounds_beside_fresh_ones(tmp_path, smooth_network):
    file = write(tmp_path / "grid.yaml", GRID)
    args = fixed(GRID, *smooth_network)
    run(file, tmp_path / "stacked", *args, "--federation.rounds", "1")
    fresh = tmp_path / "stacked" / "grid" / "seed=1,federation.local_epochs=1"
    for path in sorted(fresh.rglob("*"), reverse=True):  # one run lost everything; three stopped after round 1
        path.unlink() if path.is_file() else path.rmdir()

    resumed = run(file, tmp_path / "stacked", *args, "--federation.rounds", "3")
    alone = run(file, tmp_path / "alone", *args, "--federation.rounds", "3", stack=None)

    assert [c.status for c in resumed] == ["resumed", "resumed", "done", "resumed"]  # the fresh one beside another at round 2
    assert_equal_runs(resumed, alone)


def test_an_interrupt_in_the_middle_of_a_stacked_grid_loses_no_finished_round(tmp_path, smooth_network, monkeypatch):
    file = write(tmp_path / "grid.yaml", GRID)
    args = fixed(GRID, "--federation.rounds", "3", *smooth_network)
    calls = []
    real_train = engine.CohortTrainer.train

    def interrupted_in_round_2(self, *a, **kw):
        calls.append(1)
        if len(calls) == 3:  # Ctrl-C reaches the main thread while it trains round 2's first cohort (of 2)
            raise RunInterrupted(2)
        return real_train(self, *a, **kw)

    monkeypatch.setattr(engine.CohortTrainer, "train", interrupted_in_round_2)
    with pytest.raises(RunInterrupted) as stopped:
        run(file, tmp_path / "stacked", *args)
    assert stopped.value.where == "with 4 stacked runs unfinished"  # the line the CLI prints names each run
    assert all("in round 2 of 3, training clients, kept the checkpoint of round 1" in k for k in stopped.value.kept)
    runs = sorted((tmp_path / "stacked" / "grid").iterdir())
    assert len(runs) == 4
    assert all(load_checkpoint(r / "checkpoints" / "last.ckpt")["round"] == 1 for r in runs)
    assert not any((r / "summary.json").exists() for r in runs)

    monkeypatch.setattr(engine.CohortTrainer, "train", real_train)
    resumed = run(file, tmp_path / "stacked", *args)
    alone = run(file, tmp_path / "alone", *args, stack=None)

    assert [c.status for c in resumed] == ["resumed"] * 4
    assert_equal_runs(resumed, alone)


def test_a_chunked_stack_equals_one_cohort(tmp_path, smooth_network):
    file = write(tmp_path / "grid.yaml", GRID)
    args = fixed(GRID, "--federation.rounds", "2", *smooth_network)

    whole = run(file, tmp_path / "whole", *args)
    chunked = run(file, tmp_path / "chunked", *args, "--trainer.cohort_size", "7")  # FedOVA: 2 detectors a client

    assert_equal_runs(chunked, whole, tolerance=1e-6)


def test_without_the_cohort_engine_a_stack_says_so_and_runs_one_by_one(tmp_path, capsys):
    file = write(tmp_path / "seeds.yaml", SEEDS)
    args = [*tiny_fixed(), "--federation.rounds", "1"]  # trainer.engine auto: per client on a CPU

    configs = run(file, tmp_path / "runs", *args)

    assert [c.status for c in configs] == ["done"] * 3
    out = capsys.readouterr().out
    assert "--stack: stacking trains the runs' clients as one cohort" in out
    assert "here trainer.engine resolves to per_client, so the 3 runs train one after another" in out


def test_runs_on_other_data_stack_beside_each_other_in_their_own_cohorts(tmp_path, smooth_network, monkeypatch):
    # another data set (here: another synthetic size) cannot share the cohort's data tensor
    file = write(tmp_path / "sizes.yaml", "method: grid\nparameters:\n  data.synthetic_size: {values: [600, 400]}\n")
    args = [*tiny_fixed("--data.synthetic_size"), "--trainer.engine", "cohort", "--run.checkpoint_every", "1",
            "--federation.rounds", "2", *smooth_network]
    stacked, trained = run_counting_cohorts(monkeypatch, file, tmp_path / "stacked", *args)
    alone = run(file, tmp_path / "alone", *args, stack=None)

    assert len({trainer for trainer, _ in trained}) == 2 and [n for _, n in trained] == [3, 3, 3, 3]
    assert_equal_runs(stacked, alone)


def test_each_stacked_run_keeps_its_own_wandb_run(tmp_path, monkeypatch):
    from tests.test_logging import _wandb_records

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    file = write(tmp_path / "seeds.yaml", "method: grid\nparameters:\n  seed: {values: [0, 1]}\n")
    args = [*tiny_fixed("--run.logger"), "--run.logger", "wandb", "--trainer.engine", "cohort", "--federation.rounds", "2"]

    configs = run(file, tmp_path / "runs", *args)

    for config in configs:
        (run_file,) = (config.run_dir / "wandb").glob("offline-run-*/run-*.wandb")
        records = list(_wandb_records(run_file))
        logged = [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
                  for r in records if r.HasField("history")]
        accuracies = [h["test/accuracy"] for h in logged if "test/accuracy" in h]
        assert accuracies == [m["test/accuracy"] for m in config.summary["history"]]
        assert records[-1].HasField("exit")  # finished: its own run, not the other's


def test_stack_progress_reports_the_share_of_local_epochs_and_the_time_left():
    lines, now, inner = [], [0.0], []
    progress = stacking.StackProgress(lines.append, every_s=0, clock=lambda: now[0])  # a line per report
    progress.start(4, "round 1")  # two runs of two clients each, E = 2
    on_epoch = [progress.reporter(0, lambda *a: inner.append(a)), progress.reporter(1, None)]

    now[0] = 40
    on_epoch[0](0, 1, 2)
    on_epoch[1](0, 1, 2)  # client 0 of the other run is another member: 2 of 8 epochs
    assert inner == [(0, 1, 2)]  # the run's own reporter still hears its epochs
    assert lines[-1] == "stack: round 1, 4 clients: 25% of their local epochs done in 40s, about 2m00s left"
    on_epoch[1](0, 1, 2)  # the same share again: no new line
    assert len(lines) == 2
    now[0] = 80
    on_epoch[1](1, 2, 2)
    assert lines[-1] == "stack: round 1, 4 clients: 50% of their local epochs done in 1m20s, about 1m20s left"
    progress.stop()
    on_epoch[0](1, 2, 2)  # between steps nothing is reported
    assert len(lines) == 3


def test_stack_progress_prints_every_interval_while_the_share_moves():
    lines = []
    progress = stacking.StackProgress(lines.append, every_s=0.01)
    progress.start(2, "round 3")
    progress.reporter(0, None)(5, 1, 4)
    for _ in range(500):  # the ticker's first line, within 5 s however busy the machine
        if lines:
            break
        time.sleep(0.01)
    progress.stop()
    assert len(lines) == 1 and lines[0].startswith("stack: round 3, 2 clients: 12% of their local epochs done in ")
    progress.reporter(0, None)(5, 2, 4)
    time.sleep(0.05)
    assert len(lines) == 1  # stopped: no ticker left


def test_a_long_stacked_step_is_not_silent(tmp_path, smooth_network, monkeypatch, capsys):
    monkeypatch.setattr(stacking, "PROGRESS_EVERY_S", 0.0)  # a line after every reported epoch
    file = write(tmp_path / "seeds.yaml", SEEDS)
    args = [*tiny_fixed("--federation.local_epochs"), "--federation.local_epochs", "2", "--trainer.engine", "cohort",
            "--algorithm", "FedOV", "--federation.rounds", "1", *smooth_network]

    assert [c.status for c in run(file, tmp_path / "runs", *args)] == ["done"] * 3
    lines = [line for line in capsys.readouterr().err.splitlines() if "of their local epochs done" in line]
    shares = [int(line.split(": ")[2].split("%")[0]) for line in lines]
    assert lines[0].startswith("stack: round 1, 9 clients: ")  # three runs' three clients in one step
    assert shares == sorted(shares) and shares[-1] == 100
