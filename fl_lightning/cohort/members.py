"""How a client task joins a cohort: the plug-in protocol (a client plug-in's ``cohort``).

A client plug-in (one per task kind, defined next to the LightningModule that trains that
kind alone) says which tasks stack together, splits a task into members (one model each,
with the constants of its loss), gives one member's loss on one batch (a pure function that
the engine vectorises over members: the algorithm's one objective, which its LightningModule
calls too) and turns the trained members back into the client's result; a loss that draws
random numbers every step (FedOV's outliers) also gives the ``StepDraws`` that draw them for
each member from its client's own generators. The engine knows no algorithm: it only calls
these methods. What belongs to the network rather than the loss (batch norm's running
statistics, dropout's masks) the engine handles itself, for a plug-in that says its loss may
run such a network (``batch_norm_and_dropout``).

How members step is the task's optimizer by default (``optimizer``: the stacked one of its
``optimizer.name``, cohort/optim.py). An optimizer that reads each sample's data loss
(FIM-L-BFGS's diagonal Fisher) stacks only for a plug-in that gives it (``sample_losses``);
a task that measures instead of training (FIM-L-BFGS's curvature probe) names its own.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Hashable, Optional, Protocol, Sequence

import torch
from torch import Tensor, nn

from fl_lightning.cohort.optim import OptimizerChoice, stacked_choice
from fl_lightning.functional import Forward, weighted_mean  # noqa: F401 (the plug-ins' vocabulary)
from fl_lightning.messages import ClientResult, ClientTask


@dataclass
class Member:
    """One model trained in a cohort, on the data stream of its task's client."""

    #: its network's state-dict entries: the parameters the loss differentiates and, with batch
    #: norm, the running statistics the engine carries from step to step (``result`` gets both back)
    params: dict[str, Tensor]
    #: tensors its loss reads besides the batch (a detector's class, FedProx's starting point);
    #: the same keys for every member of one cohort
    consts: dict[str, Tensor] = field(default_factory=dict)
    #: added to the gradient before every optimizer step (SCAFFOLD's c - c_i)
    grad_offset: Optional[dict[str, Tensor]] = None
    #: the optimizer state its fit starts from (``optimizer.keep_state``): ``<parameter name>/<key>``
    #: -> tensor, as ``MemberOptimizer.member_states`` hands it back; None: afresh
    optimizer_state: Optional[dict[str, Tensor]] = None


class CohortPlugin(ABC):
    #: whether ``loss`` may run a network with batch norm or dropout: it calls ``forward`` on the
    #: batch ``x`` alone (batch norm's statistics are those of the batch's real samples, and each
    #: dropout layer applies the member's drawn masks row by row); False: such tasks train per client
    batch_norm_and_dropout: bool = False
    #: whether ``sample_losses`` is given: optimizers that read each sample's data loss
    #: (``MemberOptimizer.uses_sample_losses``) stack this plug-in's tasks only then
    gives_sample_losses: bool = False

    def network(self, ctx, task: ClientTask) -> nn.Module:
        """The architecture ``task`` trains (only its code and shapes are used): the run's by default."""
        return ctx.template

    @abstractmethod
    def stack_key(self, task: ClientTask) -> Optional[Hashable]:
        """Tasks with equal keys train in one cohort; None: this task trains per client."""

    @abstractmethod
    def members(self, task: ClientTask, client_state: dict[str, Tensor]) -> list[Member]:
        """The task's members, in the order ``result`` receives them back (``client_state``:
        what the client kept from its earlier rounds)."""

    def member_slices(self, task: ClientTask) -> Optional[list[Optional[int]]]:
        """Where each member's parameters sit in the task's exchanged state (``task.params``), in
        ``members``' order: g, the g-th copy along a stacked leading dimension, or None, the
        whole state. A client keeps its optimizer state in that layout (``optimizer.keep_state``,
        callbacks/optimizer_state.py). None (the default): not given, and tasks whose optimizer
        keeps its state train per client."""
        return None

    def member_count(self, task: ClientTask) -> int:
        """How many members ``task`` brings (to chunk cohorts before building them)."""
        return len(self.members(task, {}))

    def step_draws(self, ctx, tasks: list[ClientTask], seeds: list[int],
                   member_tasks: list[int]) -> Optional["StepDraws"]:
        """Every member's per-step random draws (``member_tasks[m]``: the index in ``tasks`` of
        member m's task; ``seeds``: each task's client seed), e.g. random outliers drawn as each
        client alone draws them; None (the default): the loss draws nothing."""
        return None

    def optimizer(self, task: ClientTask) -> Optional[OptimizerChoice]:
        """How ``task``'s members step, as (member optimizer class, its settings): by default the
        task's own optimizer, if it stacks (``cohort.optim.STACKED_OPTIMIZERS``); None: per client."""
        return stacked_choice(task.optimizer)

    def sample_losses(self, forward: Forward, params: dict[str, Tensor], consts: dict[str, Tensor], x: Tensor,
                      y: Tensor) -> Tensor:
        """Each sample's data loss (B,) on a batch: the loss's data term without its
        regularisers (FedProx's, FedDANE's), the one whose per-sample gradients an optimizer may
        read (FIM-L-BFGS's diagonal Fisher); called under ``torch.func.vmap`` on one-sample
        batches. Only with ``gives_sample_losses``."""
        raise NotImplementedError(f"{type(self).__name__} gives no per-sample losses")

    @abstractmethod
    def loss(self, forward: Forward, params: dict[str, Tensor], consts: dict[str, Tensor], x: Tensor, y: Tensor,
             weight: Tensor, **inputs) -> Tensor:
        """One member's training loss on one padded batch (called under ``torch.func.vmap``);
        ``inputs``: the ``StepDraws``' static settings and this member's draws for this step."""

    @abstractmethod
    def result(self, task: ClientTask, params: list[dict[str, Tensor]], losses: list[float], steps: int,
               num_samples: int, client_state: dict[str, Tensor]) -> ClientResult:
        """The client's result from its members' final parameters and last-epoch mean losses
        (``params[m]``: member m's state dict and, from a member optimizer that hands tensors
        back, e.g. a probe's sums, those under its own names: ``MemberOptimizer.outputs``)."""


class DrawSource(Protocol):
    """One member's random draws, step after step (e.g. fedov.draws.OpenSetDraws)."""

    def take(self, step: int, n: int, width: int) -> dict[str, Tensor]:
        """Step ``step``'s draws for ``n`` real samples padded to ``width``: the same names and
        shapes at every step; steps are taken in order."""


def take_steps(source: DrawSource, start: int, sizes: Sequence[int], width: int) -> list[dict[str, Tensor]]:
    """Steps start, start + 1, ...'s draws of ``source``: its own ``take_steps`` where it has one
    (drawing a window at once, e.g. OpenSetDraws), else ``take`` step after step."""
    if hasattr(source, "take_steps"):
        return source.take_steps(start, sizes, width)
    return [source.take(start + s, n, width) for s, n in enumerate(sizes)]


class StepDraws:
    """What a cohort's loss reads besides the batch that is random at every step: ``sources[m]``
    draws member m's, from its own client's generators, in the order of its steps; ``static``:
    the loss's settings (plain Python values, the same for every member). The engine asks for a
    window of steps at a time and copies it into device buffers that the step reads by index,
    so the step keeps static shapes (a CUDA graph replays it) while the host draws the next window."""

    def __init__(self, sources: Sequence[DrawSource], static: Optional[dict] = None) -> None:
        self.sources, self.static = list(sources), dict(static or {})

    def joined(self, sources: Sequence[DrawSource]) -> "StepDraws":
        """These draws and ``sources[m]``'s for every member m (names of their own, e.g. dropout masks)."""
        return StepDraws([JointSource(own, more) for own, more in zip(self.sources, sources)], self.static)

    def window(self, start: int, weight: Tensor, active: Tensor) -> dict[str, Tensor]:
        """Steps start .. start + len(weight) - 1 for every member: tensors (steps, members, ...).
        ``weight`` (steps, members, B) on the CPU: each member's real samples; ``active`` (steps,
        members): whether it steps. A member that does not step gets zeros (its step is masked)."""
        steps, members, width = weight.shape
        rows: list[list[Optional[dict[str, Tensor]]]] = [[None] * members for _ in range(steps)]
        sizes = weight.sum(2).long().tolist()
        stepping = (active > 0).tolist()
        for m in range(members):
            s = 0
            while s < steps:  # each run of consecutive steps the member takes, drawn at once
                if not stepping[s][m]:
                    s += 1
                    continue
                end = s
                while end < steps and stepping[end][m]:
                    end += 1
                drawn = take_steps(self.sources[m], start + s, [sizes[t][m] for t in range(s, end)], width)
                for t, d in zip(range(s, end), drawn):
                    rows[t][m] = d
                s = end
        blank = next(({k: torch.zeros_like(v) for k, v in d.items()} for row in rows for d in row if d is not None), None)
        if blank is None:
            raise ValueError(f"no member steps in steps {start}..{start + steps - 1}")
        return {k: torch.stack([torch.stack([(d if d is not None else blank)[k] for d in row]) for row in rows])
                for k in blank}


class JointSource:
    """Two sources of one member drawn together, step after step: their draws under their own names."""

    def __init__(self, first: DrawSource, second: DrawSource) -> None:
        self.first, self.second = first, second

    def take(self, step: int, n: int, width: int) -> dict[str, Tensor]:
        return self.take_steps(step, [n], width)[0]

    def take_steps(self, start: int, sizes: Sequence[int], width: int) -> list[dict[str, Tensor]]:
        joint = []
        for first, second in zip(take_steps(self.first, start, sizes, width), take_steps(self.second, start, sizes, width)):
            if set(first) & set(second):
                raise ValueError(f"two draw sources of one member both draw {sorted(set(first) & set(second))}")
            joint.append({**first, **second})
        return joint
