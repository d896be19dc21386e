"""Forked worker processes that run one job at a time each, over a pipe of their own.

Why not ``multiprocessing.Pool``: its workers share one task queue behind a lock that an idle
worker holds while it waits. A worker killed then (SIGTERM to the process group) leaves the
lock taken, and ``Pool.terminate()`` waits for it for ever; a worker killed during a job
leaves that job's result missing, and ``imap_unordered`` waits for it for ever; ``close()``
joins while the pool keeps respawning workers. Here each worker has its own pipe: a worker
that dies is noticed (its job gets an error, a fresh worker takes its place), and
``terminate()`` kills every worker without waiting on any lock.

A job may send notes to the parent while it runs (``notify``: client training reports its
epochs), handed to ``imap_unordered``'s ``on_note`` in the parent.

Jobs and results travel as plain pickles, tensors by value, not through torch's shared-memory
reductions (``Connection.send``'s pickler): those keep a file descriptor open for every tensor
sent while it lives, on both ends, and a run whose clients keep their optimizer state
(``optimizer.keep_state``: a few hundred tensors a client for MobileNet) ran out of them
(errno 24, too many open files) in its first round.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Iterable, Iterator, Optional

from fl_lightning.interrupts import ignore_in_worker

_channel: Optional[Connection] = None  # in a worker process: its pipe to the parent


def _send(channel: Connection, message: Any) -> None:
    channel.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def _receive(channel: Connection) -> Any:
    return pickle.loads(channel.recv_bytes())


def notify(note: Any) -> bool:
    """From a job running in a worker: send ``note`` to the parent (``on_note``). False when
    not in a worker process."""
    if _channel is None:
        return False
    _send(_channel, ("note", note))
    return True


def _serve(channel: Connection, function: Callable, initializer: Optional[Callable], initargs: tuple) -> None:
    global _channel
    ignore_in_worker()
    _channel = channel
    if initializer is not None:
        initializer(*initargs)
    while True:
        try:
            job = _receive(channel)
        except (EOFError, OSError):  # the parent is gone
            return
        if job is None:
            return
        try:
            outcome = ("done", function(job), None)
        except Exception as error:  # noqa: BLE001 - the parent decides what a failed job means
            outcome = ("done", None, f"{type(error).__name__}: {error}")
        _send(channel, outcome)


@dataclass(eq=False)
class _Worker:
    process: Any
    channel: Connection


class WorkerPool:
    """``processes`` forked workers that each run ``function(job)``; ``initializer(*initargs)``
    once in each, after fork."""

    def __init__(self, processes: int, function: Callable, initializer: Optional[Callable] = None,
                 initargs: tuple = ()) -> None:
        self._context = mp.get_context("fork")
        self._spec = (function, initializer, initargs)
        self._workers = [self._start() for _ in range(processes)]

    def _start(self) -> _Worker:
        parent_end, child_end = self._context.Pipe()
        process = self._context.Process(target=_serve, args=(child_end, *self._spec), daemon=True)
        process.start()
        child_end.close()
        return _Worker(process, parent_end)

    def _replace(self, dead: _Worker) -> _Worker:
        dead.process.join(timeout=1)
        dead.channel.close()
        fresh = self._start()
        self._workers[self._workers.index(dead)] = fresh
        return fresh

    def imap_unordered(self, jobs: Iterable, on_note: Optional[Callable[[Any], None]] = None
                       ) -> Iterator[tuple[Any, Any, Optional[str]]]:
        """``(job, result, error)`` as each job finishes; ``error`` is None, the exception the
        job raised (as text), or why its worker process died."""
        pending = deque(jobs)
        idle = list(self._workers)
        running: dict[_Worker, Any] = {}
        while pending or running:
            while pending and idle:
                worker, job = idle.pop(), pending.popleft()
                try:
                    _send(worker.channel, job)
                except OSError:  # it died between two jobs
                    worker = self._replace(worker)
                    _send(worker.channel, job)
                running[worker] = job
            ready = set(wait([w.channel for w in running] + [w.process.sentinel for w in running]))
            for worker in [w for w in running if w.channel in ready or w.process.sentinel in ready]:
                try:
                    message = _receive(worker.channel) if worker.channel in ready else None
                except (EOFError, OSError):
                    message = None
                if message is not None and message[0] == "note":
                    if on_note is not None:
                        on_note(message[1])
                    continue
                job = running.pop(worker)
                if message is None:  # no result and no pipe: the process is gone
                    worker.process.join(timeout=1)
                    idle.append(self._replace(worker))
                    yield job, None, f"its worker process died (exit code {worker.process.exitcode})"
                    continue
                idle.append(worker)
                yield job, message[1], message[2]

    def close(self) -> None:
        """Let the workers finish and exit (killed if they do not within 10 s)."""
        for worker in self._workers:
            try:
                _send(worker.channel, None)
            except OSError:
                pass
        for worker in self._workers:
            worker.process.join(timeout=10)
        self.terminate()

    def terminate(self) -> None:
        """Kill every worker now (SIGKILL: a worker holds nothing the parent needs)."""
        for worker in self._workers:
            if worker.process.exitcode is None:
                worker.process.kill()
        for worker in self._workers:
            worker.process.join(timeout=5)
            worker.channel.close()
        self._workers = []
