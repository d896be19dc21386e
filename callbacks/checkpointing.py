from __future__ import annotations

from pathlib import Path

from callbacks.base import FederatedCallback
from fl_lightning.checkpoint import save_atomic


class Checkpointing(FederatedCallback):
    """Writes ``<run>/checkpoints/last.ckpt`` every ``every`` rounds and at the end, plus
    ``round-XXXX.ckpt`` copies when ``keep_all``."""

    def __init__(self, every: int = 10, keep_all: bool = False) -> None:
        self.every, self.keep_all = every, keep_all

    def _write(self, federation, round_index: int) -> None:
        folder = Path(federation.run_dir) / "checkpoints"
        state = federation.state_dict()
        save_atomic(state, folder / "last.ckpt")
        if self.keep_all:
            save_atomic(state, folder / f"round-{round_index:04d}.ckpt")

    def on_round_end(self, federation, round_index, metrics) -> None:
        if self.every and round_index % self.every == 0 and round_index != federation.federation.rounds:
            self._write(federation, round_index)

    def on_fit_end(self, federation, summary) -> None:
        self._write(federation, federation.round)
