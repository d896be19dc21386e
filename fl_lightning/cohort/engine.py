"""The cohort engine: a round's stackable client tasks trained as one vectorised model.

Members (one model each: a FedAvg client, a FedOVA (client, detector) pair) are stacked
along a leading dimension and trained by one Lightning ``Trainer`` in one fit. Every step
runs ``vmap(grad(member loss))`` over all members, each on a batch of its own client's data
(``plan.BatchPlan``), then the per-member optimizer (``optim.StackedOptimizer``); members
whose local training has ended are masked. On a GPU the step is captured once in a CUDA
graph and replayed (shapes are static within a round; a cohort of the same shapes in a later
round reuses the graph), and the data stay on the device: a round costs the arithmetic.
"""

from __future__ import annotations

import copy
from typing import Callable, Optional, Sequence

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

from fl_lightning.cohort.members import CohortPlugin, Member, StepStreams
from fl_lightning.cohort.optim import STACKED_OPTIMIZERS, StackedOptimizer
from fl_lightning.cohort.plan import BatchPlan, build_plan
from fl_lightning.config import OptimizerConfig


def _stack(dicts: Sequence[dict[str, Tensor]], device) -> list[Tensor]:
    names = list(dicts[0])
    return [torch.stack([d[n] for d in dicts]).to(device=device, dtype=torch.float32 if dicts[0][n].is_floating_point()
                                                   else dicts[0][n].dtype) for n in names]


class CohortRunner:
    """The static tensors of one cohort shape (parameters, optimizer state, batch plan) and
    its training step, eager or replayed from a captured CUDA graph."""

    WARMUP_STEPS = 3  # eager steps on a side stream before capture (cuDNN/cuBLAS set-up)

    def __init__(self, template: nn.Module, plugin: CohortPlugin, members: list[Member], plan: BatchPlan,
                 x: Tensor, y: Tensor, optimizer: OptimizerConfig, use_graph: bool,
                 streams: Optional[StepStreams] = None) -> None:
        device = x.device
        self.x, self.y, self.plugin, self.streams = x, y, plugin, streams
        self.input_names: list[str] = []
        self.names = list(members[0].params)
        self.const_names = list(members[0].consts)
        self.params = _stack([m.params for m in members], device)
        self.consts = _stack([m.consts for m in members], device) if self.const_names else []
        self.offsets = (_stack([m.grad_offset for m in members], device) if members[0].grad_offset is not None
                        else None)
        self.plan = plan.to(device)  # static buffers: a later plan of as many steps or fewer fits in them
        self.num_steps = plan.num_steps
        self.optimizer = StackedOptimizer(optimizer, self.params)
        self.counter = torch.zeros(1, dtype=torch.long, device=device)
        self.loss_sum = torch.zeros(len(members), device=device)
        self.use_graph = use_graph and device.type == "cuda" and streams is None  # host draws every step
        self.graph: Optional[torch.cuda.CUDAGraph] = None
        meta = copy.deepcopy(template).to("meta")  # lends its forward code; its own tensors cost nothing

        def forward(params: dict[str, Tensor], inputs: Tensor, part: str = "") -> Tensor:
            if not part:
                return functional_call(meta, params, (inputs,))
            prefix = part + "."
            own = {n[len(prefix):]: t for n, t in params.items() if n.startswith(prefix)}
            return functional_call(meta.get_submodule(part), own, (inputs,))

        static = streams.static if streams is not None else {}

        def member_loss(params, consts, xb, yb, wb, inputs):
            return plugin.loss(forward, dict(zip(self.names, params)), dict(zip(self.const_names, consts)), xb, yb, wb,
                               **static, **dict(zip(self.input_names, inputs)))

        self.grad_fn = vmap(grad_and_value(member_loss))

    @staticmethod
    def shape_key(members: list[Member], plan: BatchPlan, optimizer: OptimizerConfig) -> tuple:
        """Cohorts with equal keys can share one runner (and its captured graph)."""
        first = members[0]
        return (len(members), tuple((n, tuple(t.shape)) for n, t in first.params.items()),
                tuple((n, tuple(t.shape)) for n, t in first.consts.items()), first.grad_offset is not None,
                tuple(plan.index.shape[1:]), (optimizer.name, optimizer.lr, optimizer.momentum, optimizer.weight_decay))

    def fits(self, plan: BatchPlan) -> bool:
        return plan.num_steps <= self.plan.num_steps

    def load(self, members: list[Member], plan: BatchPlan) -> None:
        """A new round's members and plan into the same static tensors (the graph reads them);
        the plan may be shorter than the buffers (the rest is never reached)."""
        device = self.x.device
        for static, new in zip(self.params, _stack([m.params for m in members], device)):
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
        for t in self.optimizer.tensors():
            t.zero_()
        self.counter.zero_()
        self.loss_sum.zero_()

    def step(self) -> None:
        s = self.counter
        index = self.plan.index.index_select(0, s).squeeze(0)  # (members, B)
        weight = self.plan.weight.index_select(0, s).squeeze(0)
        active = self.plan.active.index_select(0, s).squeeze(0)
        last = self.plan.last_epoch.index_select(0, s).squeeze(0)
        xb, yb = self.x[index], self.y[index]
        inputs = self.streams.inputs(xb, yb, weight, active) if self.streams is not None else {}
        self.input_names = list(inputs)
        grads, losses = self.grad_fn(tuple(self.params), tuple(self.consts), xb, yb, weight, tuple(inputs.values()))
        if self.offsets is not None:
            grads = [g + o for g, o in zip(grads, self.offsets)]
        self.optimizer.step(self.params, [g.float() for g in grads], active)
        self.loss_sum.add_(losses.detach().float() * last)
        self.counter.add_(1)

    def run(self, autocast: Callable) -> None:
        """All of the plan's steps from a fresh optimizer state."""
        self.reset()
        steps = self.num_steps
        if not self.use_graph:
            for _ in range(steps):
                with autocast():
                    self.step()
            return
        if steps == 0:
            return
        if self.graph is None:
            self._capture(autocast)
        for _ in range(steps):
            self.graph.replay()

    def _capture(self, autocast: Callable) -> None:
        state = self.params + self.optimizer.tensors() + [self.counter, self.loss_sum]
        saved = [t.clone() for t in state]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(min(self.WARMUP_STEPS, self.num_steps)):  # never past the plan's end
                with autocast():
                    self.step()
        torch.cuda.current_stream().wait_stream(side)
        for t, v in zip(state, saved):
            t.copy_(v)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            with autocast():
                self.step()

    def member_params(self) -> list[dict[str, Tensor]]:
        cpu = [p.detach().cpu() for p in self.params]
        return [{n: t[m].clone() for n, t in zip(self.names, cpu)} for m in range(cpu[0].shape[0])]

    def member_losses(self, streams: list[int]) -> list[float]:
        """Each member's mean loss over its last epoch's batches."""
        sums = self.loss_sum.cpu().tolist()
        return [s / max(self.plan.last_epoch_batches[k], 1) for s, k in zip(sums, streams)]


class _OneBatch:
    """The Trainer's "dataloader": one batch, the round's whole plan."""

    def __iter__(self):
        yield torch.zeros(1)

    def __len__(self) -> int:
        return 1


def cohort_module(runner: CohortRunner):
    """The LightningModule a cohort's Trainer fits: one training step runs the whole plan
    (manual optimisation: the member optimizers live in the runner)."""
    from lightning.pytorch import LightningModule

    class CohortModule(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.runner = runner

        def training_step(self, batch, batch_idx):
            device = runner.x.device.type
            # the Trainer's precision (bf16-mixed: autocast is on here); the cache is off so that
            # a CUDA graph does not capture a cast of weights that later change
            enabled = torch.is_autocast_enabled(device)
            dtype = torch.get_autocast_dtype(device)
            runner.run(lambda: torch.autocast(device, dtype=dtype, enabled=enabled, cache_enabled=False))
            return None

        def configure_optimizers(self):
            return None

    return CohortModule()


class CohortTrainer:
    """Trains groups of stackable tasks; remembers the runner of each cohort shape so that a
    later round of the same shapes replays the captured graph."""

    MAX_GRAPHS = 8  # cohort shapes whose captured graphs are kept (GPU memory)

    def __init__(self, ctx, make_trainer: Callable) -> None:
        self.ctx, self.make_trainer = ctx, make_trainer
        self._runners: dict[tuple, CohortRunner] = {}

    def plugin_for(self, task) -> Optional[tuple[CohortPlugin, tuple]]:
        from fl_lightning.plugins import client_plugin

        plugin = client_plugin(task.kind).cohort
        if plugin is None or any(True for _ in self.ctx.template.buffers()):
            return None  # batch norm's running statistics are not vectorised: per client
        key = plugin.stack_key(task)
        if key is None or task.optimizer.name not in STACKED_OPTIMIZERS:
            return None
        o = task.optimizer
        return plugin, (task.kind, key, (o.name, o.lr, o.momentum, o.weight_decay))

    def train(self, plugin: CohortPlugin, entries: Sequence[tuple], round_index: int, seeds: Sequence[int],
              epochs: Sequence[int], client_states: Sequence[dict]) -> list:
        """``entries``: (task, local indices), ``client_states`` what each client kept; the
        results in the same order."""
        members, member_entry = [], []  # member_entry[m]: the entry whose client member m trains on
        for k, (task, _) in enumerate(entries):
            own = plugin.members(task, client_states[k])
            members += own
            member_entry += [k] * len(own)
        plan = build_plan([torch.from_numpy(np.asarray(idx)) for _, idx in entries], seeds,
                          self.ctx.federation.batch_size, epochs)
        member_plan = BatchPlan(plan.index[:, member_entry], plan.weight[:, member_entry], plan.active[:, member_entry],
                                plan.last_epoch[:, member_entry], plan.steps, plan.last_epoch_batches)
        optimizer = entries[0][0].optimizer
        streams = plugin.step_streams(self.ctx, [task for task, _ in entries], list(seeds), member_entry)
        key = (id(plugin), CohortRunner.shape_key(members, member_plan, optimizer))
        runner = self._runners.pop(key, None) if streams is None else None
        if runner is not None and runner.fits(member_plan):
            runner.load(members, member_plan)
        else:
            runner = CohortRunner(self.ctx.template, plugin, members, member_plan, self.ctx.x, self.ctx.y, optimizer,
                                  self.ctx.trainer.cuda_graph, streams)
        if runner.use_graph:  # a graph is worth keeping (most recently used last); an eager runner is cheap
            self._runners[key] = runner
            while len(self._runners) > self.MAX_GRAPHS:
                self._runners.pop(next(iter(self._runners)))
        trainer = self.make_trainer(self.ctx, 1)
        trainer.fit(cohort_module(runner), train_dataloaders=_OneBatch())
        params = runner.member_params()
        losses = runner.member_losses(member_entry)
        results, start = [], 0
        for k, (task, idx) in enumerate(entries):
            count = member_entry.count(k)
            results.append(plugin.result(task, params[start:start + count], losses[start:start + count],
                                         plan.steps[k], len(idx), client_states[k]))
            start += count
        return results
