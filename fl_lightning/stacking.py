"""Stacked runs: the runs of a sweep trained together, their clients in shared cohorts.

A sweep's runs are a few small models each, and a GPU trains one of them in many small steps.
``fit_stacked`` runs every run's own federated loop (``Federation.fit``: its partition, seed,
sampling, server state, checkpoints, summary and W&B run) in a thread of its own, with a
``StackedExecutor`` in place of its client executor. The main thread waits until every
unfinished run has handed in its next client phase, then trains all of those clients at once
(``client.train_in_cohorts``): clients of runs with the same data, model and trainer settings
share a ``CohortTrainer``, and those whose plug-ins give one stack key share a cohort, each
member with its own run's seed and optimizer state. Runs of other batch sizes B or local
epochs E get cohorts of their own (``grouped``: the runs' own arithmetic, in fewer launches),
or share them, the narrower batches padded and the shorter trainings masked (``padded``:
fewer steps, each doing more arithmetic). Each run then gets its own results back and goes on
alone to its server step; runs may be at different rounds (a resumed run beside a fresh one)
and end at different rounds. So a stacked run is its run alone with the cohort engine, up to
the order of the arithmetic (tests/test_stacking.py).

The runs' loops take turns (one at a time between client phases: server steps that seed
torch's global generator must not interleave), so each run draws what it draws alone.

Each run's own progress display is off in a stack (sweep.py); the stack prints one line of its
own instead, after each step, and while a step trains at most every ``PROGRESS_EVERY_S``
seconds (``StackProgress``): a one-shot step at FedOV's E = 200 trains for minutes.

Only the main thread receives signals: Ctrl-C there stops the cohort it is training, and every
run stops at its next client phase as a fit stops on Ctrl-C (its last finished round's
checkpoint is kept); running the sweep again resumes them all.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional, Sequence

from fl_lightning.client import (ClientContext, CohortJob, collect, make_trainer, deadline_callbacks, quiet_lightning,
                                 resolve_engine, train_in_cohorts)
from fl_lightning.callbacks.logging import RoundClock, duration
from fl_lightning.interrupts import RunInterrupted

#: settings that must be equal for two runs' clients to share a cohort trainer (the same data
#: tensors, model template, device and precision); everything else may differ between them
SHARED_SETTINGS = ("data", "model", "trainer")
WAIT_S = 0.2  # how often a waiting thread looks up from its condition (signals reach the main thread)
PROGRESS_EVERY_S = 30.0  # the most often a training step's progress line is printed


class StackProgress:
    """The progress of the step a stack is training: the share of its clients' local epochs
    done and the time left (``RoundClock``'s arithmetic, each run's clients apart). A thread
    prints it every ``every_s`` seconds while it has moved (the cohort reports every member's
    epochs at once, as a window of steps ends; a line per report would show the first member's
    share only); ``every_s`` 0: a line after every report, in the reporting thread."""

    def __init__(self, report: Callable[[str], None], every_s: float, clock: Callable[[], float] = time.monotonic):
        self.report, self.every_s, self.clock = report, every_s, clock
        self._lock = threading.Lock()
        self._round: Optional[RoundClock] = None
        self._span, self._shown = "", 0.0
        self._stopped = threading.Event()
        self._ticker: Optional[threading.Thread] = None

    def start(self, clients: int, span: str) -> None:
        with self._lock:
            self._round, self._span, self._shown = RoundClock(clients, self.clock()), span, 0.0
        if self.every_s > 0:
            self._stopped.clear()
            self._ticker = threading.Thread(target=self._tick_every, name="stack-progress", daemon=True)
            self._ticker.start()

    def stop(self) -> None:
        if self._ticker is not None:
            self._stopped.set()
            self._ticker.join()
            self._ticker = None
        with self._lock:
            self._round = None

    def reporter(self, run_index: int, inner: Optional[Callable[[int, int, int], None]]):
        """A run's ``on_epoch``: the run's own (``inner``), then the stack's."""
        def on_epoch(client_id: int, epoch: int, epochs: int) -> None:
            if inner is not None:
                inner(client_id, epoch, epochs)
            self.epoch((run_index, client_id), epoch, epochs)
        return on_epoch

    def epoch(self, member: tuple[int, int], epoch: int, epochs: int) -> None:
        with self._lock:
            if self._round is not None:
                self._round.epoch(member, epoch, epochs, self.clock())
        if self.every_s <= 0:
            self.tick()

    def tick(self) -> None:
        """The line, if the share of epochs done has moved since the last one."""
        with self._lock:
            clock = self._round
            if clock is None or clock.fraction() == self._shown:
                return
            now, self._shown = self.clock(), clock.fraction()
            left = clock.seconds_left(now)
            line = (f"stack: {self._span}, {clock.total} clients: {self._shown:.0%} of their local epochs done "
                    f"in {duration(now - clock.started)}, about {duration(left) if left is not None else '-'} left")
        self.report(line)

    def _tick_every(self) -> None:
        while not self._stopped.wait(self.every_s):
            self.tick()


@dataclass
class StackedRun:
    """One run of a stack: its Federation, the checkpoint it resumes from, and how it ended."""

    name: str
    federation: Any  # fl_lightning.federation.Federation
    ckpt_path: Optional[str] = None
    summary: Optional[dict] = None
    error: Optional[BaseException] = None
    seconds: float = 0.0


@dataclass
class _Phase:
    """A client phase one run handed in: its jobs and, once trained, their outcomes."""

    jobs: list[CohortJob]
    outcomes: Optional[list] = None


@dataclass
class _StackState:
    live: int
    waiting: dict[int, _Phase] = field(default_factory=dict)  # run index -> its phase to train
    stop: Optional[RunInterrupted] = None


class StackedExecutor:
    """A run's client executor inside a stack: ``run`` hands the phase to the stack and waits
    for its outcomes (Federation.fit's executor protocol)."""

    def __init__(self, stack: "Stack", index: int, federation) -> None:
        self.stack, self.index, self.federation = stack, index, federation
        self._ctx: Optional[ClientContext] = None

    def run(self, jobs, round_index: int, on_result=None, client_states=None):
        if self._ctx is None:  # the federation's data exist once its fit has set it up
            self._ctx = self.stack.register(self.federation, self.index)
        states = client_states or {}
        phase = [CohortJob(self._ctx, task, indices, round_index, states.get(task.client_id)) for task, indices in jobs]
        return collect(self.stack.train(self.index, phase), len(jobs), on_result)

    def close(self) -> None:
        pass


class Stack:
    """Trains the client phases of several runs together (the main thread), while each run's
    loop runs in a thread of its own."""

    def __init__(self, runs: Sequence[StackedRun], cohort_size: int = 0, padded: bool = False,
                 report: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)) -> None:
        self.runs, self.cohort_size, self.report = list(runs), cohort_size, report
        self.padded = padded
        self.progress = StackProgress(report, PROGRESS_EVERY_S)
        self._state = _StackState(live=len(self.runs))
        self._cond = threading.Condition()
        # one run's loop at a time: their server steps seed and draw from torch's global RNG
        # (Strategy.fresh_models), which threads running side by side would interleave
        self._turn = threading.Lock()
        self._trainers: dict[str, Any] = {}  # shared settings -> CohortTrainer
        self._trainer_of: dict[int, Any] = {}  # id(a run's client context) -> its CohortTrainer
        self.steps = 0

    # ---- called from the runs' threads ---------------------------------------------------
    def train(self, index: int, jobs: list[CohortJob]) -> list:
        """Hands in run ``index``'s client phase and waits for its outcomes (its turn is free
        meanwhile: another run's loop goes on, or the main thread trains)."""
        phase = _Phase(jobs)
        with self._cond:
            self._raise_if_stopped()
            self._state.waiting[index] = phase
            self._cond.notify_all()
        self._turn.release()
        try:
            with self._cond:
                while phase.outcomes is None:
                    self._raise_if_stopped()
                    self._cond.wait(WAIT_S)
        finally:
            self._turn.acquire()
        return phase.outcomes

    def _raise_if_stopped(self) -> None:
        if self._state.stop is not None:
            raise RunInterrupted(self._state.stop.signum)

    def _left(self) -> None:
        with self._cond:
            self._state.live -= 1
            self._cond.notify_all()

    # ---- the main thread -----------------------------------------------------------------
    def register(self, federation, index: int) -> ClientContext:
        """Run ``index``'s client context (its epochs reported to the stack's progress too),
        joined to the cohort trainer of the runs with its shared settings (that trainer's context
        is the first such run's: the same data and model)."""
        from fl_lightning.cohort.engine import CohortTrainer

        ctx = federation.client_context()
        ctx = replace(ctx, on_epoch=self.progress.reporter(index, ctx.on_epoch))
        key = json.dumps({k: federation.config.get(k) for k in SHARED_SETTINGS}, sort_keys=True, default=str)
        with self._cond:
            if key not in self._trainers:
                self._trainers[key] = CohortTrainer(ctx, make_trainer, lambda: deadline_callbacks(ctx))
            self._trainer_of[id(ctx)] = self._trainers[key]
        return ctx

    def trainer_for(self, ctx: ClientContext):
        return self._trainer_of[id(ctx)]

    def fit(self) -> list[StackedRun]:
        """Every run to its end (or its error); the runs in the order given."""
        quiet_lightning()
        threads = [threading.Thread(target=self._run, args=(i,), name=f"stacked-run-{i}", daemon=True)
                   for i in range(len(self.runs))]
        for thread in threads:
            thread.start()
        try:
            while True:
                with self._cond:
                    while self._state.live and len(self._state.waiting) < self._state.live:
                        self._cond.wait(WAIT_S)
                    if not self._state.live:
                        break
                    phases, self._state.waiting = self._state.waiting, {}
                self._train_phases(phases)
        except RunInterrupted as stop:  # the runs stop at their next client phase, as a fit does
            with self._cond:
                self._state.stop = stop
                self._cond.notify_all()
            for thread in threads:
                thread.join()
            stopped = [(run.name, run.error) for run in self.runs if isinstance(run.error, RunInterrupted)]
            stop.where = f"with {len(stopped)} stacked runs unfinished"
            stop.kept = [f"{name}: {error.where}, kept {', '.join(error.kept) or 'nothing yet'}" for name, error in stopped]
            raise
        for thread in threads:
            thread.join()
        return self.runs

    def _train_phases(self, phases: dict[int, _Phase]) -> None:
        started = time.perf_counter()
        jobs = [job for phase in phases.values() for job in phase.jobs]
        rounds = sorted({job.round_index for job in jobs})
        span = f"round {rounds[0]}" if len(rounds) == 1 else f"rounds {rounds[0]}-{rounds[-1]}"
        self.progress.start(len(jobs), span)
        try:
            outcomes = train_in_cohorts(jobs, self.trainer_for, self.cohort_size, self.padded)
        finally:
            self.progress.stop()
        start = 0
        with self._cond:
            for phase in phases.values():
                phase.outcomes = outcomes[start:start + len(phase.jobs)]
                start += len(phase.jobs)
            self._cond.notify_all()
        self.steps += 1
        self.report(f"stack: {len(phases)} runs ({span}), {len(jobs)} clients trained together in "
                    f"{time.perf_counter() - started:.1f} s")

    def _run(self, index: int) -> None:
        run = self.runs[index]
        started = time.perf_counter()
        self._turn.acquire()
        try:
            run.summary = run.federation.fit(ckpt_path=run.ckpt_path,
                                             executor=StackedExecutor(self, index, run.federation))
        except BaseException as error:  # noqa: BLE001 - reported per run; the others go on
            run.error = error
        finally:
            run.seconds = time.perf_counter() - started
            self._turn.release()
            self._left()


def stackable(federations: Sequence) -> Optional[str]:
    """Why these runs cannot be stacked here (None: they can): stacking trains their clients
    with the cohort engine, which ``trainer.engine`` must select (the default on a GPU)."""
    engines = {resolve_engine(f.trainer_cfg) for f in federations}
    if engines != {"cohort"}:
        return ("stacking trains the runs' clients as one cohort (trainer.engine: cohort, the default on a GPU); "
                f"here trainer.engine resolves to {', '.join(sorted(engines))}")
    return None


def fit_stacked(runs: Sequence[StackedRun], cohort_size: Optional[int] = None,
                padded: bool = False) -> list[StackedRun]:
    """Trains ``runs`` as one stack (``stackable`` must hold); each run's ``summary`` or
    ``error`` is filled in. ``cohort_size``: members per cohort (default: the first run's
    ``trainer.cohort_size``); ``padded``: runs of different B and E share cohorts, padded and
    masked (fewer steps, each wider), instead of a cohort per (B, E)."""
    if cohort_size is None:
        cohort_size = runs[0].federation.trainer_cfg.cohort_size if runs else 0
    return Stack(runs, cohort_size, padded).fit()
