"""The client-side reading of FIM-L-BFGS (the FedOVA journal paper, Algorithm 1's ClientUpdate
over E epochs and every batch; Algorithm 2 for FedOVA's detectors): each client optimises
locally with FIM-based L-BFGS steps built from its own batches, and the server averages the
clients' models as FedAvg / FedOVA do. The server-side reading (one server step per round,
clients computing curvature only) is ``fl_lightning.algorithms.fimlbfgs.strategy``.

One step on a batch, with w the parameters flattened into one vector (``client_steps``):

- g = grad of the batch loss (the closure's backward), B = diag(E[g_i g_i^T]) + damping, the
  diagonal empirical Fisher from the batch's per-sample gradients g_i of the data loss
  (``batch_fisher``; per_sample.py);
- p = -H g by the two-loop recursion over the client's stored pairs (H_0 = gamma I);
- w <- w + lr p (p scaled down to ``max_step_norm`` if it is longer);
- s = w_new - w_old, y = B s, kept if s . y > 0 (always, for B > 0), the last ``history``.

``client_steps`` is that step for G clients side by side, each with its own history: one
client's ``FIMLBFGSOptimizer`` (G = 1) and the cohort engine's ``StackedFIMLBFGS`` (stacked.py,
G = the cohort's members) both call it. The maths below it is ``lbfgs``'s
(two_loop_directions, push_pairs, diagonal_fisher); the pair history lives in the optimizer's
state, so ``state_dict`` carries it.
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional

import torch
from torch import Tensor, nn

from fl_lightning.algorithms.fimlbfgs.lbfgs import push_pairs, two_loop_directions
from fl_lightning.algorithms.fimlbfgs.per_sample import batch_fisher_of


def client_steps(grads: Tensor, fisher: Tensor, s_hist: Tensor, y_hist: Tensor, counts: Tensor, lr: Tensor,
                 damping: float, max_step_norm: Optional[float], take: Tensor
                 ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One FIM-L-BFGS step of each of G clients: ``grads`` and ``fisher`` (G, d) (the batch's
    gradient and diagonal Fisher, flattened), their pair histories ``s_hist``, ``y_hist``
    (G, m, d) float64 with ``counts`` (G,), ``lr`` (G,), and ``take`` (G,) bool: the clients
    that step at all. Returns (the steps lr p (G, d) in ``grads``' dtype, zero where not
    ``take``; the new S, Y and counts: a client that does not step keeps its history)."""
    direction = two_loop_directions(grads, s_hist, y_hist, counts)  # float64 inside, grads' dtype out
    steps = lr.to(grads.dtype).unsqueeze(1) * direction
    if max_step_norm is not None:  # scaled down to max_step_norm; a shorter step is multiplied by 1 exactly
        norms = torch.linalg.vector_norm(steps, dim=1, keepdim=True)
        steps = steps * torch.where(norms > max_step_norm, max_step_norm / norms, torch.ones_like(norms))
    steps = torch.where(take.unsqueeze(1), steps, torch.zeros_like(steps))
    s = steps.double()  # s = w_new - w_old, as the step adds it
    curvature = (fisher.to(grads.dtype) + damping).double() * s  # y = (F + lambda) s
    s_hist, y_hist, counts, _ = push_pairs(s_hist, y_hist, counts, s, curvature, take=take)
    return steps, s_hist, y_hist, counts


def batch_fisher(model: nn.Module, loss_fn: Callable[[Tensor, Tensor], Tensor], x: Tensor, y: Tensor) -> list[Tensor]:
    """diag(E[g_i g_i^T]) over the batch, one tensor per trainable parameter (in
    ``model.parameters()`` order), of ``loss_fn(model(x_i), y_i)`` (a mean loss: on one
    sample, that sample's loss)."""
    from torch.func import functional_call

    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    buffers = {n: b.detach() for n, b in model.named_buffers()}

    def sample_losses(p, xb, yb):  # called on one-sample batches
        return loss_fn(functional_call(model, {**p, **buffers}, (xb,)), yb).reshape(1)

    fisher = batch_fisher_of(sample_losses, params, x, y)
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
    (``batch_fisher``, ``per_sample.batch_fisher_of``). The gradient is read from ``.grad``
    after the closure.
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
            b = torch.cat([f.reshape(-1) for f in fisher]).to(g)
            state = self.state[params[0]]
            if "s" not in state:
                state["s"] = torch.zeros(group["history"], g.numel(), dtype=torch.float64, device=g.device)
                state["y"] = torch.zeros_like(state["s"])
                state["count"] = 0
            one = torch.ones(1, dtype=torch.bool, device=g.device)  # this client steps
            steps, s_hist, y_hist, counts = client_steps(
                g.unsqueeze(0), b.unsqueeze(0), state["s"].unsqueeze(0), state["y"].unsqueeze(0),
                torch.tensor([state["count"]], device=g.device), torch.tensor([group["lr"]], device=g.device),
                group["damping"], group["max_step_norm"], one)
            offset = 0
            for p in params:
                n = p.numel()
                p.add_(steps[0, offset:offset + n].view_as(p).to(p.dtype))
                offset += n
            state["s"], state["y"], state["count"] = s_hist[0], y_hist[0], int(counts[0])
        return loss
