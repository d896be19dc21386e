from __future__ import annotations

import os
import sys
import time
from typing import Any

from callbacks.base import FederatedCallback


class ConsoleProgress(FederatedCallback):
    """Progress of a run on the terminal.

    - A terminal: one live status line, redrawn after every client (round r/T, clients
      done in the round, last accuracy, seconds per round, time left); a finished round
      leaves one permanent line.
    - Not a terminal (a log file): one line per round.
    - Under CI (``$CI`` set): quiet, unless ``mode`` says otherwise.

    Args:
        mode: auto | live | lines | quiet.
    """

    def __init__(self, stream=None, mode: str = "auto") -> None:
        if mode not in ("auto", "live", "lines", "quiet"):
            raise ValueError(f"progress mode {mode!r} must be auto, live, lines or quiet")
        self.stream = stream or sys.stderr
        if mode == "auto":
            mode = "quiet" if os.environ.get("CI") else ("live" if _is_tty(self.stream) else "lines")
        self.mode = mode
        self._last_acc = None

    def on_fit_start(self, federation) -> None:
        self._start, self._first_round = time.perf_counter(), federation.round + 1

    def _eta(self, federation, finished_rounds: float) -> str:
        elapsed = time.perf_counter() - self._start
        done = finished_rounds - self._first_round + 1
        if done <= 0:
            return "eta   -  "
        left = elapsed / done * (federation.federation.rounds - finished_rounds)
        return f"eta {int(left // 60)}m{int(left % 60):02d}s"

    def on_client_end(self, federation, round_index, result, done, total) -> None:
        if self.mode != "live":
            return
        acc = f"acc {self._last_acc:.4f}" if self._last_acc is not None else "acc   -   "
        partial = round_index - 1 + done / max(total, 1)
        print(f"\rround {round_index:>4}/{federation.federation.rounds}  clients {done:>3}/{total}  {acc}  "
              f"{self._eta(federation, partial)}   ", end="", file=self.stream, flush=True)

    def on_round_end(self, federation, round_index, metrics) -> None:
        if "test/accuracy" in metrics:
            self._last_acc = metrics["test/accuracy"]
        if self.mode == "quiet":
            return
        acc = f"acc {metrics['test/accuracy']:.4f}" if "test/accuracy" in metrics else "acc   -   "
        line = (f"round {round_index:>4}/{federation.federation.rounds}  {acc}  loss {metrics['train/loss']:.4f}  "
                f"{metrics['time/round_s']:.2f} s/round  {self._eta(federation, round_index)}")
        print(("\r" + line + " " * 12) if self.mode == "live" else line, file=self.stream, flush=True)


def _is_tty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


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
            from lightning.pytorch.loggers import WandbLogger

            self.logger = WandbLogger(
                project=self.project,
                save_dir=federation.run_dir,
                name=os.path.basename(os.path.normpath(federation.run_dir)),
                offline=os.environ.get("WANDB_MODE", "").lower() == "offline",
            )
        else:
            raise ValueError(f"run.logger={self.kind!r} must be csv, wandb or none")
        self.logger.log_hyperparams(federation.config)

    def on_round_end(self, federation, round_index, metrics: dict[str, Any]) -> None:
        if self.logger is not None:
            numeric = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and k != "round"}
            self.logger.log_metrics(numeric, step=round_index)

    def on_fit_end(self, federation, summary) -> None:
        if self.logger is not None:
            for key in ("final_accuracy", "last_accuracy"):
                if summary.get(key) is not None:
                    self.logger.log_metrics({f"summary/{key}": summary[key]}, step=federation.round)
            self.logger.finalize("success")
            if self.kind == "wandb":
                import wandb

                wandb.finish()
