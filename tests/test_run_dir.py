"""A fit into a run.dir that holds a run (fl_lightning/run_dir.py) is refused unless it resumes
(--ckpt_path last) or run.overwrite is set; a resume says what it resumed."""

import os
import subprocess
import sys
from pathlib import Path

from fl_lightning import cli
from fl_lightning.run_dir import held_run
from tests.conftest import tiny_args

REPO = Path(__file__).resolve().parents[1]


def fit(run_dir, *extra):
    return ["fit", *tiny_args(run_dir, "--federation.rounds", "1", *extra)]


def python_m_fl_lightning(args):
    return subprocess.run([sys.executable, "-m", "fl_lightning", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_fit_into_a_finished_run_is_refused_then_resumed_or_overwritten(tmp_path, capfd):
    run = tmp_path / "run"
    cli.main(fit(run))
    summary = (run / "summary.json").read_text()
    (run / "notes.txt").write_text("the user's own file")

    refused = python_m_fl_lightning(fit(run))
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines()[-1] == (
        f"fl_lightning: error: run.dir={str(run)!r} already holds a finished run ({run / 'summary.json'}): resume it "
        f"with --ckpt_path last, replace it with --run.overwrite true, or choose another run.dir")
    assert (run / "summary.json").read_text() == summary  # untouched

    resumed = python_m_fl_lightning([*fit(run), "--ckpt_path", "last"])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resumed from {run / 'checkpoints' / 'last.ckpt'} at round 1 of 1\n" in resumed.stderr

    (run / "checkpoints" / "round-0007.ckpt").write_bytes(b"an old run's")
    capfd.readouterr()
    assert cli.run([*fit(run), "--run.overwrite", "true"]) == 0
    assert not (run / "checkpoints" / "round-0007.ckpt").exists()  # the old results went first
    assert (run / "notes.txt").read_text() == "the user's own file"  # nothing else did
    assert "resumed" not in capfd.readouterr().err


def test_what_counts_as_a_run(tmp_path):
    assert held_run(tmp_path / "missing") is None
    (tmp_path / "checkpoints" / "clients").mkdir(parents=True)
    (tmp_path / "partition.csv").write_text("")  # a run stopped before saving anything: nothing to lose
    assert held_run(tmp_path) is None
    (tmp_path / "checkpoints" / "clients" / "round-0001").mkdir()
    (tmp_path / "checkpoints" / "clients" / "round-0001" / "client-3-ab.pt").write_bytes(b"")
    assert held_run(tmp_path).startswith("a started run's saved client results")
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"")
    assert held_run(tmp_path) == f"a started run's checkpoint ({tmp_path / 'checkpoints' / 'last.ckpt'})"
