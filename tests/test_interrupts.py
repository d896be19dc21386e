"""Ctrl-C and SIGTERM (fl_lightning/interrupts.py): a real ``python -m fl_lightning fit`` gets
the signal on its whole process group at a chosen point (tests/killpoints.py, injected from
the test: the process signals its own group there, as a terminal's Ctrl-C does), stops within
seconds with status 130 / 143 and one line saying how to resume, leaves no worker process
behind, and the resume ends with exactly the uninterrupted run's results."""

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fl_lightning import cli
from fl_lightning.checkpoint import load_checkpoint
from tests import killpoints
from tests.conftest import outcome, tiny_args

REPO = Path(__file__).resolve().parents[1]


def fit_args(run_dir, rounds=3, *extra):
    # 3 clients x 6 batches x 2 epochs per round on two worker processes; a checkpoint after every round
    return ["fit", *tiny_args(run_dir, "--federation.rounds", str(rounds), "--run.checkpoint_every", "1",
                              "--trainer.workers", "2", *extra)]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    return {rounds: cli.main(fit_args(tmp_path_factory.mktemp(f"straight{rounds}"), rounds)) for rounds in (1, 3)}


def interrupted_at(spec, action, args, timeout=120):
    """The finished process of ``args`` whose process group got ``action`` at ``spec``, and
    the seconds from the signal to the process's exit."""
    proc = subprocess.Popen([*killpoints.python_m_fl_lightning(spec, action), *args], cwd=REPO,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    ended = time.time()
    sent = re.search(r"kill point: (SIG\w+) to the process group", err)
    assert sent and sent.group(1) == action, err[-3000:]
    with pytest.raises(ProcessLookupError):  # no worker process outlives the run
        os.killpg(proc.pid, 0)
    return proc.returncode, err, ended


def stop_line(err):
    (line,) = [line for line in err.splitlines() if line.startswith("fl_lightning: stopped by")]
    return line


def resume(args, expected):
    resumed = cli.main([*args, "--ckpt_path", "last"])
    assert outcome(resumed) == outcome(expected)
    assert resumed["final_accuracy"] == expected["final_accuracy"]
    return resumed


# (point, signal, exit status, rounds, where the run stopped and what it kept)
CASES = [
    ("batch:30", "SIGINT", 130, 3,  # a worker's 30th batch: round 1 gave it at most 24
     "in round 2 of 3, training clients (kept: the checkpoint of round 1)"),
    ("evaluate:2", "SIGTERM", 143, 3,
     "in round 2 of 3, in its server step or evaluation (kept: the checkpoint of round 1)"),
    # the write of round 2's checkpoint is cut short; the stopping run writes it whole
    ("checkpoint_write:2", "SIGINT", 130, 3, "after round 2 of 3 (kept: the checkpoint of round 2)"),
]


@pytest.mark.parametrize("spec, action, status, rounds, where", CASES, ids=[f"{c[1]}-{c[0]}" for c in CASES])
def test_signal_stops_the_run_and_resume_gives_the_uninterrupted_result(tmp_path, uninterrupted, spec, action,
                                                                         status, rounds, where):
    args = fit_args(tmp_path / "run", rounds)
    code, err, _ = interrupted_at(spec, action, args)

    assert code == status, err[-3000:]
    line = stop_line(err)
    assert line == (f"fl_lightning: stopped by {action} {where}; resume with: "
                    + shlex.join(["python", "-m", "fl_lightning", *args, "--ckpt_path", "last"]))
    assert "Traceback" not in err
    kept = int(re.search(r"checkpoint of round (\d)", where).group(1))
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt")["round"] == kept
    assert not list((tmp_path / "run" / "checkpoints").glob(".*tmp*"))
    assert not (tmp_path / "run" / "summary.json").exists()
    resume(args, uninterrupted[rounds])


def test_one_shot_run_keeps_its_finished_clients(tmp_path, uninterrupted, capfd):
    # one round: run.checkpoint_clients is on unless set. SIGTERM at a worker's 13th batch (6
    # batches x 2 epochs per client): its first client's result is saved, the third is training
    args = fit_args(tmp_path / "run", 1)
    code, err, _ = interrupted_at("batch:13", "SIGTERM", args)

    assert code == 143, err[-3000:]
    saved = len(list((tmp_path / "run" / "checkpoints" / "clients").glob("round-0001/client-*.pt")))
    assert saved >= 1
    assert stop_line(err).startswith(f"fl_lightning: stopped by SIGTERM in round 1 of 1, training clients "
                                     f"(kept: {saved} of 3 client results of round 1); resume with: ")
    capfd.readouterr()
    resume(args, uninterrupted[1])
    assert (f"resumed at round 0 of 1 (no checkpoint yet); {saved} saved client results of round 1 found"
            in capfd.readouterr().err)


def test_the_stop_takes_seconds(tmp_path):
    # a long round (20 local epochs): the signal comes early in it
    args = fit_args(tmp_path / "run", 3, "--federation.local_epochs", "20")
    code, err, ended = interrupted_at("batch:5", "SIGINT", args)

    assert code == 130
    assert "stopped by SIGINT in round 1 of 3, training clients (nothing to resume from yet)" in err
    signalled = float(re.search(r"to the process group at batch #5, time (\d+\.\d+)", err).group(1))
    assert ended - signalled < 10  # measured: well under a second to the stop line, on two busy cores


def test_a_second_signal_exits_at_once_and_kills_the_workers():
    # the first SIGINT's clean-up hangs (a sleep); the second one ends the process, and its worker
    script = """
import multiprocessing, os, signal, sys, time
from fl_lightning.interrupts import RunInterrupted, stop_on_signals
worker = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,), daemon=True)
worker.start()
print(worker.pid, flush=True)
with stop_on_signals():
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)
    except RunInterrupted:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(60)
sys.exit(3)
"""
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)

    assert proc.returncode == 130, proc.stderr
    assert time.perf_counter() - started < 30
    assert "SIGINT again: exiting now" in proc.stderr
    assert not running(int(proc.stdout.split()[0]))


def running(pid):
    """Whether process ``pid`` exists and is not a zombie (a container's PID 1 may never reap one)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0] != "Z"
    except FileNotFoundError:
        return False


def test_resume_command_replaces_any_ckpt_path():
    from fl_lightning.interrupts import resume_command

    assert resume_command(["fit", "--config", "a b.yaml", "--ckpt_path", "x.ckpt"]) == \
        "python -m fl_lightning fit --config 'a b.yaml' --ckpt_path last"
    assert resume_command(["fit", "--ckpt_path=x"]) == "python -m fl_lightning fit --ckpt_path last"
    assert resume_command(["sweep", "s.yaml"]) == "python -m fl_lightning sweep s.yaml"
    assert resume_command(["test", "--ckpt_path", "x"]) is None
