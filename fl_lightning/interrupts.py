"""Ctrl-C and SIGTERM: a run stops within seconds, keeps what a resume needs and says how
to resume.

``stop_on_signals()`` is held by the CLI around a command. The first SIGINT or SIGTERM
raises ``RunInterrupted`` in the main thread, wherever it is: a client's training in this
process, the wait for worker processes, an evaluation, a checkpoint write (``save_atomic``
then removes its temporary file; the previous checkpoint stays). On its way out the loop
ends the worker processes at once (fl_lightning/worker_pool.py: they hold nothing the parent
has not saved), saves the last finished round's checkpoint (callbacks/checkpointing.py) and
names where it stopped; the client results saved during the round stay
(run.checkpoint_clients). The CLI prints one line with the resume command and exits with
128 + the signal's number (130 for SIGINT, 143 for SIGTERM), as a shell does.

A second signal while that happens kills the worker processes and exits at once. Worker
processes ignore SIGINT (a terminal sends it to the whole process group), so the parent
alone decides what happens.
"""

from __future__ import annotations

import multiprocessing
import os
import shlex
import signal
from contextlib import contextmanager
from typing import Iterator, Optional

SIGNALS = (signal.SIGINT, signal.SIGTERM)

_stopping: Optional[int] = None  # the first signal received inside stop_on_signals


class RunInterrupted(BaseException):
    """The run was stopped by a signal. A BaseException, as KeyboardInterrupt is, so that code
    guarding one client (``except Exception``) lets it through; not a KeyboardInterrupt, which
    Lightning's Trainer answers with ``sys.exit(1)``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        #: where the run stopped ("in round 3 of 10, training clients") and what it kept for a
        #: resume ("the checkpoint of round 2"), filled in by the federated loop on the way out
        self.where = ""
        self.kept: list[str] = []

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


def _on_signal(signum, frame) -> None:
    global _stopping
    if _stopping is not None:  # a second signal: the first one's clean-up takes too long
        kill_child_processes()
        os.write(2, f"\nfl_lightning: {signal.Signals(signum).name} again: exiting now\n".encode())
        os._exit(128 + signum)
    _stopping = signum
    raise RunInterrupted(signum)


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise ``RunInterrupted`` (main thread only); the
    previous handlers come back after it."""
    global _stopping
    _stopping = None
    previous = {signum: signal.signal(signum, _on_signal) for signum in SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _stopping = None


def ignore_in_worker() -> None:
    """In a forked worker process: SIGINT ignored (the parent decides), SIGTERM back to its
    default (the parent ends workers with signals; a Python handler inherited from the parent
    would print a traceback instead)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def kill_child_processes() -> None:
    """SIGKILL every child process started through multiprocessing (the client workers)."""
    children = multiprocessing.active_children()
    for child in children:
        try:
            child.kill()
        except (OSError, ValueError):  # already gone, or closed
            pass
    for child in children:
        child.join(timeout=1)


def stopped_line(stop: RunInterrupted, argv: list[str]) -> str:
    """The one line a stopped command prints: e.g. ``stopped by SIGINT in round 3 of 10,
    training clients (kept: the checkpoint of round 2, 2 of 3 client results of round 3);
    resume with: python -m fl_lightning fit ... --ckpt_path last``."""
    line = f"stopped by {stop.name}" + (f" {stop.where}" if stop.where else "")
    if stop.where:
        line += f" (kept: {', '.join(stop.kept)})" if stop.kept else " (nothing to resume from yet)"
    command = resume_command(argv)
    return line + (f"; resume with: {command}" if command else "")


def interrupt_behind(error: BaseException) -> Optional[BaseException]:
    """The interrupt (``RunInterrupted``, KeyboardInterrupt) that ``error`` was raised while
    handling, if any: torch.save answers an interrupt during its write with a RuntimeError of
    its own ("unexpected pos"), which would hide it."""
    seen = error
    while seen is not None:
        if isinstance(seen, (RunInterrupted, KeyboardInterrupt)):
            return seen
        seen = seen.__context__
    return None


def resume_command(argv: list[str]) -> Optional[str]:
    """The command that resumes the stopped one: ``fit`` with ``--ckpt_path last``; a sweep
    resumes by being run again (it skips finished runs and resumes stopped ones); None for
    commands that keep nothing to resume."""
    if not argv or argv[0] not in ("fit", "sweep"):
        return None
    args = list(argv)
    if args[0] == "fit":
        kept = []
        skip = False
        for arg in args:
            if skip:
                skip = False
            elif arg == "--ckpt_path":
                skip = True
            elif not arg.startswith("--ckpt_path="):
                kept.append(arg)
        args = [*kept, "--ckpt_path", "last"]
    return shlex.join(["python", "-m", "fl_lightning", *args])
