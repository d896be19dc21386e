"""How a client task joins a cohort: the plug-in protocol (a client plug-in's ``cohort``).

A client plug-in (one per task kind, defined next to the LightningModule that trains that
kind alone) says which tasks stack together, splits a task into members (one model each,
with the constants of its loss), gives one member's loss on one batch (a pure function that
the engine vectorises over members) and turns the trained members back into the client's
result; a loss that draws random numbers every step (FedOV's outliers) also gives the
``StepStreams`` that draw them per member on the host. The engine knows no algorithm: it only
calls these methods.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, Hashable, Optional

from torch import Tensor

from fl_lightning.messages import ClientResult, ClientTask

#: ``forward(params, x, part="")``: the run's architecture applied with one member's parameters
#: (``part``: only that submodule, e.g. "features", with the parameters under its prefix)
Forward = Callable[..., Tensor]


@dataclass
class Member:
    """One model trained in a cohort, on the data stream of its task's client."""

    params: dict[str, Tensor]
    #: tensors its loss reads besides the batch (a detector's class, FedProx's starting point);
    #: the same keys for every member of one cohort
    consts: dict[str, Tensor] = field(default_factory=dict)
    #: added to the gradient before every optimizer step (SCAFFOLD's c - c_i)
    grad_offset: Optional[dict[str, Tensor]] = None


def weighted_mean(per_sample: Tensor, weight: Tensor) -> Tensor:
    """The mean over a batch's real samples (padding has weight 0): equal to the plain mean
    of the unpadded batch, which is what the member would compute alone."""
    return (per_sample * weight).sum() / weight.sum().clamp(min=1)


class CohortPlugin(ABC):
    @abstractmethod
    def stack_key(self, task: ClientTask) -> Optional[Hashable]:
        """Tasks with equal keys train in one cohort; None: this task trains per client."""

    @abstractmethod
    def members(self, task: ClientTask, client_state: dict[str, Tensor]) -> list[Member]:
        """The task's members, in the order ``result`` receives them back (``client_state``:
        what the client kept from its earlier rounds)."""

    def member_count(self, task: ClientTask) -> int:
        """How many members ``task`` brings (to chunk cohorts before building them)."""
        return len(self.members(task, {}))

    def step_streams(self, ctx, tasks: list[ClientTask], seeds: list[int],
                     member_tasks: list[int]) -> Optional["StepStreams"]:
        """Per-step inputs drawn on the host for every member (``member_tasks[m]``: the index in
        ``tasks`` of member m's task; ``seeds``: each task's client seed), e.g. random outliers
        drawn as each client alone would draw them; None (the default): the loss needs none."""
        return None

    @abstractmethod
    def loss(self, forward: Forward, params: dict[str, Tensor], consts: dict[str, Tensor], x: Tensor, y: Tensor,
             weight: Tensor, **inputs) -> Tensor:
        """One member's training loss on one padded batch (called under ``torch.func.vmap``);
        ``inputs``: the ``StepStreams``' static settings and this member's per-step tensors."""

    @abstractmethod
    def result(self, task: ClientTask, params: list[dict[str, Tensor]], losses: list[float], steps: int,
               num_samples: int, client_state: dict[str, Tensor]) -> ClientResult:
        """The client's result from its members' final parameters and last-epoch mean losses."""


class StepStreams(ABC):
    """What a cohort's loss reads besides the batch that is drawn anew at every step, member by
    member, on the host (so the cohort's step runs eagerly: no CUDA graph)."""

    #: settings the loss reads (plain Python values, the same for every member)
    static: dict = {}

    @abstractmethod
    def inputs(self, x: Tensor, y: Tensor, weight: Tensor, active: Tensor) -> dict[str, Tensor]:
        """This step's tensors, one row per member: ``x``/``y``/``weight`` are the padded
        batches (members, B, ...), ``active`` whether each member takes this step."""
