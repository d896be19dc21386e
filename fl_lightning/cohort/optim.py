"""Per-member optimizers over stacked parameters (leading dim = member), with a step mask.

A member optimizer (``MemberOptimizer``) updates every member whose mask is 1 and leaves a
member whose mask is 0 exactly as it was, parameters and state: a member takes the steps it
would take alone, no more. Each member has its own learning rate (the runs of a stacked
sweep may differ in it). Every update is in place and of fixed shapes, so a CUDA graph can
capture it. An optimizer whose step needs more than the gradient says so: it reads a
statistic of the batch's per-sample data losses (``batch_statistic``, e.g. FIM-L-BFGS's
diagonal Fisher), which the engine computes per member inside the vectorised step from the
plug-in's ``CohortPlugin.sample_losses``; or, measuring instead of training, it needs no
gradient of the loss at all (``uses_gradient``) and hands sums back with the members'
parameters (``outputs``).

``StackedOptimizer`` is ``torch.optim.SGD``'s and ``torch.optim.Adam``'s arithmetic (L2
weight decay added to the gradient; SGD's momentum buffer starting at the first gradient;
Adam's bias correction with each member's own step count), applied to all members at once.
Others register under their ``optimizer.name`` beside the per-client optimizer they stack
(``register_stacked_optimizer``; FIM-L-BFGS's in algorithms/fimlbfgs/stacked.py).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Callable, ClassVar, Hashable, Optional, Sequence

import torch
from torch import Tensor

from fl_lightning.callbacks.optimizer_state import STEP  # Adam's step count, as torch.optim.Adam names it
from fl_lightning.config import OptimizerConfig

ADAM_BETAS = (0.9, 0.999)  # torch.optim.Adam's defaults, as the per-client engine uses them
ADAM_EPS = 1e-8


def per_member(mask: Tensor, like: Tensor) -> Tensor:
    return mask.view(-1, *([1] * (like.dim() - 1))).to(like.dtype)


class MemberOptimizer:
    """One optimizer per member over stacked parameters: ``step(params, grads, mask,
    statistic)`` updates every member whose mask is 1. ``settings``: what the class takes (an
    ``OptimizerConfig`` for a training optimizer); ``lr``: each member's learning rate
    (default: ``settings.lr`` for all), a tensor a later round may overwrite."""

    #: whether ``step`` reads, besides the gradient, ``batch_statistic`` of the step's batch
    uses_sample_losses: ClassVar[bool] = False
    #: whether ``step`` reads the gradient of the plug-in's loss (False: the engine only evaluates it)
    uses_gradient: ClassVar[bool] = True

    def __init__(self, settings: Any, params: Sequence[Tensor], lr: Optional[Sequence[float]] = None) -> None:
        members = params[0].shape[0]
        rates = [getattr(settings, "lr", 1.0)] * members if lr is None else list(lr)  # a probe's settings have none
        if len(rates) != members:
            raise ValueError(f"{len(rates)} learning rates for {members} members")
        for rate in rates:
            if rate <= 0:
                raise ValueError(f"optimizer.lr={rate} must be > 0")
        self.settings = settings
        self.lr = torch.tensor(rates, dtype=torch.float32, device=params[0].device)

    @staticmethod
    def shared_settings(settings: Any) -> Hashable:
        """What members must share to stack in one cohort: every setting but the learning rate."""
        return tuple((k, v) for k, v in asdict(settings).items() if k != "lr")

    def tensors(self) -> list[Tensor]:
        """All state tensors (reset for a new round; snapshot and restored around a CUDA graph's warm-up)."""
        return []

    def start_from(self, states: Sequence[Optional[dict[str, Tensor]]], names: Sequence[str]) -> None:
        """Each member's state to start its fits from (``states[m]``: ``<parameter name>/<key>``
        -> tensor, as ``member_states`` hands it back; None: afresh). ``names``: the stacked
        parameters' names, in ``params`` order. Only an optimizer that keeps a state takes one."""
        if any(states):
            raise ValueError(f"optimizer.keep_state: {type(self).__name__} keeps no state between fits")

    def reset(self) -> None:
        """The state a fit starts from: zero (afresh), or each member's from ``start_from``."""
        for t in self.tensors():
            t.zero_()

    def member_states(self, names: Sequence[str]) -> list[dict[str, Tensor]]:
        """Each member's state on the CPU, ``<parameter name>/<key>`` -> tensor, as its client's
        per-client optimizer keeps it (``optimizer.keep_state``); none by default."""
        return [{} for _ in range(len(self.lr))]

    def batch_statistic(self, sample_losses: Callable[[dict[str, Tensor], Tensor, Tensor], Tensor],
                        params: dict[str, Tensor], x: Tensor, y: Tensor, weight: Tensor) -> list[Tensor]:
        """One member's statistic of its batch (under ``vmap``; ``sample_losses(params, x, y)``:
        each sample's data loss, ``weight``: 1 real, 0 padding), handed to ``step``; only
        called when ``uses_sample_losses``."""
        raise NotImplementedError(f"{type(self).__name__} reads no per-sample losses")

    def step(self, params: Sequence[Tensor], grads: Sequence[Tensor], mask: Tensor,
             statistic: Sequence[Tensor] = ()) -> None:
        raise NotImplementedError

    def outputs(self, names: Sequence[str]) -> dict[str, Tensor]:
        """Stacked tensors (members, ...) that go back with the members' parameters (``names``:
        the parameters' names, in ``params`` order); none for an optimizer that trains."""
        return {}


class StackedOptimizer(MemberOptimizer):
    """SGD (with momentum and weight decay) or Adam, per member."""

    def __init__(self, cfg: OptimizerConfig, params: Sequence[Tensor], lr: Optional[Sequence[float]] = None) -> None:
        super().__init__(cfg, params, lr)
        if cfg.name not in ("sgd", "adam"):
            raise ValueError(f"optimizer.name={cfg.name!r} is unknown; choose sgd or adam")
        self.cfg = cfg
        members = params[0].shape[0]
        # keyed as torch.optim.SGD's and Adam's per-parameter state, so a kept state moves
        # between this and the per-client optimizer (``step``: one count per member)
        self.state: dict[str, list[Tensor]] = {}
        if cfg.name == "sgd" and cfg.momentum:
            self.state["momentum_buffer"] = [torch.zeros_like(p) for p in params]
        if cfg.name == "adam":
            self.state["exp_avg"] = [torch.zeros_like(p) for p in params]
            self.state["exp_avg_sq"] = [torch.zeros_like(p) for p in params]
            self.state[STEP] = [torch.zeros(members, device=params[0].device)]
        self.start: Optional[list[Tensor]] = None  # each member's kept state, in tensors() order

    def tensors(self) -> list[Tensor]:
        return [t for group in self.state.values() for t in group]

    def start_from(self, states: Sequence[Optional[dict[str, Tensor]]], names: Sequence[str]) -> None:
        if not any(states):
            self.start = None
            return
        start = {key: [torch.zeros_like(t) for t in group] for key, group in self.state.items()}
        for m, state in enumerate(states):
            if not state:
                continue
            for key, group in start.items():
                if key == STEP:  # one count per member; torch keeps one per parameter, all equal
                    counts = {float(v) for k, v in state.items() if k.endswith("/" + STEP)}
                    if len(counts) != 1:
                        raise ValueError(f"optimizer.keep_state: member {m}'s kept state holds step counts "
                                         f"{sorted(counts)}; Adam's state needs one")
                    group[0][m] = counts.pop()
                    continue
                for name, tensor in zip(names, group):
                    if f"{name}/{key}" in state:
                        tensor[m] = state[f"{name}/{key}"]
        self.start = [t for group in start.values() for t in group]  # tensors()' order

    def reset(self) -> None:
        if self.start is None:
            super().reset()
            return
        for t, s in zip(self.tensors(), self.start):
            t.copy_(s)

    def member_states(self, names: Sequence[str]) -> list[dict[str, Tensor]]:
        cpu = {key: [t.detach().cpu() for t in group] for key, group in self.state.items()}
        steps = cpu.pop(STEP, None)
        return [{**{f"{name}/{key}": group[i][m].clone() for key, group in cpu.items() for i, name in enumerate(names)},
                 **({f"{name}/{STEP}": steps[0][m].clone() for name in names} if steps is not None else {})}
                for m in range(len(self.lr))]

    @torch.no_grad()
    def step(self, params: Sequence[Tensor], grads: Sequence[Tensor], mask: Tensor,
             statistic: Sequence[Tensor] = ()) -> None:
        cfg = self.cfg
        if cfg.weight_decay:
            grads = [g + cfg.weight_decay * p for g, p in zip(grads, params)]
        if cfg.name == "sgd":
            if cfg.momentum:
                for buf, g in zip(self.state["momentum_buffer"], grads):
                    # a zero buffer times momentum plus g is g: torch's first-step clone
                    buf.copy_(torch.where(per_member(mask, buf) > 0, buf * cfg.momentum + g, buf))
                grads = self.state["momentum_buffer"]
            for p, g in zip(params, grads):
                p.sub_(per_member(self.lr * mask, p) * g)
            return
        beta1, beta2 = ADAM_BETAS
        step = self.state[STEP][0]
        step.add_(mask)
        # members that never stepped have step 0; clamp so that their (unused) corrections stay finite
        t = step.clamp(min=1)
        bias1 = 1 - beta1 ** t
        bias2_sqrt = (1 - beta2 ** t).sqrt()
        for p, g, m, v in zip(params, grads, self.state["exp_avg"], self.state["exp_avg_sq"]):
            on = per_member(mask, p) > 0
            m.copy_(torch.where(on, m * beta1 + (1 - beta1) * g, m))
            v.copy_(torch.where(on, v * beta2 + (1 - beta2) * g * g, v))
            denom = v.sqrt() / per_member(bias2_sqrt, p) + ADAM_EPS
            update = per_member(self.lr / bias1, p) * m / denom
            p.sub_(torch.where(on, update, torch.zeros_like(update)))


#: ``optimizer.name`` -> the member optimizer that stacks it; other names train per client
STACKED_OPTIMIZERS: dict[str, type[MemberOptimizer]] = {"sgd": StackedOptimizer, "adam": StackedOptimizer}


def register_stacked_optimizer(name: str, kind: type[MemberOptimizer]) -> None:
    STACKED_OPTIMIZERS[name] = kind


#: how a cohort's members step: a member optimizer's class and the settings it takes
OptimizerChoice = tuple[type[MemberOptimizer], Any]


def stacked_choice(cfg: OptimizerConfig) -> Optional[OptimizerChoice]:
    """The member optimizer of a task's ``optimizer`` settings; None: it does not stack."""
    kind = STACKED_OPTIMIZERS.get(cfg.name)
    return None if kind is None else (kind, cfg)
