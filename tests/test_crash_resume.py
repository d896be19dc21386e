"""Crash-safe resume: a run SIGKILLed at any point and resumed from its latest checkpoint
(``--ckpt_path last``) ends with exactly the metrics of an uninterrupted run, and the latest
checkpoint is never a half-written one.

The kill points are tests/killpoints.py's, injected from the test (the run SIGKILLs itself
there, which is what ``kill -9`` from outside does at that moment); the shipped code has no
test hooks. Most kills run ``cli.main`` in a forked child of this process, a subprocess that
skips the interpreter start and imports (~5 s each); one test kills a real
``python -m fl_lightning`` process (a fresh interpreter that arms the kill point, then runs
fl_lightning's ``__main__``)."""

import os
import signal
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

from fl_lightning import cli
from fl_lightning.checkpoint import CheckpointError, load_checkpoint
from tests import killpoints
from tests.conftest import outcome, tiny_args

REPO = Path(__file__).resolve().parents[1]
ROUNDS = 3


def fit_args(run_dir):
    # 3 clients x 6 batches x 2 epochs = 36 batches per round; a checkpoint after every round
    return tiny_args(run_dir, "--federation.rounds", str(ROUNDS), "--run.checkpoint_every", "1")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    summary = cli.main(["fit", *fit_args(tmp_path_factory.mktemp("straight"))])
    assert summary["rounds"] == ROUNDS and summary["history"][-1]["test/accuracy"] > 0.2  # it learns
    return summary


def fit_killed_at(spec, run_dir) -> int:
    """``fit`` in a forked child armed to SIGKILL itself at ``spec``; the child's wait status."""
    pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        code = 0
        try:
            killpoints.arm(spec)
            cli.main(["fit", *fit_args(run_dir)])
        except BaseException:
            traceback.print_exc()
            code = 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return status


def latest_round(run_dir):
    last = run_dir / "checkpoints" / "last.ckpt"
    return load_checkpoint(last)["round"] if last.exists() else None


def resume_and_compare(run_dir, uninterrupted):
    resumed = cli.main(["fit", *fit_args(run_dir), "--ckpt_path", "last"])
    assert outcome(resumed) == outcome(uninterrupted)
    assert resumed["final_accuracy"] == uninterrupted["final_accuracy"]
    assert latest_round(run_dir) == ROUNDS
    assert not list((run_dir / "checkpoints").glob(".*tmp*"))  # a killed writer's leftovers are cleared


# (kill point, where it is, the round of the latest complete checkpoint left by the kill)
KILL_POINTS = [
    ("round_end:1", "between rounds 1 and 2", 1),
    ("batch:5", "in the first client's training, before any checkpoint", None),
    ("batch:50", "in the 2nd client's training in round 2", 1),
    ("aggregate:2", "in round 2's aggregation", 1),
    ("checkpoint_write:2", "while writing round 2's checkpoint", 1),
    ("checkpoint_write:3", "while writing the final checkpoint", 2),
    ("fit_end:1", "after the final checkpoint, before summary.json", ROUNDS),
]


@pytest.mark.parametrize("spec, where, latest", KILL_POINTS, ids=[k[0] for k in KILL_POINTS])
def test_killed_run_resumes_to_the_uninterrupted_metrics(tmp_path, uninterrupted, spec, where, latest):
    run = tmp_path / "run"
    status = fit_killed_at(spec, run)

    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"not killed {where}"
    assert not (run / "summary.json").exists()
    assert latest_round(run) == latest  # the latest checkpoint loads: complete, never half-written
    if spec.startswith("checkpoint_write"):
        (partial,) = (run / "checkpoints").glob(".last.ckpt.tmp-*")  # the interrupted write
        with pytest.raises(CheckpointError, match="truncated or corrupt"):
            load_checkpoint(partial)
    resume_and_compare(run, uninterrupted)


def test_sigkilled_cli_process_resumes_to_the_uninterrupted_metrics(tmp_path, uninterrupted):
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([*killpoints.python_m_fl_lightning("batch:50"), "fit", *fit_args(run)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)

    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert "SIGKILL at batch #50" in proc.stderr
    assert latest_round(run) == 1 and not (run / "summary.json").exists()
    resume_and_compare(run, uninterrupted)


def test_kill_point_specs_are_checked():
    assert killpoints.parse("batch:50") == ("batch", 50)
    for spec in ("nowhere:1", "batch:0", "batch"):
        with pytest.raises(ValueError, match="must be POINT:N"):
            killpoints.parse(spec)


def test_the_shipped_code_has_no_kill_points():
    shipped = [p for p in (REPO / "fl_lightning").rglob("*.py")] + list((REPO / "callbacks").rglob("*.py"))
    assert not [str(p) for p in shipped if "killpoint" in p.read_text() or "crashpoint" in p.read_text()]
