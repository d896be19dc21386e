"""Kill points for the crash-safety tests (tests/test_crash_resume.py).

``FL_LIGHTNING_TEST_KILL_AT=POINT:N`` makes the run SIGKILL itself the N-th time this
process reaches POINT, which is exactly what ``kill -9`` from outside does at that moment
(SIGKILL can be neither caught nor delayed):

- ``batch``: a client draws a training batch (``ClientBatches``), i.e. during local training;
- ``aggregate``: the server update has been computed but not yet stored (inside ``strategy.aggregate``);
- ``checkpoint_write``: a checkpoint's temporary file is partly written and flushed (``save_atomic``);
- ``round_end``: after a round's callbacks (its checkpoint included), before the next round;
- ``fit_end``: after the final checkpoint, before ``summary.json``.

Counts are per process (with ``trainer.workers > 1``, ``batch`` counts in each worker, and
the kill takes the main process with it). Unset, as always outside tests, ``reached`` is one
comparison and nothing is instrumented.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Optional

ENV = "FL_LIGHTNING_TEST_KILL_AT"
POINTS = ("batch", "aggregate", "checkpoint_write", "round_end", "fit_end")

_armed: Optional[tuple[str, int]] = None
_count = 0
_main_pid = os.getpid()


def arm(spec: Optional[str]) -> None:
    """Arm ``"POINT:N"`` (None or "" disarms) in this process, counting from zero; the
    calling process is the one killed with any worker."""
    global _armed, _count, _main_pid
    _armed, _count, _main_pid = None, 0, os.getpid()
    if not spec:
        return
    point, _, n = spec.partition(":")
    if point not in POINTS or not n.isdigit() or int(n) < 1:
        raise ValueError(f"{ENV}={spec!r} must be POINT:N with POINT one of {POINTS} and N >= 1")
    _armed = (point, int(n))


def armed(point: str) -> bool:
    return _armed is not None and _armed[0] == point


def reached(point: str) -> None:
    global _count
    if _armed is None or _armed[0] != point:
        return
    _count += 1
    if _count == _armed[1]:
        sys.stderr.write(f"{ENV}: SIGKILL at {point} #{_count}\n")
        sys.stderr.flush()
        os.kill(_main_pid, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)  # a worker process


class _InterruptedWrite:
    """A file whose first write of at least ``after`` bytes in all is flushed and then hits
    the kill point: the file on disk is left with a part of its content."""

    def __init__(self, file, point: str, after: int) -> None:
        self.file, self.point, self.after, self.written = file, point, after, 0

    def write(self, data) -> int:
        n = self.file.write(data)
        before, self.written = self.written, self.written + n
        if before < self.after <= self.written:
            self.file.flush()
            reached(self.point)
        return n

    def flush(self) -> None:
        self.file.flush()


def interruptible(file, point: str = "checkpoint_write", after: int = 512):
    """``file`` itself, or when ``point`` is armed a wrapper that may kill mid-write."""
    return _InterruptedWrite(file, point, after) if armed(point) else file


def instrument(federation) -> None:
    """Adds the server-side kill points (aggregate, round_end, fit_end) to a Federation
    when one of them is armed; the CLI calls it for every run."""
    if _armed is None:
        return
    if armed("aggregate"):
        aggregate = federation.strategy.aggregate

        def aggregate_then_maybe_die(state, results):
            out = aggregate(state, results)
            reached("aggregate")
            return out

        federation.strategy.aggregate = aggregate_then_maybe_die
    if armed("round_end") or armed("fit_end"):
        from callbacks.base import FederatedCallback

        class KillPoints(FederatedCallback):
            def on_round_end(self, federation, round_index, metrics) -> None:
                reached("round_end")

            def on_fit_end(self, federation, summary) -> None:
                reached("fit_end")

        federation.callbacks.append(KillPoints())  # last: after the checkpoint callback


arm(os.environ.get(ENV))
