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
"""

from __future__ import annotations

from typing import Mapping, Sequence, Union

import torch
from torch import Tensor

#: default curvature threshold of ``push_pair``
CURVATURE_EPS = 1e-8


def two_loop_direction(grad: Tensor, s_hist: Union[Tensor, Sequence[Tensor]],
                       y_hist: Union[Tensor, Sequence[Tensor]]) -> Tensor:
    """p = -H g by the standard two-loop recursion (Nocedal & Wright, Algorithm 7.4).

    ``s_hist``, ``y_hist``: the pairs (s_i, y_i), oldest first, as (k, d) tensors or
    sequences of (d,) vectors; every pair must have s_i . y_i > 0 (``push_pair`` ensures it).
    H is the inverse-BFGS matrix built from H_0 = gamma I, gamma = s.y / y.y of the newest
    pair (1 without pairs, so the first direction is -g). Computed in float64, returned in
    ``grad``'s dtype.
    """
    q = grad.double().clone()
    pairs = [(s.double(), y.double()) for s, y in zip(s_hist, y_hist)]
    rhos = [1.0 / torch.dot(y, s) for s, y in pairs]
    alphas = [None] * len(pairs)
    for i in reversed(range(len(pairs))):  # newest to oldest
        s, y = pairs[i]
        alphas[i] = rhos[i] * torch.dot(s, q)
        q -= alphas[i] * y
    if pairs:
        s, y = pairs[-1]
        q *= torch.dot(s, y) / torch.dot(y, y)  # H_0 = gamma I
    for i, (s, y) in enumerate(pairs):  # oldest to newest
        beta = rhos[i] * torch.dot(y, q)
        q += (alphas[i] - beta) * s
    return (-q).to(grad.dtype)


def has_curvature(s: Tensor, y: Tensor, eps: float = CURVATURE_EPS) -> bool:
    """s . y > eps ||s|| ||y||: the cosine of the pair's angle must exceed ``eps``."""
    s, y = s.double(), y.double()
    return bool(torch.dot(s, y) > eps * torch.linalg.vector_norm(s) * torch.linalg.vector_norm(y))


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
    if not has_curvature(s, y, eps):
        return s_hist, y_hist, count, False
    m = s_hist.shape[0]
    s_new, y_new = s_hist.clone(), y_hist.clone()
    if count >= m:  # line 10: discard (s_{t-m}, y_{t-m})
        s_new[:-1], y_new[:-1] = s_hist[1:].clone(), y_hist[1:].clone()
        count = m - 1
    s_new[count], y_new[count] = s.to(s_new.dtype), y.to(y_new.dtype)  # line 12: store (s_t, y_t)
    return s_new, y_new, count + 1, True


def diagonal_fisher(per_sample_grads: Union[Tensor, Mapping[str, Tensor]]) -> Union[Tensor, dict[str, Tensor]]:
    """The paper's diagonalised Fisher (Eq. 11 with Gamma = diag(g g^T)): B ~ diag(E[g g^T]),
    i.e. the mean over samples of the squared per-sample gradients. Input: per-sample
    gradients stacked along dim 0, one tensor or a dict of them (parameter name -> (N, ...))."""
    if isinstance(per_sample_grads, Mapping):
        return {name: g.square().mean(dim=0) for name, g in per_sample_grads.items()}
    return per_sample_grads.square().mean(dim=0)
