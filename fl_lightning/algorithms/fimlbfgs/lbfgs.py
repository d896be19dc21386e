"""The maths of the FIM-based approximate L-BFGS (the FedOVA journal paper, Section IV-A,
Algorithm 1), as pure tensor functions.

Algorithm 1, server side, one round t:

- line 6: p_t = -H_t grad f(w_t), by the two-loop recursion over the stored pairs
  (``two_loop_direction``);
- line 7: w_{t+1} = w_t + eta p_t;
- line 8: s_t = w_{t+1} - w_t and y_t = B_t s_t, where B_t, the clients' mean Fisher
  information (Eq. 11), is diagonalised: B_t = diag(E[g g^T]) (``diagonal_fisher``);
- lines 9-13: keep the last m pairs (``push_pair``).

A history is two (m, d) tensors S, Y and a count c: rows 0..c-1 hold the pairs, oldest
first. Keeping them as plain tensors puts them in the federation's state dict, so
checkpoints and resumed runs carry the L-BFGS memory unchanged.

Each rule is written once, for G histories side by side (``two_loop_directions``,
``push_pairs``: leading dimension G, every history with its own count; the cohort engine's
members, FedOVA's detectors): all m rows are visited, an unused row (index >= its count)
contributing exactly nothing, so the shapes do not depend on the counts and a CUDA graph can
capture the step. ``two_loop_direction`` and ``push_pair`` are the same rules for one history.
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence, Union

import torch
from torch import Tensor

#: default curvature threshold of ``push_pair``
CURVATURE_EPS = 1e-8


def _dot(a: Tensor, b: Tensor) -> Tensor:
    return (a * b).sum(-1)


def two_loop_directions(grads: Tensor, s_hist: Tensor, y_hist: Tensor, counts: Tensor) -> Tensor:
    """p = -H g for G histories at once: ``grads`` (G, d), ``s_hist``, ``y_hist`` (G, m, d) with
    rows 0..counts[i]-1 of history i in use, oldest first (``counts`` (G,)); see
    ``two_loop_direction``. Computed in float64, returned in ``grads``' dtype."""
    q = grads.double().clone()
    s_all, y_all = s_hist.double(), y_hist.double()
    m = s_all.shape[1]
    if m == 0:
        return (-q).to(grads.dtype)
    used = torch.arange(m, device=grads.device) < counts.unsqueeze(1)  # (G, m)
    # an unused row has rho = 0, hence alpha = beta = 0: q - 0 * y and q + 0 * s leave q as it is
    curvature = _dot(y_all, s_all)
    rhos = torch.where(used, 1.0 / torch.where(used, curvature, torch.ones_like(curvature)), torch.zeros_like(curvature))
    alphas: list[Tensor] = [q.new_zeros(q.shape[0])] * m
    for i in reversed(range(m)):  # newest to oldest
        alphas[i] = rhos[:, i] * _dot(s_all[:, i], q)
        q = q - alphas[i].unsqueeze(1) * y_all[:, i]
    # H_0 = gamma I, gamma = s.y / y.y of the newest pair (row count - 1); 1 without pairs
    newest = (counts - 1).clamp(min=0).view(-1, 1, 1).expand(-1, 1, s_all.shape[2])
    s_new, y_new = s_all.gather(1, newest).squeeze(1), y_all.gather(1, newest).squeeze(1)
    has_pairs = counts > 0
    y_square = _dot(y_new, y_new)
    gamma = torch.where(has_pairs, _dot(s_new, y_new) / torch.where(has_pairs, y_square, torch.ones_like(y_square)),
                        torch.ones_like(y_square))
    q = q * gamma.unsqueeze(1)
    for i in range(m):  # oldest to newest
        beta = rhos[:, i] * _dot(y_all[:, i], q)
        q = q + (alphas[i] - beta).unsqueeze(1) * s_all[:, i]
    return (-q).to(grads.dtype)


def two_loop_direction(grad: Tensor, s_hist: Union[Tensor, Sequence[Tensor]],
                       y_hist: Union[Tensor, Sequence[Tensor]]) -> Tensor:
    """p = -H g by the standard two-loop recursion (Nocedal & Wright, Algorithm 7.4).

    ``s_hist``, ``y_hist``: the pairs (s_i, y_i), oldest first, as (k, d) tensors or
    sequences of (d,) vectors; every pair must have s_i . y_i > 0 (``push_pair`` ensures it).
    H is the inverse-BFGS matrix built from H_0 = gamma I, gamma = s.y / y.y of the newest
    pair (1 without pairs, so the first direction is -g). Computed in float64, returned in
    ``grad``'s dtype.
    """
    s_all = torch.stack(list(s_hist)) if len(s_hist) else grad.new_zeros((0, grad.numel()))
    y_all = torch.stack(list(y_hist)) if len(y_hist) else grad.new_zeros((0, grad.numel()))
    counts = torch.tensor([len(s_all)], device=grad.device)
    return two_loop_directions(grad.unsqueeze(0), s_all.unsqueeze(0), y_all.unsqueeze(0), counts)[0]


def have_curvature(s: Tensor, y: Tensor, eps: float = CURVATURE_EPS) -> Tensor:
    """Per row of (G, d) pairs: s . y > eps ||s|| ||y||, the cosine of the pair's angle above
    ``eps`` (in float64)."""
    s, y = s.double(), y.double()
    return _dot(s, y) > eps * torch.linalg.vector_norm(s, dim=-1) * torch.linalg.vector_norm(y, dim=-1)


def has_curvature(s: Tensor, y: Tensor, eps: float = CURVATURE_EPS) -> bool:
    """s . y > eps ||s|| ||y||: the cosine of the pair's angle must exceed ``eps``."""
    return bool(have_curvature(s.reshape(1, -1), y.reshape(1, -1), eps)[0])


def push_pairs(s_hist: Tensor, y_hist: Tensor, counts: Tensor, s: Tensor, y: Tensor, eps: float = CURVATURE_EPS,
               take: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``push_pair`` for G histories at once (``s_hist``, ``y_hist`` (G, m, d), ``counts`` (G,),
    the new pairs ``s``, ``y`` (G, d)); ``take`` (G,) bool: the histories that take their pair at
    all (default: every one; a history that does not keeps everything). Returns the new
    (S, Y, counts, accepted (G,) bool); the inputs are not modified."""
    m = s_hist.shape[1]
    accepted = have_curvature(s, y, eps)
    if take is not None:
        accepted = accepted & take
    full = (counts >= m).view(-1, 1, 1)
    # line 10: a full history discards its oldest pair (row 0; the rolled-round row is overwritten)
    s_kept = torch.where(full, s_hist.roll(-1, dims=1), s_hist)
    y_kept = torch.where(full, y_hist.roll(-1, dims=1), y_hist)
    position = counts.clamp(max=m - 1)
    slot = (torch.arange(m, device=counts.device) == position.unsqueeze(1)).unsqueeze(2)  # (G, m, 1)
    s_new = torch.where(slot, s.unsqueeze(1).to(s_hist.dtype), s_kept)  # line 12: store (s_t, y_t)
    y_new = torch.where(slot, y.unsqueeze(1).to(y_hist.dtype), y_kept)
    on = accepted.view(-1, 1, 1)
    return (torch.where(on, s_new, s_hist), torch.where(on, y_new, y_hist),
            torch.where(accepted, position + 1, counts), accepted)


def push_pair(s_hist: Tensor, y_hist: Tensor, count: int, s: Tensor, y: Tensor,
              eps: float = CURVATURE_EPS) -> tuple[Tensor, Tensor, int, bool]:
    """Algorithm 1, lines 9-13: append (s, y) to a history of at most m = ``s_hist.shape[0]``
    pairs (rows 0..count-1 in use, oldest first), dropping the oldest when it is full.

    A pair whose curvature s . y <= eps ||s|| ||y|| is SKIPPED (returned unchanged, False):
    each BFGS update keeps H positive definite exactly when s . y > 0, so a pair without
    positive curvature (a non-convex region, or noise in y) would let the two-loop recursion
    return a direction that is not a descent direction, or divide by ~0. Returns the new
    (S, Y, count, accepted); the inputs are not modified.
    """
    counts = torch.tensor([count], device=s_hist.device)
    new_s, new_y, new_counts, accepted = push_pairs(s_hist.unsqueeze(0), y_hist.unsqueeze(0), counts,
                                                    s.reshape(1, -1), y.reshape(1, -1), eps)
    if not bool(accepted[0]):
        return s_hist, y_hist, count, False
    return new_s[0], new_y[0], int(new_counts[0]), True


def diagonal_fisher(per_sample_grads: Union[Tensor, Mapping[str, Tensor]],
                    weight: Optional[Tensor] = None) -> Union[Tensor, dict[str, Tensor]]:
    """The paper's diagonalised Fisher (Eq. 11 with Gamma = diag(g g^T)): B ~ diag(E[g g^T]),
    i.e. the mean over samples of the squared per-sample gradients. Input: per-sample
    gradients stacked along dim 0, one tensor or a dict of them (parameter name -> (N, ...));
    ``weight`` (N,): 1 for a real sample, 0 for padding (the mean is over the real samples)."""
    if isinstance(per_sample_grads, Mapping):
        return {name: diagonal_fisher(g, weight) for name, g in per_sample_grads.items()}
    if weight is None:
        return per_sample_grads.square().mean(dim=0)
    weight = weight.view(-1, *([1] * (per_sample_grads.dim() - 1))).to(per_sample_grads.dtype)
    return (per_sample_grads.square() * weight).sum(dim=0) / weight.sum().clamp(min=1)
