"""The client-side reading of FIM-L-BFGS (the FedOVA journal paper, Algorithm 1's ClientUpdate
over E epochs and every batch; Algorithm 2 for FedOVA's detectors): each client optimises
locally with FIM-based L-BFGS steps built from its own batches, and the server averages the
clients' models as FedAvg / FedOVA do. The server-side reading (one server step per round,
clients computing curvature only) is ``fl_lightning.algorithms.fimlbfgs.strategy``.

One step on a batch, with w the parameters flattened into one vector:

- g = grad of the batch loss (the closure's backward), B = diag(E[g_i g_i^T]) + damping, the
  diagonal empirical Fisher from the batch's per-sample gradients g_i (``batch_fisher``);
- p = -H g by the two-loop recursion over the client's stored pairs (H_0 = gamma I);
- w <- w + lr p (p scaled down to ``max_step_norm`` if it is longer);
- s = w_new - w_old, y = B s, kept if s . y > 0 (always, for B > 0), the last ``history``.

The maths is ``fl_lightning.algorithms.fimlbfgs.lbfgs``'s (two_loop_direction, push_pair, diagonal_fisher); the
pair history lives in the optimizer's state, so ``state_dict`` carries it.
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional

import torch
from torch import Tensor, nn

from fl_lightning.algorithms.fimlbfgs.lbfgs import diagonal_fisher, push_pair, two_loop_direction


def batch_fisher(model: nn.Module, loss_fn: Callable[[Tensor, Tensor], Tensor], x: Tensor, y: Tensor) -> list[Tensor]:
    """diag(E[g_i g_i^T]) over the batch, one tensor per trainable parameter (in
    ``model.parameters()`` order): per-sample gradients by torch.func (vmap of grad)."""
    from torch.func import functional_call, grad, vmap

    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    buffers = {n: b.detach() for n, b in model.named_buffers()}

    def sample_loss(p, xi, yi):
        out = functional_call(model, {**p, **buffers}, (xi.unsqueeze(0),))
        return loss_fn(out, yi.unsqueeze(0))

    per_sample = vmap(grad(sample_loss), in_dims=(None, 0, 0))(params, x, y)
    fisher = diagonal_fisher(per_sample)
    return [fisher[n] for n in names]


class FIMLBFGSOptimizer(torch.optim.Optimizer):
    """Args:
        params: the parameters (one group).
        lr: eta, the step size along p.
        history: m, the pairs kept.
        damping: lambda added to the diagonal Fisher (B = F + lambda I), keeping B > 0.
        max_step_norm: the longest step ||lr p|| (None: no limit).

    ``step(closure, fisher)``: ``closure`` recomputes the batch loss and calls backward (as
    torch.optim.LBFGS's); ``fisher`` is the batch's diagonal Fisher, per parameter
    (``batch_fisher``). The gradient is read from ``.grad`` after the closure.
    """

    def __init__(self, params: Iterable, lr: float = 1.0, history: int = 10, damping: float = 1e-3,
                 max_step_norm: Optional[float] = None) -> None:
        if not lr > 0:
            raise ValueError(f"optimizer.lr={lr} must be > 0")
        if history < 1:
            raise ValueError(f"history={history} must be >= 1")
        if damping < 0:
            raise ValueError(f"damping={damping} must be >= 0")
        super().__init__(params, dict(lr=lr, history=history, damping=damping, max_step_norm=max_step_norm))
        if len(self.param_groups) != 1:
            raise ValueError("FIMLBFGSOptimizer takes one parameter group")

    def _params(self) -> list[Tensor]:
        return [p for p in self.param_groups[0]["params"] if p.requires_grad]

    def step(self, closure: Optional[Callable[[], Tensor]] = None, fisher: Optional[list[Tensor]] = None):
        if fisher is None:
            raise ValueError("FIMLBFGSOptimizer.step needs the batch's diagonal Fisher (batch_fisher)")
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        group = self.param_groups[0]
        params = self._params()
        with torch.no_grad():
            g = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
            b = torch.cat([f.reshape(-1) for f in fisher]).to(g) + group["damping"]
            state = self.state[params[0]]
            if "s" not in state:
                state["s"] = torch.zeros(group["history"], g.numel(), dtype=torch.float64, device=g.device)
                state["y"] = torch.zeros_like(state["s"])
                state["count"] = 0
            count = state["count"]
            direction = two_loop_direction(g, state["s"][:count], state["y"][:count])
            step = group["lr"] * direction
            limit = group["max_step_norm"]
            if limit is not None and torch.linalg.vector_norm(step) > limit:
                step = step * (limit / torch.linalg.vector_norm(step))
            offset = 0
            for p in params:
                n = p.numel()
                p.add_(step[offset:offset + n].view_as(p).to(p.dtype))
                offset += n
            s = step.double()
            state["s"], state["y"], state["count"], _ = push_pair(state["s"], state["y"], count, s, b.double() * s)
        return loss
