"""Per-sample gradients of a data loss, and what FIM-L-BFGS reads from them: the batch's
diagonal empirical Fisher (the client-side optimizer) and the gradient and squared-gradient
sums (the curvature probe).

A data loss here is ``sample_losses(params, x, y) -> (B,)``: each sample's loss on a batch,
without an objective's regularisers (FedProx's and FedDANE's terms are not data). The same
functions run on one client's module (all samples real) and, vmapped over a cohort's members,
on padded batches whose ``weight`` is 1 for a real sample and 0 for padding: a sum or mean
then covers the real samples alone, as the client alone computes it.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor
from torch.func import grad, grad_and_value, vmap

from fl_lightning.algorithms.fimlbfgs.lbfgs import diagonal_fisher

#: ``sample_losses(params, x, y)``: each sample's data loss (B,) on a batch
SampleLosses = Callable[[dict[str, Tensor], Tensor, Tensor], Tensor]


def per_sample_gradients(sample_losses: SampleLosses, params: dict[str, Tensor], x: Tensor, y: Tensor,
                         chunk_size: Optional[int] = None) -> tuple[dict[str, Tensor], Tensor]:
    """(each sample's gradient, name -> (B, ...); each sample's loss (B,)): every sample's loss
    on a batch of that sample alone, differentiated by ``vmap(grad(...))`` (``chunk_size``:
    vmap's, bounding the per-sample gradients held at once)."""

    def one_sample(p, xi, yi):
        loss = sample_losses(p, xi.unsqueeze(0), yi.unsqueeze(0)).sum()
        return loss, loss

    grads, values = vmap(grad_and_value(one_sample, has_aux=True), in_dims=(None, 0, 0),
                         chunk_size=chunk_size)(params, x, y)
    return grads, values[1]


def batch_fisher_of(sample_losses: SampleLosses, params: dict[str, Tensor], x: Tensor, y: Tensor,
                    weight: Optional[Tensor] = None) -> dict[str, Tensor]:
    """The batch's diagonal empirical Fisher diag(E[g_i g_i^T]) per parameter name: the mean of
    the squared per-sample gradients over the batch's real samples (``weight``; None: all)."""
    grads, _ = per_sample_gradients(sample_losses, params, x, y)
    return diagonal_fisher(grads, weight)


def _per_sample(weight: Tensor, like: Tensor) -> Tensor:
    return weight.view(-1, *([1] * (like.dim() - 1))).to(like.dtype)


def gradient_sums(sample_losses: SampleLosses, params: dict[str, Tensor], x: Tensor, y: Tensor, weight: Tensor,
                  squares: bool, chunk_size: Optional[int] = None
                  ) -> tuple[dict[str, Tensor], dict[str, Tensor], Tensor]:
    """Over the batch's real samples (``weight``): sum_i grad f_i, and with ``squares`` sum_i
    (grad f_i)^2 from per-sample gradients (else an empty dict, and the first sum is the
    gradient of sum_i f_i: one backward instead of B); and each sample's loss f_i (B,)."""
    if squares:
        grads, values = per_sample_gradients(sample_losses, params, x, y, chunk_size)
        return ({k: (g * _per_sample(weight, g)).sum(0) for k, g in grads.items()},
                {k: (g.square() * _per_sample(weight, g)).sum(0) for k, g in grads.items()}, values)

    def weighted_sum(p):
        values = sample_losses(p, x, y)
        return (values * weight.to(values.dtype)).sum(), values

    summed, values = grad(weighted_sum, has_aux=True)(params)
    return summed, {}, values


def ones_like_batch(y: Tensor) -> Tensor:
    """The weights of a batch whose samples are all real (one client's own batch)."""
    return torch.ones(len(y), device=y.device)
