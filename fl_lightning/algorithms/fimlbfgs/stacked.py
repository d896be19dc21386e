"""FIM-L-BFGS's client-side reading in the cohort engine (``optimizer.name: fim_lbfgs``): every
member, one client's model or one FedOVA detector, steps as its own ``FIMLBFGSOptimizer``
would, with its own pair history, count and learning rate (optimizer.py's ``client_steps``,
the same function).

What the step needs besides the gradient is the batch's diagonal empirical Fisher of the data
loss, diag(E[g_i g_i^T]) over the member's real samples (padding has weight 0), from
per-sample gradients of the plug-in's ``sample_losses`` (per_sample.py's ``batch_fisher_of``,
the per-client modules' function): the engine computes it per member inside the vectorised
step (``batch_statistic``). The histories are (members, m, d) float64 tensors and the counts a
(members,) tensor, updated in place with fixed shapes (every row visited, unused ones masked;
a rejected pair or a masked member a ``where``), so a CUDA graph captures the step.

Precision, as per client: the Fisher's per-sample gradients and the loss's gradient run under
the Trainer's precision (bf16-mixed: autocast, forward and backward, as the per-client modules'
``_fim_lbfgs_step`` computes both inside ``training_step``); the step's arithmetic runs with
autocast off, the two-loop recursion and the history in float64 and the parameters' update in
float32, as ``FIMLBFGSOptimizer`` computes them.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from fl_lightning.algorithms.fimlbfgs.optimizer import client_steps
from fl_lightning.algorithms.fimlbfgs.per_sample import batch_fisher_of
from fl_lightning.cohort.optim import MemberOptimizer, register_stacked_optimizer
from fl_lightning.config import OptimizerConfig


class StackedFIMLBFGS(MemberOptimizer):
    """``FIMLBFGSOptimizer`` per member (``cfg``: history m, damping, max_step_norm; each
    member's own lr); a member whose mask is 0 keeps its parameters, pairs and count."""

    uses_sample_losses = True

    def __init__(self, cfg: OptimizerConfig, params: Sequence[Tensor], lr: Optional[Sequence[float]] = None) -> None:
        super().__init__(cfg, params, lr)
        if cfg.history < 1:
            raise ValueError(f"optimizer.history={cfg.history} must be >= 1")
        if cfg.damping < 0:
            raise ValueError(f"optimizer.damping={cfg.damping} must be >= 0")
        self.cfg = cfg
        members, device = params[0].shape[0], params[0].device
        self.sizes = [p[0].numel() for p in params]
        self.s = torch.zeros(members, cfg.history, sum(self.sizes), dtype=torch.float64, device=device)
        self.y = torch.zeros_like(self.s)
        self.count = torch.zeros(members, dtype=torch.long, device=device)

    def tensors(self) -> list[Tensor]:
        return [self.s, self.y, self.count]

    def batch_statistic(self, sample_losses, params, x, y, weight) -> list[Tensor]:
        """The member's batch diagonal Fisher, per parameter (``params``' order)."""
        fisher = batch_fisher_of(sample_losses, params, x, y, weight)
        return [fisher[n] for n in params]

    @torch.no_grad()
    def step(self, params: Sequence[Tensor], grads: Sequence[Tensor], mask: Tensor,
             statistic: Sequence[Tensor] = ()) -> None:
        members = params[0].shape[0]
        with torch.autocast(params[0].device.type, enabled=False):  # float64 / float32, whatever the precision
            flat_grads = torch.cat([g.reshape(members, -1) for g in grads], dim=1)
            fisher = torch.cat([f.reshape(members, -1) for f in statistic], dim=1)
            steps, s, y, count = client_steps(flat_grads, fisher, self.s, self.y, self.count, self.lr,
                                              self.cfg.damping, self.cfg.max_step_norm, mask > 0)
            for p, part in zip(params, steps.split(self.sizes, dim=1)):
                p.add_(part.view_as(p).to(p.dtype))
            self.s.copy_(s)
            self.y.copy_(y)
            self.count.copy_(count)


register_stacked_optimizer("fim_lbfgs", StackedFIMLBFGS)
