"""Kill points for the crash-safety tests (tests/test_crash_resume.py), injected from here:
the shipped code has no test hooks.

``arm("POINT:N")`` makes this process SIGKILL itself the N-th time it reaches POINT, which
is exactly what ``kill -9`` from outside does at that moment (SIGKILL can be neither caught
nor delayed):

- ``batch``: a client draws a training batch (``ClientBatches.__iter__``, wrapped), i.e.
  during local training;
- ``aggregate``: the server update has been computed but not yet stored (the run's
  ``strategy.aggregate``, wrapped when the fit starts);
- ``checkpoint_write``: a checkpoint's temporary file is partly written and flushed (the
  file ``save_atomic`` opens, wrapped);
- ``round_end``: after a round's callbacks (its checkpoint included), before the next round;
- ``fit_end``: after the final checkpoint, before ``summary.json``;
- ``evaluate``: the global model scores a batch of an evaluation (``strategy.predict_logits``).

Instead of SIGKILL, ``arm(spec, "SIGINT")`` (or ``"SIGTERM"``) sends that signal to the
process group, as a terminal's Ctrl-C or ``kill -TERM -PGID`` does, and the run goes on to
handle it (tests/test_interrupts.py); only the first process to reach the point sends it
(each worker process counts its own batches).

The server-side points come from a ``FederatedCallback`` appended after the default ones
(after ``Checkpointing``). ``arm`` patches classes and modules of this process for good:
call it only in a process that ends with the run (a forked child, or a fresh interpreter,
see ``python_m_fl_lightning``). Counts are per process (with ``trainer.workers > 1``,
``batch`` counts in each worker, and the kill takes the arming process with it).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time

POINTS = ("batch", "aggregate", "checkpoint_write", "round_end", "fit_end", "evaluate")
ACTIONS = ("SIGKILL", "SIGINT", "SIGTERM")

_armed: tuple[str, int] | None = None
_count = 0
_main_pid = os.getpid()
_action = "SIGKILL"
_fired = None  # shared with forked workers: the signal goes to the group once


def parse(spec: str) -> tuple[str, int]:
    point, _, n = spec.partition(":")
    if point not in POINTS or not n.isdigit() or int(n) < 1:
        raise ValueError(f"kill point {spec!r} must be POINT:N with POINT one of {POINTS} and N >= 1")
    return point, int(n)


def reached(point: str) -> None:
    global _count
    if _armed is None or _armed[0] != point:
        return
    _count += 1
    if _count == _armed[1] and _action != "SIGKILL":
        with _fired.get_lock():
            if _fired.value:
                return
            _fired.value = 1
        sys.stderr.write(f"kill point: {_action} to the process group at {point} #{_count}, time {time.time():.3f}\n")
        sys.stderr.flush()
        os.killpg(os.getpgid(0), getattr(signal, _action))
    elif _count == _armed[1]:
        sys.stderr.write(f"kill point: SIGKILL at {point} #{_count}\n")
        sys.stderr.flush()
        os.kill(_main_pid, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)  # a worker process


def arm(spec: str, action: str = "SIGKILL") -> None:
    """Arm ``"POINT:N"`` in this process (see the module's docstring)."""
    global _armed, _count, _main_pid, _action, _fired
    if action not in ACTIONS:
        raise ValueError(f"kill point action {action!r} must be one of {ACTIONS}")
    _armed, _count, _main_pid, _action = parse(spec), 0, os.getpid(), action
    _fired = multiprocessing.Value("b", 0)
    point = _armed[0]
    if point == "batch":
        _count_batches()
    elif point == "checkpoint_write":
        _interrupt_checkpoint_writes()
    else:
        _add_server_kill_points()


def _count_batches() -> None:
    from fl_lightning.data.batches import ClientBatches

    draw = ClientBatches.__iter__

    def draw_then_maybe_die(self):
        for batch in draw(self):
            reached("batch")
            yield batch

    ClientBatches.__iter__ = draw_then_maybe_die


class _InterruptedWrite:
    """A file whose first write of at least ``after`` bytes in all is flushed and then hits
    the kill point: the file on disk is left with a part of its content."""

    def __init__(self, file, after: int = 512) -> None:
        self.file, self.after, self.written = file, after, 0

    def write(self, data) -> int:
        n = self.file.write(data)
        before, self.written = self.written, self.written + n
        if before < self.after <= self.written:
            self.file.flush()
            reached("checkpoint_write")
        return n

    def __getattr__(self, name):
        return getattr(self.file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self.file.__exit__(*exc)


def _interrupt_checkpoint_writes() -> None:
    """``save_atomic`` writes through ``open`` looked up in fl_lightning.checkpoint's globals."""
    import builtins

    from fl_lightning import checkpoint

    def open_interruptible(file, mode="r", *args, **kwargs):
        f = builtins.open(file, mode, *args, **kwargs)
        return _InterruptedWrite(f) if "w" in mode else f

    checkpoint.open = open_interruptible


def _add_server_kill_points() -> None:
    from fl_lightning.callbacks.base import FederatedCallback
    from fl_lightning.federation import Federation

    class KillPoints(FederatedCallback):
        def on_fit_start(self, federation) -> None:
            aggregate = federation.strategy.aggregate

            def aggregate_then_maybe_die(state, results):
                out = aggregate(state, results)
                reached("aggregate")
                return out

            federation.strategy.aggregate = aggregate_then_maybe_die
            predict = federation.strategy.predict_logits

            def predict_then_maybe_die(state, x):
                reached("evaluate")
                return predict(state, x)

            federation.strategy.predict_logits = predict_then_maybe_die

        def on_round_end(self, federation, round_index, metrics) -> None:
            reached("round_end")

        def on_fit_end(self, federation, summary) -> None:
            reached("fit_end")

    default_callbacks = Federation.default_callbacks
    Federation.default_callbacks = lambda self: [*default_callbacks(self), KillPoints()]  # last: after Checkpointing


def python_m_fl_lightning(spec: str, action: str = "SIGKILL") -> list[str]:
    """The command line of a fresh ``python -m fl_lightning`` (run from the repository root,
    arguments appended) that arms ``spec`` first: ``fl_lightning/__main__.py`` runs as
    ``__main__``, as with ``-m``."""
    return [sys.executable, "-c",
            f"import runpy; from tests import killpoints; killpoints.arm({spec!r}, {action!r}); "
            f"runpy.run_module('fl_lightning', run_name='__main__')"]
