from __future__ import annotations

import os
import sys
import time
from typing import Any

from fl_lightning.callbacks.base import FederatedCallback

MODES = ("auto", "bar", "lines", "off")


def progress_mode(setting) -> str:
    """run.progress as a mode: true is ``auto``, false ``off`` (configs written before the modes)."""
    if setting is True:
        return "auto"
    if setting is False:
        return "off"
    if setting not in MODES:
        raise ValueError(f"run.progress={setting!r} must be one of {', '.join(MODES)} (or true/false)")
    return setting


def _is_tty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _now() -> float:
    """The progress clock (a module function, so a test can drive it)."""
    return time.monotonic()


def duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


class RoundClock:
    """How far a round is, and its ETA, from the clients' epochs.

    The round's work is its clients, each one unit, split evenly over its local epochs; the
    fraction done is the finished clients plus the finished epochs of those still training
    (in parallel workers too). The time left is the time per unit of work measured since the
    first training began, times the work left. Clients whose saved results were reused
    (run.checkpoint_clients) count as done without having taken any time.
    """

    def __init__(self, total: int, now: float) -> None:
        self.total, self.started = max(total, 1), now
        self.done, self.partial = 0, {}  # finished clients; client id -> fraction of its training
        self.base, self.base_time = 0.0, now  # the work already done when training began, and when
        self.training = False

    def fraction(self) -> float:
        return min(1.0, (self.done + sum(self.partial.values())) / self.total)

    def epoch(self, client_id: int, epoch: int, epochs: int, now: float) -> None:
        self.training = True
        self.partial[client_id] = epoch / max(epochs, 1)

    def client_end(self, client_id: int, now: float) -> None:
        self.partial.pop(client_id, None)
        self.done += 1
        if not self.training:  # a reused result, or a client that reports no epochs
            self.base, self.base_time = self.fraction(), now

    def seconds_left(self, now: float):
        """None until some work was measured."""
        measured = self.fraction() - self.base
        if measured <= 0:
            return None
        return (now - self.base_time) / measured * (1 - self.fraction())


class ConsoleProgress(FederatedCallback):
    """Progress of a run on stderr, with the round's and the run's time left.

    - ``bar`` (a terminal): one live line redrawn after every client and local epoch: round
      r/T, a bar of the round's work, clients done, the client and epoch last reported, ETA of
      the round and of the run; a finished round leaves one permanent line.
    - ``lines`` (a log file, CI): one line per round, and inside a round one line per
      finished client or reported epoch, at most one every ``interval`` seconds (the first
      epoch of the run always: it gives the first estimate of the run's length).
    - ``off``: nothing. ``auto``: ``bar`` on a terminal, else ``lines``.

    The run's ETA: the rounds left times the mean length of this process's finished rounds
    (during the first round: its own estimated length, from its first epochs).
    """

    def __init__(self, stream=None, mode: str = "auto", interval: float = 10.0) -> None:
        if mode not in MODES:
            raise ValueError(f"progress mode {mode!r} must be one of {', '.join(MODES)}")
        self.stream = stream or sys.stderr
        if mode == "auto":
            mode = "bar" if _is_tty(self.stream) else "lines"
        self.mode, self.interval = mode, interval
        self._last_acc = None
        self._clock = None
        self._round_lengths: list[float] = []
        self._last_line = None  # when the last rate-limited line was printed
        self._estimated = False

    def on_fit_start(self, federation) -> None:
        self._rounds = federation.federation.rounds

    def on_clients_start(self, federation, round_index, total) -> None:
        self._clock = RoundClock(total, _now())

    def _run_left(self, round_index: int, round_left) -> str:
        if round_left is None:
            return "-"
        if self._round_lengths:
            per_round = sum(self._round_lengths) / len(self._round_lengths)
        else:
            per_round = _now() - self._clock.started + round_left
        return duration(round_left + per_round * (self._rounds - round_index))

    def _status(self, round_index: int, detail: str) -> str:
        clock, now = self._clock, _now()
        left = clock.seconds_left(now)
        eta = f"round eta {duration(left) if left is not None else '-'}, run eta {self._run_left(round_index, left)}"
        if self.mode == "bar":
            filled = int(clock.fraction() * 20)
            return (f"round {round_index}/{self._rounds} [{'#' * filled}{'.' * (20 - filled)}] "
                    f"{clock.fraction():4.0%}  clients {clock.done}/{clock.total}  {detail}  {eta}")
        return f"round {round_index}/{self._rounds}  {detail}  clients {clock.done}/{clock.total} done  {eta}"

    def _show(self, round_index: int, detail: str, always: bool = False) -> None:
        if self.mode == "off" or self._clock is None:
            return
        if self.mode == "bar":
            print("\r" + self._status(round_index, detail) + " " * 4, end="", file=self.stream, flush=True)
            return
        now = _now()
        if always or self._last_line is None or now - self._last_line >= self.interval:
            self._last_line = now
            print(self._status(round_index, detail), file=self.stream, flush=True)

    def on_client_epoch(self, federation, round_index, client_id, epoch, epochs) -> None:
        if self._clock is None:
            return
        self._clock.epoch(client_id, epoch, epochs, _now())
        first = not self._estimated
        self._estimated = True
        self._show(round_index, f"client {client_id} epoch {epoch}/{epochs}", always=first)

    def on_client_end(self, federation, round_index, result, done, total) -> None:
        if self._clock is None:
            return
        self._clock.client_end(result.client_id, _now())
        # in a long round every finished client gets its line; in short ones the rate limit holds
        long_round = _now() - self._clock.started >= self.interval
        self._show(round_index, f"client {result.client_id} done", always=long_round)

    def on_round_end(self, federation, round_index, metrics) -> None:
        if "test/accuracy" in metrics:
            self._last_acc = metrics["test/accuracy"]
        self._round_lengths.append(metrics["time/round_s"])
        self._clock = None
        if self.mode == "off":
            return
        per_round = sum(self._round_lengths) / len(self._round_lengths)
        acc = f"acc {metrics['test/accuracy']:.4f}" if "test/accuracy" in metrics else "acc   -   "
        line = (f"round {round_index:>4}/{self._rounds}  {acc}  loss {metrics['train/loss']:.4f}  "
                f"{metrics['time/round_s']:.2f} s/round  run eta {duration(per_round * (self._rounds - round_index))}")
        print(("\r" + line + " " * 40) if self.mode == "bar" else line, file=self.stream, flush=True)

    def on_interrupt(self, federation, stop) -> None:
        if self.mode == "bar":  # the stop message starts on a line of its own
            print(file=self.stream, flush=True)


class MetricsLogger(FederatedCallback):
    """Per-round metrics through a Lightning logger, one step per round: ``csv``
    (CSVLogger, in the run directory), ``wandb`` (WandbLogger; WANDB_MODE=offline keeps the
    run on disk for a later ``wandb sync``) or ``none``."""

    def __init__(self, kind: str = "csv", project: str = "fl_lightning") -> None:
        self.kind, self.project, self.logger = kind, project, None

    def on_fit_start(self, federation) -> None:
        if self.kind == "none":
            return
        if self.kind == "csv":
            from lightning.pytorch.loggers import CSVLogger

            self.logger = CSVLogger(federation.run_dir, name="", version="metrics")
        elif self.kind == "wandb":
            import wandb
            from lightning.pytorch.loggers import WandbLogger

            self.logger = WandbLogger(
                project=self.project,
                save_dir=federation.run_dir,
                name=os.path.basename(os.path.normpath(federation.run_dir)),
                offline=os.environ.get("WANDB_MODE", "").lower() == "offline",
                # a few lines per run instead of ~35 (a sweep runs many); WANDB_SILENT=true: none
                settings=wandb.Settings(quiet=True),
                # a run of its own even beside others in this process (a stacked sweep's runs)
                reinit="create_new",
            )
        else:
            raise ValueError(f"run.logger={self.kind!r} must be csv, wandb or none")
        self.logger.log_hyperparams(federation.config)

    def on_round_end(self, federation, round_index, metrics: dict[str, Any]) -> None:
        if self.logger is not None:
            numeric = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and k != "round"}
            self.logger.log_metrics(numeric, step=round_index)

    def on_interrupt(self, federation, stop) -> None:
        if self.logger is not None and self.kind == "csv":  # the rows of the finished rounds
            self.logger.save()

    def on_fit_end(self, federation, summary) -> None:
        if self.logger is not None:
            for key in ("final_accuracy", "last_accuracy"):
                if summary.get(key) is not None:
                    self.logger.log_metrics({f"summary/{key}": summary[key]}, step=federation.round)
            self.logger.finalize("success")
            if self.kind == "wandb":
                self.logger.experiment.finish()  # this run's, not whichever run is wandb.run
