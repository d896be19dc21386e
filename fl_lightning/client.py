"""Client-side training: one Lightning ``Trainer`` fit per sampled client, run in the
main process or in worker processes (same results either way)."""

from __future__ import annotations

import logging
import os
import time
import warnings
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from fl_lightning.config import FederationConfig, TrainerConfig
from fl_lightning.messages import ClientResult, ClientTask, State
from fl_lightning.plugins import client_plugin
from fl_lightning.worker_pool import WorkerPool, notify

if TYPE_CHECKING:
    from fl_lightning.cohort.engine import CohortTrainer


@dataclass
class ClientFailure:
    """A client dropped from a round: it raised, ran past ``federation.client_timeout``,
    disconnected (Flower) or returned non-finite values."""

    client_id: int
    reason: str


class ClientTimeout(RuntimeError):
    pass


def _clock() -> float:
    """The deadline's clock (a module function, so a test can drive it)."""
    return time.monotonic()


class _Deadline:
    """Lightning callback: stops a client fit that runs past its time budget (checked after
    every batch, so a slow client is dropped, not waited for)."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.start = seconds, _clock()

    def check(self) -> None:
        if _clock() - self.start > self.seconds:
            raise ClientTimeout(f"local training ran past federation.client_timeout={self.seconds:g} s")


def client_seed(seed: int, round_index: int, client_id: int) -> int:
    """Each client's randomness (batch order, augmentation) in a round comes from this
    seed alone, so results do not depend on which process trains it, or on resuming."""
    return int(np.random.SeedSequence([seed, round_index, client_id]).generate_state(1)[0])


def resolve_accelerator(cfg: TrainerConfig) -> str:
    if cfg.accelerator == "auto":
        return "gpu" if torch.cuda.is_available() else "cpu"
    if cfg.accelerator == "gpu" and not torch.cuda.is_available():
        raise ValueError("trainer.accelerator=gpu but torch sees no CUDA device")
    return cfg.accelerator


def resolve_precision(cfg: TrainerConfig) -> str:
    """'auto': bf16 autocast where the GPU has bf16 units, else full precision (on a CPU,
    bf16 autocast measured no faster for these small networks)."""
    if cfg.precision != "auto":
        return cfg.precision
    if resolve_accelerator(cfg) == "gpu" and torch.cuda.is_bf16_supported():
        return "bf16-mixed"
    return "32-true"


def skip_repeated_entry_point_scan() -> None:
    """Every ``Trainer()`` scans all installed packages' entry points for callback
    factories: ~14 ms, 80 % of its construction, paid again for every client fit. Scan
    once; when no package provides such a factory, later Trainers skip the scan."""
    from lightning.pytorch.trainer.connectors import callback_connector

    original = callback_connector._load_external_callbacks
    if getattr(original, "scanned_once", False):
        return
    group = "lightning.pytorch.callbacks_factory"
    if original(group):
        return  # factories are installed: keep Lightning's behaviour

    def load_external_callbacks(name: str):
        return [] if name == group else original(name)

    load_external_callbacks.scanned_once = True
    callback_connector._load_external_callbacks = load_external_callbacks


def quiet_lightning() -> None:
    """Per-client Trainers would otherwise print device banners and tips every fit."""
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    skip_repeated_entry_point_scan()
    warnings.filterwarnings("ignore", module="lightning")
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")


@dataclass
class ClientContext:
    """What every client fit shares: the whole data set and the run's settings."""

    x: Tensor
    y: Tensor
    template: nn.Module
    federation: FederationConfig
    trainer: TrainerConfig
    seed: int
    #: unlabelled public data the clients may use (FedKT's parties label it with their teachers)
    public_x: Optional[Tensor] = None
    #: ``on_epoch(client_id, epoch, epochs)`` after each local epoch of a client's fit (progress);
    #: called in the parent process whichever process trains the client
    on_epoch: Optional[Callable[[int, int, int], None]] = None


def make_trainer(ctx: ClientContext, epochs: int, callbacks: Sequence = ()):
    """A per-client Lightning Trainer: no logger, checkpoints or validation (the federated
    loop does those), the run's accelerator and precision."""
    from lightning.pytorch import Trainer

    return Trainer(
        callbacks=list(callbacks),
        max_epochs=epochs,
        accelerator=resolve_accelerator(ctx.trainer),
        devices=1,
        precision=resolve_precision(ctx.trainer),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        benchmark=ctx.trainer.cudnn_benchmark,
    )


def deadline_callbacks(ctx: ClientContext) -> list:
    """federation.client_timeout as a Lightning callback (one deadline for all of a client's fits)."""
    if not ctx.federation.client_timeout:
        return []
    from lightning.pytorch.callbacks import Callback

    deadline = _Deadline(ctx.federation.client_timeout)
    return [type("ClientDeadline", (Callback,), {
        "on_train_batch_end": lambda self, *args, **kwargs: deadline.check()})()]


def progress_callbacks(ctx: ClientContext, client_id: int) -> list:
    """``ctx.on_epoch`` as a Lightning callback: a report after every local epoch (a plug-in
    that fits several modules reports each fit's epochs)."""
    if ctx.on_epoch is None:
        return []
    from lightning.pytorch.callbacks import Callback

    report = ctx.on_epoch
    return [type("EpochProgress", (Callback,), {
        "on_train_epoch_end": lambda self, trainer, module: report(client_id, trainer.current_epoch + 1,
                                                                   trainer.max_epochs)})()]


def train_client(ctx: ClientContext, task: ClientTask, indices: np.ndarray, round_index: int,
                 client_state: Optional[State] = None) -> ClientResult:
    """One client's local training by the plug-in of its task's kind; ``client_state`` is what
    this client kept from its earlier rounds."""
    seed = client_seed(ctx.seed, round_index, task.client_id)
    torch.manual_seed(seed)
    callbacks = [*deadline_callbacks(ctx), *progress_callbacks(ctx, task.client_id)]
    return client_plugin(task.kind).train(ctx, task, indices, seed, callbacks, dict(client_state or {}))


def fit_module(ctx: ClientContext, module, batches, epochs: int, callbacks: Sequence = ()):
    """Trains ``module`` for ``epochs``; (optimizer steps, mean loss of the last epoch's trained
    batches: a skipped batch, e.g. batch norm's lone sample, is in no epoch's mean, as in the cohort)."""
    losses: dict[int, list[Tensor]] = {}
    module.training_step = _recording(module, module.training_step, losses)
    trainer = make_trainer(ctx, epochs, callbacks)
    trainer.fit(module, train_dataloaders=batches)
    last_epoch = torch.stack(losses[max(losses)]).mean().item() if losses else float("nan")
    # Lightning counts every optimizer's step; a module with one optimizer per part (per
    # stacked model) steps them all on each batch, and a local step is one batch
    return trainer.global_step // max(1, len(trainer.optimizers)), last_epoch


def _recording(module, step_fn, losses: dict):
    """``step_fn`` that keeps the latest epoch's losses in ``losses`` (epoch -> losses)."""
    def step(batch, batch_idx):
        loss = step_fn(batch, batch_idx)
        if loss is None:  # a skipped batch (Lightning makes no optimizer step)
            return None
        epoch = module.current_epoch
        if epoch not in losses:  # only the last epoch's mean is reported: drop the earlier ones
            losses.clear()
            losses[epoch] = []
        losses[epoch].append(loss.detach())
        return loss

    return step


# ---- execution: in process, or on worker processes -------------------------------------

_WORKER_CTX: Optional[ClientContext] = None


def _worker_init(threads: int) -> None:
    global _WORKER_CTX
    torch.set_num_threads(threads)
    quiet_lightning()
    if _WORKER_CTX is not None and _WORKER_CTX.on_epoch is not None:  # the parent's reporter: sent to it
        _WORKER_CTX = replace(_WORKER_CTX, on_epoch=_epoch_to_parent)


def _epoch_to_parent(client_id: int, epoch: int, epochs: int) -> None:
    notify(("epoch", client_id, epoch, epochs))


def guarded_train(ctx: ClientContext, task: ClientTask, indices: np.ndarray, round_index: int,
                  client_state: Optional[State] = None):
    """``train_client``, with any exception (or non-finite output) turned into a
    ``ClientFailure``: one broken client must not end the round for the others."""
    try:
        result = uploaded(task, train_client(ctx, task, indices, round_index, client_state))
    except Exception as error:  # noqa: BLE001 - any client-side error drops that client only
        return ClientFailure(task.client_id, f"{type(error).__name__}: {error}")
    return checked(result)


def uploaded(task: ClientTask, result: ClientResult) -> ClientResult:
    """Only the parameters the task asks back (``task.upload``; None: all), whatever plug-in
    trained it."""
    if task.upload is not None:
        missing = set(task.upload) - set(result.params)
        if missing:
            raise ValueError(f"client {task.client_id}: asked to upload unknown parameters {sorted(missing)}")
        result.params = {name: result.params[name] for name in task.upload}
    return result


def checked(result: ClientResult):
    """``result``, or a ``ClientFailure`` when it carries non-finite values (diverged)."""
    bad = [name for part in (result.params, result.payload) for name, t in part.items()
           if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        return ClientFailure(result.client_id, f"non-finite values in {bad[:3]}{'...' if len(bad) > 3 else ''} "
                                               f"(local training diverged; loss {result.train_loss:.4g})")
    return result


def collect(outcomes, total: int, on_result: Optional[Callable[[ClientResult, int, int], None]] = None
            ) -> tuple[list[ClientResult], list[ClientFailure]]:
    """(results, failures) of a phase's outcomes in job order, whichever executor produced them
    (in process, worker processes, cohorts, Flower SuperNodes); ``on_result(result, done,
    total)`` after each success."""
    return collect_as_finished(enumerate(outcomes), total, on_result)


def collect_as_finished(positioned, total: int, on_result: Optional[Callable[[ClientResult, int, int], None]] = None
                        ) -> tuple[list[ClientResult], list[ClientFailure]]:
    """``collect`` for (job position, outcome) pairs in the order the clients finish:
    ``on_result`` as each arrives (a saved result, run.checkpoint_clients, need not wait for
    a slower client started before it), the lists in job order (the aggregation's order)."""
    arrived: dict[int, object] = {}
    for position, outcome in positioned:
        arrived[position] = outcome
        if on_result is not None and not isinstance(outcome, ClientFailure):
            on_result(outcome, len(arrived), total)
    ordered = [arrived[p] for p in sorted(arrived)]
    return ([o for o in ordered if not isinstance(o, ClientFailure)],
            [o for o in ordered if isinstance(o, ClientFailure)])


def resolve_engine(cfg: TrainerConfig) -> str:
    """'auto': the cohort engine on a GPU (launch-bound one client at a time), per client on a
    CPU, where one client's steps already keep the cores busy (bench/README.md)."""
    if cfg.engine != "auto":
        return cfg.engine
    return "cohort" if resolve_accelerator(cfg) == "gpu" else "per_client"


def cohort_groups(jobs: Sequence[tuple[ClientTask, np.ndarray]], find_plugin, cohort_size: int):
    """Job positions grouped into cohorts: jobs for which ``find_plugin(position)`` gives the
    same (plug-in, stack key), in chunks of at most ``cohort_size`` members (0: no limit); and
    the positions that train per client (no plug-in, or an empty client)."""
    groups: dict = {}
    alone = []
    for position, (task, indices) in enumerate(jobs):
        found = find_plugin(position) if len(indices) else None
        if found is None:
            alone.append(position)
            continue
        plugin, key = found
        groups.setdefault(key, (plugin, []))[1].append((position, plugin.member_count(task)))
    cohorts = []
    for plugin, entries in groups.values():
        chunk, size = [], 0
        for position, count in entries:
            if chunk and cohort_size and size + count > cohort_size:
                cohorts.append((plugin, chunk))
                chunk, size = [], 0
            chunk.append(position)
            size += count
        cohorts.append((plugin, chunk))
    return cohorts, alone


@dataclass
class CohortJob:
    """One client's local training as the cohort engine takes it: with its own run's context
    (data, seed, B, E), so that the clients of several runs (a stacked sweep) can share a cohort."""

    ctx: ClientContext
    task: ClientTask
    indices: np.ndarray
    round_index: int
    state: Optional[State] = None


def train_in_cohorts(jobs: Sequence[CohortJob], trainer_for: Callable[[ClientContext], "CohortTrainer"],
                     cohort_size: int, padded: bool = False) -> list:
    """Outcomes (ClientResult | ClientFailure) in job order: jobs whose contexts share one
    ``CohortTrainer`` (``trainer_for``) and whose plug-ins give one stack key train as cohorts
    of at most ``cohort_size`` members, each member with its own run's seed; jobs of runs with
    other batch sizes or local epochs train in cohorts of their own (no padded sample, no
    masked epoch: the arithmetic of the runs alone), or, ``padded``, together (narrower batches
    padded, shorter trainings masked: fewer steps, each wider); jobs of a plug-in that trains a
    group of its tasks itself go to it (``trained_as_groups``); the rest, and the tasks whose
    optimizer keeps its state across rounds (``optimizer.keep_state``) of a plug-in that does
    not say where its members sit in that state (``CohortPlugin.member_slices``), train per client."""
    def find(position: int):
        job = jobs[position]
        trainer = trainer_for(job.ctx)
        found = trainer.plugin_for(job.task)
        if found is None or (job.task.optimizer.keep_state and found[0].member_slices(job.task) is None):
            return None
        shape = None if padded else (job.ctx.federation.batch_size,
                                     client_plugin(job.task.kind).local_epochs(job.task, job.ctx.federation))
        return found[0], (id(trainer), found[1], shape)

    cohorts, alone = cohort_groups([(job.task, job.indices) for job in jobs], find, cohort_size)
    groupable = [p for p in alone if not jobs[p].task.optimizer.keep_state]
    outcomes = trained_as_groups(jobs, groupable, trainer_for, cohort_size)
    for position in alone:
        if position not in outcomes:
            job = jobs[position]
            outcomes[position] = guarded_train(job.ctx, job.task, job.indices, job.round_index, job.state)
    for plugin, positions in cohorts:
        group = [jobs[p] for p in positions]
        epochs = [client_plugin(job.task.kind).local_epochs(job.task, job.ctx.federation) for job in group]
        try:
            trained = trainer_for(group[0].ctx).train(
                plugin, [(job.task, job.indices) for job in group], group[0].round_index, _client_seeds(group), epochs,
                [dict(job.state or {}) for job in group], [job.ctx.federation.batch_size for job in group],
                [job.ctx.on_epoch for job in group])
        except Exception as error:  # noqa: BLE001 - a failed cohort drops its clients only
            trained = _dropped(group, error)
        outcomes.update((position, _finished(job, outcome)) for position, job, outcome in zip(positions, group, trained))
    return [outcomes[p] for p in range(len(jobs))]


def trained_as_groups(jobs: Sequence[CohortJob], positions: Sequence[int],
                      trainer_for: Callable[[ClientContext], "CohortTrainer"], cohort_size: int) -> dict[int, object]:
    """Outcomes of the jobs at ``positions`` (tasks with no ``cohort``) that their plug-ins train
    as a group with the cohort engine (``ClientPlugin.train_group_in_cohorts``): one group per
    task kind and cohort trainer; a group that raises drops its clients. A job left out (its
    plug-in declined it, or it has no local samples) trains per client."""
    groups: dict[tuple, list[int]] = {}
    for position in positions:
        job = jobs[position]
        if len(job.indices):
            groups.setdefault((job.task.kind, id(trainer_for(job.ctx))), []).append(position)
    outcomes: dict[int, object] = {}
    for (kind, _), members in groups.items():
        group = [jobs[p] for p in members]
        try:
            trained = client_plugin(kind).train_group_in_cohorts(group, _client_seeds(group), trainer_for(group[0].ctx),
                                                                 cohort_size)
        except Exception as error:  # noqa: BLE001 - a failed group drops its clients only
            trained = _dropped(group, error)
        outcomes.update((position, _finished(job, outcome))
                        for position, job, outcome in zip(members, group, trained) if outcome is not None)
    return outcomes


def _client_seeds(group: Sequence[CohortJob]) -> list[int]:
    return [client_seed(job.ctx.seed, job.round_index, job.task.client_id) for job in group]


def _dropped(group: Sequence[CohortJob], error: Exception) -> list[ClientFailure]:
    return [ClientFailure(job.task.client_id, f"{type(error).__name__}: {error}") for job in group]


def _finished(job: CohortJob, outcome):
    """A cohort's outcome for ``job`` as ``guarded_train`` would give it: only the parameters
    asked back, and a failure where they are not finite."""
    if not isinstance(outcome, ClientResult):
        return outcome
    try:
        return checked(uploaded(job.task, outcome))
    except ValueError as error:
        return ClientFailure(job.task.client_id, f"{type(error).__name__}: {error}")


def _worker_train(positioned_args):
    position, args = positioned_args
    return guarded_train(_WORKER_CTX, *args)


def _from_workers(finished):
    """(job position, outcome) of the pool's finished jobs; a job whose worker raised outside
    ``guarded_train`` or died (killed, out of memory) drops its client."""
    for (position, args), outcome, error in finished:
        yield position, (ClientFailure(args[0].client_id, error) if error is not None else outcome)


class ClientExecutor:
    """Trains a round's clients. With ``workers > 1`` on a CPU, forked processes (one torch
    thread each unless set) share the data set's memory with the parent
    (fl_lightning/worker_pool.py: a worker that dies drops its client instead of hanging the
    round, and ``terminate()`` ends them at once)."""

    def __init__(self, ctx: ClientContext) -> None:
        global _WORKER_CTX
        self.ctx = ctx
        cfg = ctx.trainer
        if cfg.workers < 1:
            raise ValueError(f"trainer.workers={cfg.workers} must be >= 1")
        self.parallel = cfg.workers > 1 and resolve_accelerator(cfg) == "cpu"
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        threads = cfg.threads or (1 if self.parallel else cores)
        # The parent waits while workers train, then evaluates alone: it may use every core.
        torch.set_num_threads(cfg.threads or cores)
        quiet_lightning()
        self._pool = None
        self.engine = resolve_engine(cfg)
        if self.engine == "cohort":
            from fl_lightning.cohort.engine import CohortTrainer

            self.parallel = False  # one process trains the whole cohort
            self._cohorts = CohortTrainer(ctx, make_trainer, lambda: deadline_callbacks(ctx))
        if self.parallel:
            _WORKER_CTX = ctx  # inherited by fork, never pickled
            self._pool = WorkerPool(cfg.workers, _worker_train, initializer=_worker_init, initargs=(threads,))

    def run(self, jobs: Sequence[tuple[ClientTask, np.ndarray]], round_index: int,
            on_result: Optional[Callable[[ClientResult, int, int], None]] = None,
            client_states: Optional[dict[int, State]] = None) -> tuple[list[ClientResult], list[ClientFailure]]:
        """Results and failures in job order; ``on_result(result, done, total)`` after each
        successful client (progress). ``client_states``: what each client kept from its earlier
        rounds (client id -> tensors; the caller keeps the results' new ``client_state``)."""
        states = client_states or {}
        if self.engine == "cohort":
            return collect(self._run_cohorts(jobs, round_index, states), len(jobs), on_result)
        args = [(task, indices, round_index, states.get(task.client_id)) for task, indices in jobs]
        if self._pool is not None:
            finished = self._pool.imap_unordered(list(enumerate(args)), on_note=self._note)
            return collect_as_finished(_from_workers(finished), len(jobs), on_result)
        return collect((guarded_train(self.ctx, *a) for a in args), len(jobs), on_result)

    def _run_cohorts(self, jobs: Sequence[tuple[ClientTask, np.ndarray]], round_index: int, states: dict[int, State]):
        """Outcomes in job order: stackable tasks trained as cohorts, the rest per client."""
        return train_in_cohorts([CohortJob(self.ctx, task, indices, round_index, states.get(task.client_id))
                                 for task, indices in jobs], lambda ctx: self._cohorts, self.ctx.trainer.cohort_size)

    def _note(self, note) -> None:
        if note[0] == "epoch" and self.ctx.on_epoch is not None:
            self.ctx.on_epoch(*note[1:])

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def terminate(self) -> None:
        """Stop now (an interrupt, an error): worker processes are killed, not waited for."""
        if self._pool is not None:
            self._pool.terminate()
            self._pool = None
