from __future__ import annotations

import os
import sys
import time
from typing import Any

from callbacks.base import FederatedCallback


class ConsoleProgress(FederatedCallback):
    """One line per round: rounds done, test accuracy, seconds per round, time left."""

    def __init__(self, stream=None) -> None:
        self.stream = stream or sys.stderr

    def on_fit_start(self, federation) -> None:
        self._start, self._first_round = time.perf_counter(), federation.round + 1

    def on_round_end(self, federation, round_index, metrics) -> None:
        total = federation.federation.rounds
        done = round_index - self._first_round + 1
        per_round = (time.perf_counter() - self._start) / max(done, 1)
        eta = per_round * (total - round_index)
        acc = f"acc {metrics['test/accuracy']:.4f}" if "test/accuracy" in metrics else "acc   -   "
        print(
            f"round {round_index:>4}/{total}  {acc}  loss {metrics['train/loss']:.4f}  "
            f"{metrics['time/round_s']:.2f} s/round  eta {int(eta // 60)}m{int(eta % 60):02d}s",
            file=self.stream,
            flush=True,
        )


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
