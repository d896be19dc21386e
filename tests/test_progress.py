"""Progress inside long rounds (callbacks/logging.py's ConsoleProgress): a line per client and
local epoch, rate-limited in logs, a redrawn bar on a terminal, with the round's and the
run's ETA; and one-shot runs keeping their finished clients by default."""

import os
import pty
import re
import select
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from fl_lightning.callbacks import logging as progress
from fl_lightning.callbacks.logging import ConsoleProgress, RoundClock, duration, progress_mode
from tests.conftest import tiny_args

REPO = Path(__file__).resolve().parents[1]


def cli_args(run_dir, mode, *extra):
    args = ["fit", *tiny_args(run_dir, "--federation.rounds", "1", "--trainer.workers", "2", *extra)]
    args[args.index("--run.progress") + 1] = mode
    return [sys.executable, "-m", "fl_lightning", *args]


def test_round_clock_eta_from_the_epochs_done():
    clock = RoundClock(total=4, now=100.0)
    assert clock.seconds_left(100.0) is None  # nothing measured yet

    clock.epoch(client_id=7, epoch=1, epochs=2, now=110.0)  # half of one client of four: 1/8 of the round
    assert clock.fraction() == 0.125
    assert clock.seconds_left(110.0) == 70.0  # 10 s per eighth, seven eighths left

    clock.client_end(7, now=120.0)
    clock.epoch(client_id=8, epoch=1, epochs=2, now=130.0)  # 3/8 done in 30 s
    assert clock.seconds_left(130.0) == 50.0


def test_round_clock_does_not_count_reused_results_as_fast_work():
    clock = RoundClock(total=4, now=0.0)
    clock.client_end(1, now=0.5)  # saved results, reused before any training (run.checkpoint_clients)
    clock.client_end(2, now=0.5)
    clock.epoch(client_id=3, epoch=1, epochs=1, now=20.5)  # a quarter of the round in 20 s
    assert clock.fraction() == 0.75
    assert clock.seconds_left(20.5) == 20.0


def test_durations_read_as_hours_minutes_seconds():
    assert [duration(s) for s in (0, 59.9, 61, 3599, 3600 * 2 + 65)] == ["0s", "59s", "1m01s", "59m59s", "2h01m"]


def test_progress_setting_accepts_old_booleans_and_names_the_key():
    assert [progress_mode(v) for v in (True, False, "bar", "lines")] == ["auto", "off", "bar", "lines"]
    with pytest.raises(ValueError, match="run.progress='live'"):
        progress_mode("live")


def test_lines_are_rate_limited_except_the_first_epoch_and_finished_clients_of_long_rounds(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(progress, "_now", lambda: clock[0])
    lines = []
    out = ConsoleProgress(SimpleNamespace(write=lines.append, flush=lambda: None), mode="lines", interval=10)
    federation = SimpleNamespace(federation=SimpleNamespace(rounds=2))
    out.on_fit_start(federation)
    out.on_clients_start(federation, 1, 2)

    def at(t, event, *args):
        clock[0] = t
        getattr(out, event)(federation, 1, *args)

    at(1, "on_client_epoch", 0, 1, 4)  # the first estimate of the run: always shown
    at(5, "on_client_epoch", 0, 2, 4)  # 4 s later: held back
    at(12, "on_client_epoch", 0, 3, 4)  # 11 s later: shown
    at(13, "on_client_end", SimpleNamespace(client_id=0), 1, 2)  # a long round's finished client: shown
    printed = [line for line in lines if line.strip()]
    assert printed == [
        # 1/8 of round 1 in 1 s: 7 s left; the run: 7 s + one more 8 s round
        "round 1/2  client 0 epoch 1/4  clients 0/2 done  round eta 7s, run eta 15s",
        # 3/8 in 12 s: 20 s left; the round's estimated length 32 s, so 52 s for the run
        "round 1/2  client 0 epoch 3/4  clients 0/2 done  round eta 20s, run eta 52s",
        "round 1/2  client 0 done  clients 1/2 done  round eta 13s, run eta 39s",
    ]


def test_fit_in_a_log_prints_epoch_lines_with_estimates(tmp_path):
    proc = subprocess.run(cli_args(tmp_path / "run", "lines"), cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})

    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "\r" not in proc.stderr
    epochs = re.findall(r"^round 1/1  client \d+ epoch 1/2  clients 0/3 done  round eta [\dhms]+, run eta [\dhms]+$",
                        proc.stderr, re.M)
    assert len(epochs) == 1  # the first epoch's estimate; the rest of this short round is rate-limited
    assert re.search(r"^round    1/1  acc 0\.\d{4}  loss \d\.\d{4}  .* s/round  run eta 0s$", proc.stderr, re.M)


def test_fit_on_a_terminal_redraws_a_bar(tmp_path):
    leader, follower = pty.openpty()
    proc = subprocess.Popen(cli_args(tmp_path / "run", "auto"), cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=follower, env={**os.environ, "OMP_NUM_THREADS": "1"})
    os.close(follower)
    out = b""
    while True:  # read as it comes: a full terminal buffer would block the run
        ready, _, _ = select.select([leader], [], [], 300)
        try:
            chunk = os.read(leader, 65536) if ready else b""
        except OSError:  # the run closed the terminal
            chunk = b""
        if not chunk:
            break
        out += chunk
    os.close(leader)
    assert proc.wait(timeout=60) == 0
    text = out.decode()

    bars = re.findall(r"\rround 1/1 \[([#.]{20})\] +(\d+)%  clients (\d)/3", text)
    assert len(bars) >= 9  # 3 clients x 2 epochs, 3 finished clients: one redraw each
    assert bars[-1] == ("#" * 20, "100", "3")
    assert [int(done) for _, _, done in bars] == sorted(int(done) for _, _, done in bars)
    assert re.search(r"\rround    1/1  acc 0\.\d{4}", text)


@pytest.mark.parametrize("rounds, setting, keeps", [(1, None, True), (3, None, False), (1, "false", False),
                                                    (3, "true", True)])
def test_one_shot_runs_keep_finished_clients_unless_told_otherwise(tmp_path, rounds, setting, keeps):
    from fl_lightning.settings import build_federation

    extra = ["--run.checkpoint_clients", setting] if setting else []
    _, _, federation = build_federation(["fit", *tiny_args(tmp_path, "--federation.rounds", str(rounds), *extra)])
    assert federation.keeps_client_results() is keeps


@pytest.mark.parametrize("window", [None, 1])
def test_the_cohort_reports_each_clients_finished_epochs_as_per_client(monkeypatch, window):
    # three clients of 7, 12 and 20 samples, B = 5, E = 3: per client a report after every epoch;
    # in the cohort one after every window of steps (a whole plan: one report each, at its end)
    import numpy as np
    import torch
    from torch import nn

    from fl_lightning.algorithms.baselines.classifier import ClassifierClient, classifier_task
    from fl_lightning.client import ClientContext, make_trainer, progress_callbacks
    from fl_lightning.cohort.engine import CohortRunner, CohortTrainer
    from fl_lightning.config import FederationConfig, OptimizerConfig, TrainerConfig

    if window is not None:
        monkeypatch.setattr(CohortRunner, "window", property(lambda self: window))
    reports: list[tuple[int, int, int]] = []
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 1, 4, 4, generator=g), torch.randint(0, 3, (40,), generator=g)
    ctx = ClientContext(x, y, nn.Sequential(nn.Flatten(), nn.Linear(16, 3)),
                        FederationConfig(batch_size=5, local_epochs=3), TrainerConfig(threads=1), seed=0,
                        on_epoch=lambda *report: reports.append(report))
    sizes, starts = [7, 12, 20], [0, 7, 19]
    tasks = [(classifier_task(k, dict(ctx.template.state_dict()), OptimizerConfig("sgd", lr=0.1)),
              np.arange(s, s + n)) for k, (s, n) in enumerate(zip(starts, sizes))]
    plugin = ClassifierClient()

    for k, (task, idx) in enumerate(tasks):
        plugin.train(ctx, task, idx, k, progress_callbacks(ctx, k), {})
    alone, reports[:] = list(reports), []
    CohortTrainer(ctx, make_trainer).train(plugin.cohort, tasks, 0, [0, 1, 2], [3, 3, 3], [{}, {}, {}])

    assert alone == [(k, e, 3) for k in range(3) for e in (1, 2, 3)]
    if window is None:
        assert sorted(reports) == [(k, 3, 3) for k in range(3)]
    else:  # step by step: each client's epochs in order, as alone (clients interleaved)
        assert len(reports) == 9
        assert all([r for r in reports if r[0] == k] == [(k, e, 3) for e in (1, 2, 3)] for k in range(3))
