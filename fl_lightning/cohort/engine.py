"""The cohort engine: a round's stackable client tasks trained as one vectorised model.

Members (one model each: a FedAvg client, a FedOVA (client, detector) pair) are stacked
along a leading dimension and trained by one Lightning ``Trainer`` in one fit. Every step
runs ``vmap(grad(member loss))`` over all members, each on a batch of its own client's data
(``plan.BatchPlan``), then the per-member optimizer (``optim.MemberOptimizer``: SGD, Adam,
FIM-L-BFGS with its pair histories, or a probe's sums); members whose local training has
ended are masked. An optimizer that reads a statistic of each sample's data loss (FIM-L-BFGS's
diagonal Fisher) gets it per member from the same step, over the batch's real samples. A loss
that is random at every step reads its draws (``members.StepDraws``) from device buffers
filled a window of steps at a time, so the step has static shapes too. Batch norm's running statistics are per-member state that
the step carries (``batch_norm``: statistics of each member's real samples only) and dropout's
masks are draws like any other (``dropout``), so networks with both stack too. On a GPU the
step is captured once in a CUDA graph and replayed (shapes are static within a round; a
cohort of the same shapes in a later round reuses the graph) while the host draws the next
window, and the data stay on the device: a round costs the arithmetic. With
``trainer.compile`` the step is first compiled by ``torch.compile`` as one graph (``compiled``),
which fuses its many small operations; the capture then records the fused kernels.

A member whose local training has ended still costs its share of every step (masked), and a
cohort runs as many steps as its largest member: with unequal clients (NIID-Bench's splits:
the largest about 1.5x the mean) a long one-shot training would spend up to a third of its member
steps on finished members. So where few members are left to step and many steps remain
(``compaction_points``), the cohort goes on without its finished members: a new runner of
the members still training, their parameters, optimizer state and draws carried over
(``CohortTrainer.train``), its graph captured afresh.
"""

from __future__ import annotations

import copy
from typing import Callable, Optional, Sequence, Union

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import grad_and_value, vmap

from fl_lightning.callbacks.optimizer_state import check_kept_names, kept_for, kept_state, merged, slot_state
from fl_lightning.cohort.batch_norm import (STATISTICS, has_batch_norm, normalisable, padded_batch_norm,
                                            statistics_names)
from fl_lightning.cohort.dropout import DropoutMasks, drawn_dropout, dropout_layers, has_other_dropout
from fl_lightning.cohort.members import CohortPlugin, Member, StepDraws
from fl_lightning.cohort.optim import MemberOptimizer, OptimizerChoice, per_member, stacked_choice
from fl_lightning.cohort.plan import BatchPlan, build_plan, without_steps
from fl_lightning.config import OptimizerConfig
from fl_lightning.functional import functional_forward

#: a cohort drops its finished members when at most this share of its members still steps ...
COMPACT_SHARE = 0.75
#: ... and at least this many steps are left (the new runner's graph capture must pay for itself)
COMPACT_MIN_STEPS = 512
#: the steps at which it looks (the draw window: no partly used buffer of draws is left behind)
COMPACT_EVERY = 256


def _stack(dicts: Sequence[dict[str, Tensor]], device) -> list[Tensor]:
    names = list(dicts[0])
    return [torch.stack([d[n] for d in dicts]).to(device=device, dtype=torch.float32 if dicts[0][n].is_floating_point()
                                                   else dicts[0][n].dtype) for n in names]


def stacks(network: nn.Module, plugin: CohortPlugin, optimizer: Optional[type[MemberOptimizer]] = None) -> bool:
    """Whether ``network`` can train in a cohort with ``plugin``'s loss (and ``optimizer``): its
    only buffers are batch norm's running statistics, its only dropout nn.Dropout, and with
    either the plug-in's loss allows them (``CohortPlugin.batch_norm_and_dropout``); an optimizer
    that reads per-sample losses needs the plug-in's (``CohortPlugin.sample_losses``) and a network
    with neither: per-sample gradients run it on one sample at a time, where batch norm has no
    statistics and a batch's dropout masks do not fit (per client such a fit fails too)."""
    if {n for n, _ in network.named_buffers()} - set(statistics_names(network)) or has_other_dropout(network):
        return False
    with_state = has_batch_norm(network) or any(isinstance(m, nn.Dropout) for m in network.modules())
    if optimizer is not None and optimizer.uses_sample_losses:
        return plugin.gives_sample_losses and not with_state
    return plugin.batch_norm_and_dropout or not with_state


def _choice(optimizer: Union[OptimizerConfig, OptimizerChoice]) -> OptimizerChoice:
    """(member optimizer class, settings): given, or the stacked optimizer of ``optimizer.name``."""
    if isinstance(optimizer, tuple):
        return optimizer
    chosen = stacked_choice(optimizer)
    if chosen is None:
        raise ValueError(f"optimizer.name={optimizer.name!r} does not stack in a cohort")
    return chosen


def compiled(step: Callable[[], None]) -> Callable[[], None]:
    """``step`` compiled by ``torch.compile`` as one graph (``trainer.compile``): the members'
    tensors are read from the runner at each call, so a later runner of the same shapes reuses
    the compiled code (a new shape compiles anew). A step it cannot trace whole fails loudly at
    its first call, naming the setting, rather than running in pieces."""
    graph = torch.compile(step, fullgraph=True, dynamic=False)

    def run() -> None:
        try:
            graph()
        except torch._dynamo.exc.TorchDynamoException as error:
            raise RuntimeError(f"trainer.compile: torch.compile cannot compile this cohort's training step as one "
                               f"graph ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}); "
                               f"run without --trainer.compile") from error

    return run


class CohortRunner:
    """The static tensors of one cohort shape (parameters, running statistics, optimizer state,
    batch plan, draw buffers) and its training step, eager or replayed from a captured CUDA graph."""

    WARMUP_STEPS = 3  # eager steps on a side stream before capture (cuDNN/cuBLAS set-up)
    DRAW_WINDOW = 256  # steps of random draws per buffer fill (FedOV, 10 members, B = 64: 5 MB)

    def __init__(self, template: nn.Module, plugin: CohortPlugin, members: list[Member], plan: BatchPlan,
                 x: Tensor, y: Tensor, optimizer: Union[OptimizerConfig, OptimizerChoice], use_graph: bool,
                 draws: Optional[StepDraws] = None, lr: Optional[Sequence[float]] = None,
                 compile_step: bool = False) -> None:
        device = x.device
        self.x, self.y, self.plugin, self.draws = x, y, plugin, draws
        self.state_names = list(members[0].params)  # the members' state-dict order, for the result
        statistics = set(statistics_names(template))
        self.names = [n for n in self.state_names if n not in statistics]
        self.statistics_names = [n for n in self.state_names if n in statistics]
        self.const_names = list(members[0].consts)
        self.params = _stack([{n: m.params[n] for n in self.names} for m in members], device)
        self.statistics = _stack([{n: m.params[n] for n in self.statistics_names} for m in members], device)
        self.consts = _stack([m.consts for m in members], device) if self.const_names else []
        self.offsets = (_stack([m.grad_offset for m in members], device) if members[0].grad_offset is not None
                        else None)
        self.plan = plan.to(device)  # static buffers: a later plan of as many steps or fewer fits in them
        self.host_plan = plan  # the draws are made on the host, from the plan's real samples
        self.num_steps = plan.num_steps
        kind, settings = _choice(optimizer)
        self.optimizer = kind(settings, self.params, lr)  # lr: each member's (default: the settings' lr)
        self.optimizer.start_from([m.optimizer_state for m in members], self.names)
        self.counter = torch.zeros(1, dtype=torch.long, device=device)
        self.loss_sum = torch.zeros(len(members), device=device)
        self.use_graph = use_graph and device.type == "cuda"
        self.graph: Optional[torch.cuda.CUDAGraph] = None
        # the draws of DRAW_WINDOW steps (steps, members, ...), read at draw_position by the step
        self.draw_buffers: dict[str, Tensor] = {}
        self.draw_position = torch.zeros(1, dtype=torch.long, device=device)
        self.draw_names: list[str] = []  # set by the first fill (run), before any step reads them
        self.first_step = 0  # the number of this plan's first step in the members' own step sequences
        network = copy.deepcopy(template).to("meta").train()  # lends its code; its tensors cost nothing
        self.dropout_names = set(dropout_layers(network, tuple(x.shape[1:])))
        batch_norm, masks = padded_batch_norm(network), drawn_dropout(network)
        layers = [n[:-len(".running_mean")] for n in self.statistics_names if n.endswith(".running_mean")]
        forward = functional_forward(network)

        def member_loss(params, consts, statistics, xb, yb, wb, drawn):
            static = self.draws.static if self.draws is not None else {}
            inputs = dict(zip(self.draw_names, drawn))
            running = dict(zip(self.statistics_names, statistics))
            batch_norm.weight = wb
            batch_norm.running = {layer: tuple(running[f"{layer}.{s}"] for s in STATISTICS) for layer in layers}
            masks.masks = {n: inputs.pop(n) for n in self.dropout_names}
            try:
                loss = plugin.loss(forward, dict(zip(self.names, params)), dict(zip(self.const_names, consts)), xb,
                                   yb, wb, **static, **inputs)
                updated = tuple(t for layer in layers for t in batch_norm.running[layer])
            finally:  # the step's tensors live inside vmap: none may outlive it
                batch_norm.weight, batch_norm.running, masks.masks = None, {}, None
            return loss, updated

        self.grad_fn = vmap(grad_and_value(member_loss, has_aux=True))
        self.value_fn = vmap(member_loss)  # a member optimizer that reads no gradient (a probe): the loss alone

        def member_statistic(params, consts, xb, yb, wb):
            constants = dict(zip(self.const_names, consts))

            def sample_losses(p, x_part, y_part):
                return plugin.sample_losses(forward, p, constants, x_part, y_part)

            return self.optimizer.batch_statistic(sample_losses, dict(zip(self.names, params)), xb, yb, wb)

        # e.g. FIM-L-BFGS's diagonal Fisher: per member, from per-sample gradients of its data loss
        self.statistic_fn = vmap(member_statistic) if self.optimizer.uses_sample_losses else None
        self.compile_step = compile_step
        self._step = compiled(self.step) if compile_step else self.step  # what the windows and the capture run

    @staticmethod
    def shape_key(members: list[Member], plan: BatchPlan, optimizer: Union[OptimizerConfig, OptimizerChoice]) -> tuple:
        """Cohorts with equal keys can share one runner (and its captured graph); the members'
        learning rates are data (``load``), not part of the key."""
        first = members[0]
        kind, settings = _choice(optimizer)
        return (len(members), tuple((n, tuple(t.shape)) for n, t in first.params.items()),
                tuple((n, tuple(t.shape)) for n, t in first.consts.items()), first.grad_offset is not None,
                tuple(plan.index.shape[1:]), (kind, kind.shared_settings(settings)))

    def fits(self, plan: BatchPlan) -> bool:
        return plan.num_steps <= self.plan.num_steps

    def load(self, members: list[Member], plan: BatchPlan, draws: Optional[StepDraws] = None,
             lr: Optional[Sequence[float]] = None) -> None:
        """A new round's members, plan, draws and learning rates into the same static tensors
        (the graph reads them); the plan may be shorter than the buffers (the rest is never reached)."""
        device = self.x.device
        self.draws, self.host_plan = draws, plan
        if lr is not None:
            self.optimizer.lr.copy_(torch.tensor(lr, dtype=torch.float32))
        self.optimizer.start_from([m.optimizer_state for m in members], self.names)
        for static, new in zip(self.params, _stack([{n: m.params[n] for n in self.names} for m in members], device)):
            static.copy_(new)
        for static, new in zip(self.statistics, _stack([{n: m.params[n] for n in self.statistics_names}
                                                        for m in members], device)):
            static.copy_(new)
        if self.const_names:
            for static, new in zip(self.consts, _stack([m.consts for m in members], device)):
                static.copy_(new)
        if self.offsets is not None:
            for static, new in zip(self.offsets, _stack([m.grad_offset for m in members], device)):
                static.copy_(new)
        new_plan = plan.to(device)
        for static, new in ((self.plan.index, new_plan.index), (self.plan.weight, new_plan.weight),
                            (self.plan.active, new_plan.active), (self.plan.last_epoch, new_plan.last_epoch)):
            static[:len(new)].copy_(new)
        self.num_steps = plan.num_steps
        self.plan.steps, self.plan.last_epoch_batches = plan.steps, plan.last_epoch_batches

    def reset(self) -> None:
        self.optimizer.reset()  # afresh, or where each member's client kept it
        self.counter.zero_()
        self.loss_sum.zero_()

    def _fill_draws(self, start: int, count: int) -> None:
        """Steps start .. start + count - 1's draws into the buffers, read from position 0 on."""
        window = self.draws.window(self.first_step + start, self.host_plan.weight[start:start + count],
                                   self.host_plan.active[start:start + count])
        for name, host in window.items():
            if name not in self.draw_buffers:
                self.draw_buffers[name] = torch.zeros((self.DRAW_WINDOW, *host.shape[1:]), dtype=host.dtype,
                                                      device=self.x.device)
            self.draw_buffers[name][:count].copy_(host)
        self.draw_names = list(self.draw_buffers)
        self.draw_position.zero_()

    def step(self) -> None:
        s = self.counter
        index = self.plan.index.index_select(0, s).squeeze(0)  # (members, B)
        weight = self.plan.weight.index_select(0, s).squeeze(0)
        last = self.plan.last_epoch.index_select(0, s).squeeze(0)
        active = self.plan.active.index_select(0, s).squeeze(0)
        xb, yb = self.x[index], self.y[index]
        drawn = tuple(self.draw_buffers[n].index_select(0, self.draw_position).squeeze(0) for n in self.draw_names)
        inputs = (tuple(self.params), tuple(self.consts), tuple(self.statistics), xb, yb, weight, drawn)
        if self.optimizer.uses_gradient:
            grads, (losses, statistics) = self.grad_fn(*inputs)
        else:
            grads, (losses, statistics) = [], self.value_fn(*inputs)
        # before the update: the statistic is the batch's at the parameters the gradient was taken at
        measured = (self.statistic_fn(tuple(self.params), tuple(self.consts), xb, yb, weight)
                    if self.statistic_fn is not None else ())
        for static, new in zip(self.statistics, statistics):  # a member that does not step keeps its own
            static.copy_(torch.where(per_member(active, static) > 0, new.to(static.dtype), static))
        if self.offsets is not None:
            grads = [g + o for g, o in zip(grads, self.offsets)]
        self.optimizer.step(self.params, [g.float() for g in grads], active, measured)
        self.loss_sum.add_(losses.detach().float() * last)
        self.counter.add_(1)
        self.draw_position.add_(1)

    @property
    def window(self) -> int:
        """Steps per window: with draws, as many as the draw buffers hold; else the whole plan."""
        return self.DRAW_WINDOW if self.draws is not None else max(self.num_steps, 1)

    def windows(self, end: Optional[int] = None) -> list[tuple[int, int]]:
        """(first step, steps) of each window of the plan, up to step ``end`` (default: its end)."""
        end = self.num_steps if end is None else min(end, self.num_steps)
        return [(start, min(self.window, end - start)) for start in range(0, end, self.window)]

    def without_finished(self, keep: Sequence[int], at: int, template: nn.Module, members: Sequence[Member],
                         now: Sequence[dict[str, Tensor]], use_graph: bool) -> "CohortRunner":
        """A runner of the members ``keep`` (indices into this runner's) from this plan's step ``at``
        on, where this one stopped: their parameters, running statistics, optimizer state, loss
        sums and draws go on from here (``members``: this runner's, for the constants and
        gradient offsets, which do not change while it trains; ``now``: its ``member_params()``)."""
        kept = [Member({n: now[m][n] for n in self.state_names}, members[m].consts, members[m].grad_offset) for m in keep]
        plan = self.host_plan
        rest = BatchPlan(plan.index[at:, keep], plan.weight[at:, keep], plan.active[at:, keep],
                         plan.last_epoch[at:, keep], [plan.steps[m] for m in keep],
                         [plan.last_epoch_batches[m] for m in keep])
        draws = None if self.draws is None else StepDraws([self.draws.sources[m] for m in keep], self.draws.static)
        chosen = (type(self.optimizer), self.optimizer.settings)
        runner = CohortRunner(template, self.plugin, kept, rest, self.x, self.y, chosen, use_graph, draws,
                              self.optimizer.lr[keep].tolist(), self.compile_step)
        index = torch.tensor(list(keep), device=self.x.device)
        for theirs, ours in zip(self.optimizer.tensors(), runner.optimizer.tensors()):
            ours.copy_(theirs.index_select(0, index))
        runner.loss_sum.copy_(self.loss_sum.index_select(0, index))
        runner.first_step = self.first_step + at
        return runner

    def run_window(self, start: int, count: int, autocast: Callable) -> None:
        """Steps start .. start + count - 1 (the windows in order, after ``reset``)."""
        if self.draws is not None:
            self._fill_draws(start, count)
        if not self.use_graph:
            for _ in range(count):
                with autocast():
                    self._step()
            return
        if self.graph is None:
            self._capture(autocast)
        for _ in range(count):
            self.graph.replay()

    def run(self, autocast: Callable) -> None:
        """All of the plan's steps from a fresh optimizer state; with draws, a window of steps
        at a time (the host draws the next window while the device runs this one)."""
        self.reset()
        for start, count in self.windows():
            self.run_window(start, count, autocast)

    def _capture(self, autocast: Callable) -> None:
        state = (self.params + self.statistics + self.optimizer.tensors()
                 + [self.counter, self.loss_sum, self.draw_position])
        saved = [t.clone() for t in state]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(min(self.WARMUP_STEPS, self.num_steps, self.DRAW_WINDOW)):  # never past the plan's end
                with autocast():  # (a compiled step compiles in the first)
                    self._step()
        torch.cuda.current_stream().wait_stream(side)
        for t, v in zip(state, saved):
            t.copy_(v)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            with autocast():
                self._step()

    def member_params(self) -> list[dict[str, Tensor]]:
        """Each member's state dict: its parameters and running statistics, in its own order; and
        what its optimizer hands back (``MemberOptimizer.outputs``: a probe's sums), if anything."""
        cpu = dict(zip(self.names + self.statistics_names, [t.detach().cpu() for t in self.params + self.statistics]))
        outputs = {n: t.detach().cpu() for n, t in self.optimizer.outputs(self.names).items()}
        return [{**{n: cpu[n][m].clone() for n in self.state_names}, **{n: t[m].clone() for n, t in outputs.items()}}
                for m in range(self.params[0].shape[0])]

    def member_optimizer_states(self) -> list[dict[str, Tensor]]:
        """Each member's optimizer state, ``<parameter name>/<key>`` -> tensor on the CPU."""
        return self.optimizer.member_states(self.names)

    def member_losses(self, streams: list[int]) -> list[float]:
        """Each member's mean loss over its last epoch's batches (NaN without any: a per-client fit
        that records no loss reports NaN too)."""
        sums = self.loss_sum.cpu().tolist()
        return [s / self.plan.last_epoch_batches[k] if self.plan.last_epoch_batches[k] else float("nan")
                for s, k in zip(sums, streams)]


class StepWindows:
    """The cohort Trainer's data: one batch per window of the plan's steps, (first step, steps);
    each training step of the ``CohortModule`` runs that window for every member."""

    def __init__(self, runner: CohortRunner, end: Optional[int] = None) -> None:
        self.windows = runner.windows(end)

    def __iter__(self):
        return iter(self.windows)

    def __len__(self) -> int:
        return len(self.windows)


def cohort_module(runner: CohortRunner, fresh: bool = True):
    """The LightningModule a cohort's Trainer fits, with the Trainer's precision, device and
    callbacks (e.g. the client time budget, checked after every window): each training step
    runs one window of the plan (manual optimisation: the member optimizers live in the runner),
    from a fresh optimizer state, or (``fresh`` False) from the one the runner holds."""
    from lightning.pytorch import LightningModule

    class CohortModule(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.runner = runner

        def on_train_epoch_start(self) -> None:
            if fresh:
                runner.reset()

        def training_step(self, batch, batch_idx):
            start, count = batch
            device = runner.x.device.type
            # the Trainer's precision (bf16-mixed: autocast is on here); the cache is off so that
            # a CUDA graph does not capture a cast of weights that later change
            enabled = torch.is_autocast_enabled(device)
            dtype = torch.get_autocast_dtype(device)
            runner.run_window(int(start), int(count),
                              lambda: torch.autocast(device, dtype=dtype, enabled=enabled, cache_enabled=False))
            return None

        def configure_optimizers(self):
            return None

    return CohortModule()


def epoch_progress(clients: Sequence[int], plan: BatchPlan, epochs: Sequence[int],
                   reporters: Sequence[Optional[Callable[[int, int, int], None]]]) -> list:
    """A Lightning callback reporting each client's finished local epochs as the cohort's windows
    of steps end (``reporter(client id, epochs done, epochs)``, as the per-client engine reports
    after every epoch); none when no client has a reporter. A window of a plan without draws is
    the whole plan, so such a cohort reports once, at its end."""
    if not any(reporters):
        return []
    from lightning.pytorch.callbacks import Callback

    class EpochProgress(Callback):
        def __init__(self) -> None:
            self.reported = [0] * len(clients)
            self.first_step = 0  # the plan's step at which the runner being fitted starts

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
            start, count = batch
            done = self.first_step + int(start) + int(count)
            for k, (client, steps, e, report) in enumerate(zip(clients, plan.steps, epochs, reporters)):
                finished = min(e, done * e // steps) if steps else e
                if report is not None and finished > self.reported[k]:
                    self.reported[k] = finished
                    report(client, finished, e)

    return [EpochProgress()]


def compaction_points(active: Tensor) -> list[tuple[int, list[int]]]:
    """Where a cohort of the plan's ``active`` (steps, members) drops its finished members: each
    (step, the members still stepping at or after it), at multiples of ``COMPACT_EVERY`` where at
    most ``COMPACT_SHARE`` of the members then in the cohort still step and at least
    ``COMPACT_MIN_STEPS`` steps are left."""
    steps, members = active.shape
    if steps < COMPACT_EVERY + COMPACT_MIN_STEPS:  # most cohorts (every round of a multi-round run): none
        return []
    # one past each member's last step (0: none)
    ends = ((active > 0) * torch.arange(1, steps + 1).unsqueeze(1)).amax(0).tolist()
    points, current = [], list(range(members))
    for at in range(COMPACT_EVERY, steps - COMPACT_MIN_STEPS + 1, COMPACT_EVERY):
        still = [m for m in current if ends[m] > at]
        if len(still) < len(current) and len(still) <= COMPACT_SHARE * len(current):
            points.append((at, still))
            current = still
    return points


class CohortTrainer:
    """Trains groups of stackable tasks; remembers the runner of each cohort shape so that a
    later round of the same shapes replays the captured graph."""

    MAX_GRAPHS = 8  # cohort shapes whose captured graphs are kept (GPU memory)

    def __init__(self, ctx, make_trainer: Callable, fit_callbacks: Callable[[], list] = list) -> None:
        # fit_callbacks: a fresh set of Lightning callbacks per cohort fit (a time budget starts then)
        self.ctx, self.make_trainer, self.fit_callbacks = ctx, make_trainer, fit_callbacks
        self._runners: dict[tuple, CohortRunner] = {}

    def plugin_for(self, task) -> Optional[tuple[CohortPlugin, tuple]]:
        from fl_lightning.plugins import client_plugin

        plugin = client_plugin(task.kind).cohort
        chosen = plugin.optimizer(task) if plugin is not None else None
        if chosen is None or not stacks(plugin.network(self.ctx, task), plugin, chosen[0]):
            return None
        key = plugin.stack_key(task)
        if key is None:
            return None
        kind, settings = chosen  # each member steps with its own task's learning rate
        return plugin, (task.kind, key, (kind, kind.shared_settings(settings)))

    def train(self, plugin: CohortPlugin, entries: Sequence[tuple], round_index: int, seeds: Sequence[int],
              epochs: Sequence[int], client_states: Sequence[dict],
              batch_sizes: Optional[Sequence[int]] = None,
              reporters: Optional[Sequence[Optional[Callable[[int, int, int], None]]]] = None) -> list:
        """``entries``: (task, local indices), ``client_states`` what each client kept,
        ``batch_sizes`` each entry's B (default: the run's), ``reporters`` each entry's
        ``on_epoch(client id, epochs done, epochs)`` (default: the run's ``ctx.on_epoch``); the
        results in the same order."""
        members, member_entry = [], []  # member_entry[m]: the entry whose client member m trains on
        keeping = any(task.optimizer.keep_state for task, _ in entries)
        for k, (task, _) in enumerate(entries):
            own = plugin.members(task, client_states[k])
            if task.optimizer.keep_state:
                for member, state in zip(own, kept_member_states(plugin, task, own, client_states[k])):
                    member.optimizer_state = state
            members += own
            member_entry += [k] * len(own)
        plan = build_plan([torch.from_numpy(np.asarray(idx)) for _, idx in entries], seeds,
                          self.ctx.federation.batch_size if batch_sizes is None else batch_sizes, epochs)
        network = plugin.network(self.ctx, entries[0][0])  # one stack key: one architecture
        if has_batch_norm(network):  # a lone sample: skipped, as MultiClassClassifier skips it
            plan = without_steps(plan, ~normalisable(plan.weight.sum(-1)))
        member_plan = BatchPlan(plan.index[:, member_entry], plan.weight[:, member_entry], plan.active[:, member_entry],
                                plan.last_epoch[:, member_entry], [plan.steps[k] for k in member_entry],
                                [plan.last_epoch_batches[k] for k in member_entry])
        optimizer = plugin.optimizer(entries[0][0])  # every setting but lr: the cohort's (plugin_for)
        lr = [entries[k][0].optimizer.lr for k in member_entry]
        draws = plugin.step_draws(self.ctx, [task for task, _ in entries], list(seeds), member_entry)
        layers = dropout_layers(network, tuple(self.ctx.x.shape[1:]))
        if layers:  # each member drops what its client alone drops
            masks = [DropoutMasks(layers, seeds[k]) for k in member_entry]
            draws = StepDraws(masks) if draws is None else draws.joined(masks)
        key = (id(plugin), CohortRunner.shape_key(members, member_plan, optimizer))
        runner = self._runners.pop(key, None)
        if runner is not None and runner.fits(member_plan):
            runner.load(members, member_plan, draws, lr)
        else:
            runner = CohortRunner(network, plugin, members, member_plan, self.ctx.x, self.ctx.y, optimizer,
                                  self.ctx.trainer.cuda_graph, draws, lr, self.ctx.trainer.compile)
        if runner.use_graph:  # a graph is worth keeping (most recently used last); an eager runner is cheap
            self._runners[key] = runner
            while len(self._runners) > self.MAX_GRAPHS:
                self._runners.pop(next(iter(self._runners)))
        reporters = [self.ctx.on_epoch] * len(entries) if reporters is None else reporters
        progress = epoch_progress([task.client_id for task, _ in entries], plan, epochs, reporters)
        callbacks = [*self.fit_callbacks(), *progress]  # one set for every runner: one time budget
        params, losses, states = [None] * len(members), [None] * len(members), [None] * len(members)
        in_runner, at = list(range(len(members))), 0  # the members the runner trains, from step ``at`` of the plan
        runner_members = list(members)
        for end, still in [*compaction_points(member_plan.active), (member_plan.num_steps, [])]:
            for callback in progress:
                callback.first_step = at
            self.make_trainer(self.ctx, 1, callbacks).fit(cohort_module(runner, fresh=at == 0),
                                                          train_dataloaders=StepWindows(runner, end - at))
            keep = [in_runner.index(m) for m in still]
            done = [k for k in range(len(in_runner)) if k not in keep]
            now, now_losses = runner.member_params(), runner.member_losses(list(range(len(in_runner))))
            now_states = runner.member_optimizer_states() if keeping else [None] * len(in_runner)
            for k in done:  # trained to their end: their results are final
                params[in_runner[k]], losses[in_runner[k]], states[in_runner[k]] = now[k], now_losses[k], now_states[k]
            if keep:
                runner = runner.without_finished(keep, end - at, network, runner_members, now, self.ctx.trainer.cuda_graph)
                runner_members = [runner_members[k] for k in keep]
                in_runner, at = list(still), end
        results, start = [], 0
        for k, (task, idx) in enumerate(entries):
            count = member_entry.count(k)
            result = plugin.result(task, params[start:start + count], losses[start:start + count],
                                   plan.steps[k], len(idx), client_states[k])
            if task.optimizer.keep_state:
                kept = kept_state(task.kind, task.classes,
                                  member_slots(plugin.member_slices(task), states[start:start + count]))
                result.client_state = merged(task.kind, result.client_state, kept)
            results.append(result)
            start += count
        return results


def kept_member_states(plugin: CohortPlugin, task, members: Sequence[Member], client_state: dict) -> list[dict]:
    """Each member's share of the optimizer state its client kept for ``task``
    (callbacks/optimizer_state.py's layout, split as ``plugin.member_slices`` says), checked
    against the member's parameters; empty where the client kept none."""
    kept = kept_for(task.kind, task.classes, client_state)
    check_kept_names(kept, [name for member in members for name in member.params])
    return [{f"{name}/{key}": value for name, tensor in member.params.items()
             for key, value in slot_state(kept, name, index, tensor.shape).items()}
            for member, index in zip(members, plugin.member_slices(task))]


def member_slots(slices: Sequence[Optional[int]], states: Sequence[dict[str, Tensor]]) -> list:
    """The members' optimizer states (``<parameter name>/<key>``) as the kept layout's slots."""
    slots = []
    for index, state in zip(slices, states):
        by_name: dict[str, dict[str, Tensor]] = {}
        for full, value in state.items():
            name, key = full.rsplit("/", 1)
            by_name.setdefault(name, {})[key] = value
        slots += [(name, index, own) for name, own in by_name.items()]
    return slots
