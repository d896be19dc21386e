"""Per-member optimizers over stacked parameters (leading dim = member), with a step mask.

The arithmetic is ``torch.optim.SGD``'s and ``torch.optim.Adam``'s (L2 weight decay added
to the gradient; SGD's momentum buffer starting at the first gradient; Adam's bias
correction with each member's own step count), applied to all members at once, each member
with its own learning rate (the runs of a stacked sweep may differ in it). A member
whose mask is 0 in a step keeps its parameters and its state exactly: it takes the steps it
would take alone, no more. Every update is in place, so a CUDA graph can capture it.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from fl_lightning.config import OptimizerConfig

STACKED_OPTIMIZERS = ("sgd", "adam")  # others (fim_lbfgs) train per client
ADAM_BETAS = (0.9, 0.999)  # torch.optim.Adam's defaults, as the per-client engine uses them
ADAM_EPS = 1e-8


def per_member(mask: Tensor, like: Tensor) -> Tensor:
    return mask.view(-1, *([1] * (like.dim() - 1))).to(like.dtype)


class StackedOptimizer:
    """``step(params, grads, mask)`` updates every member whose mask is 1; ``lr``: each
    member's learning rate (default: ``cfg.lr`` for all), a tensor a later round may overwrite."""

    def __init__(self, cfg: OptimizerConfig, params: Sequence[Tensor], lr: Optional[Sequence[float]] = None) -> None:
        members = params[0].shape[0]
        rates = [cfg.lr] * members if lr is None else list(lr)
        if len(rates) != members:
            raise ValueError(f"{len(rates)} learning rates for {members} members")
        for rate in rates:
            if rate <= 0:
                raise ValueError(f"optimizer.lr={rate} must be > 0")
        if cfg.name not in ("sgd", "adam"):
            raise ValueError(f"optimizer.name={cfg.name!r} is unknown; choose sgd or adam")
        self.cfg = cfg
        self.lr = torch.tensor(rates, dtype=torch.float32, device=params[0].device)
        self.state: dict[str, list[Tensor]] = {}
        if cfg.name == "sgd" and cfg.momentum:
            self.state["momentum"] = [torch.zeros_like(p) for p in params]
        if cfg.name == "adam":
            self.state["exp_avg"] = [torch.zeros_like(p) for p in params]
            self.state["exp_avg_sq"] = [torch.zeros_like(p) for p in params]
            self.state["step"] = [torch.zeros(members, device=params[0].device)]

    def tensors(self) -> list[Tensor]:
        """All state tensors (to snapshot and restore around a CUDA graph's warm-up)."""
        return [t for group in self.state.values() for t in group]

    @torch.no_grad()
    def step(self, params: Sequence[Tensor], grads: Sequence[Tensor], mask: Tensor) -> None:
        cfg = self.cfg
        if cfg.weight_decay:
            grads = [g + cfg.weight_decay * p for g, p in zip(grads, params)]
        if cfg.name == "sgd":
            if cfg.momentum:
                for buf, g in zip(self.state["momentum"], grads):
                    # a zero buffer times momentum plus g is g: torch's first-step clone
                    buf.copy_(torch.where(per_member(mask, buf) > 0, buf * cfg.momentum + g, buf))
                grads = self.state["momentum"]
            for p, g in zip(params, grads):
                p.sub_(per_member(self.lr * mask, p) * g)
            return
        beta1, beta2 = ADAM_BETAS
        step = self.state["step"][0]
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
