from __future__ import annotations

from pathlib import Path

from fl_lightning.callbacks.base import FederatedCallback
from fl_lightning.checkpoint import save_atomic


class Checkpointing(FederatedCallback):
    """Writes ``<run>/checkpoints/last.ckpt`` every ``every`` rounds and at the end, plus
    ``round-XXXX.ckpt`` copies when ``keep_all``. A run stopped by a signal also writes its
    last finished round, so that Ctrl-C in round 17 with ``every`` = 10 loses no round."""

    def __init__(self, every: int = 10, keep_all: bool = False) -> None:
        self.every, self.keep_all = every, keep_all
        self.written = 0  # the round of the latest checkpoint on disk

    def _write(self, federation, round_index: int, state=None) -> None:
        folder = Path(federation.run_dir) / "checkpoints"
        state = state if state is not None else federation.state_dict()
        save_atomic(state, folder / "last.ckpt")
        if self.keep_all:
            save_atomic(state, folder / f"round-{round_index:04d}.ckpt")
        self.written = round_index

    def on_fit_start(self, federation) -> None:
        self.written = federation.round  # a resumed run's checkpoint

    def on_round_end(self, federation, round_index, metrics) -> None:
        if self.every and round_index % self.every == 0 and round_index != federation.federation.rounds:
            self._write(federation, round_index)

    def on_fit_end(self, federation, summary) -> None:
        self._write(federation, federation.round)

    def on_interrupt(self, federation, stop) -> None:
        point = federation.resume_point  # None in a server step: the state may be half updated
        if point is not None and point["round"] > self.written:
            self._write(federation, point["round"], point)
        if self.written:
            stop.kept.append(f"the checkpoint of round {self.written}")
