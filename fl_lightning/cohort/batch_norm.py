"""Batch norm over a padded batch, as a function of a member's running statistics.

A member of a cohort trains on a batch padded to the cohort's width (weight 1 real, 0
padding). Its batch norm layers must normalise with the statistics of the real samples
alone, exactly those ``nn.BatchNorm2d`` computes on the short batch the client trains on by
itself (biased variance to normalise, unbiased variance into ``running_var``, the layer's
momentum), and its running statistics are per-member state the step carries, not buffers
of a shared module. ``padded_batch_norm`` swaps a network's batch norm layers for
``PaddedBatchNorm`` layers that read the sample weights and the running statistics from a
``BatchNormStep`` and write the updated statistics back into it, so the cohort's step can
return them from inside ``vmap`` and store them with a mask (members that do not step keep
theirs).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

from fl_lightning.functional import replace_layers

#: the buffers of a batch norm layer that tracks running statistics, in state-dict order
STATISTICS = ("running_mean", "running_var", "num_batches_tracked")


def normalisable(real_samples):
    """Whether batch norm can train on a batch of ``real_samples`` (an int or a tensor of them):
    one sample has no variance (``nn.BatchNorm2d`` raises on 1x1 feature maps), so both engines
    skip such a batch, as ``drop_last`` would."""
    return real_samples >= 2


def has_batch_norm(network: nn.Module) -> bool:
    return any(isinstance(m, _BatchNorm) for m in network.modules())


def statistics_names(network: nn.Module) -> list[str]:
    """The state-dict names of every batch norm layer's running statistics."""
    return [f"{name}.{s}" for name, m in network.named_modules() if isinstance(m, _BatchNorm) and m.track_running_stats
            for s in STATISTICS]


def weighted_batch_norm(x: Tensor, weight: Tensor, running: Optional[tuple[Tensor, Tensor, Tensor]],
                        gamma: Optional[Tensor], beta: Optional[Tensor], momentum: Optional[float],
                        eps: float) -> tuple[Tensor, Optional[tuple[Tensor, Tensor, Tensor]]]:
    """Training-mode batch norm of ``x`` (B, C, ...) over its real samples (``weight`` (B,), 1 or 0):
    (normalised x, the updated (running_mean, running_var, num_batches_tracked), or None without
    ``running``). Padding rows come out as zeros, so that they stay finite through a deep
    network whatever the real samples' statistics. Computed in float32 (as nn.BatchNorm keeps
    its statistics under autocast); the output has x's dtype."""
    dims = [0, *range(2, x.dim())]
    per_channel = (1, -1, *([1] * (x.dim() - 2)))
    real = weight.to(torch.float32).view(-1, *([1] * (x.dim() - 1)))
    values = x.float()
    count = real.sum() * values[0, 0].numel()  # real samples x positions per channel
    mean = (values * real).sum(dims) / count.clamp(min=1)
    centred = values - mean.view(per_channel)
    variance = (centred * centred * real).sum(dims) / count.clamp(min=1)  # biased: what normalises
    out = centred * torch.rsqrt(variance + eps).view(per_channel)
    if gamma is not None:
        out = out * gamma.float().view(per_channel) + beta.float().view(per_channel)
    out = torch.where(real > 0, out, torch.zeros_like(out)).to(x.dtype)
    if running is None:
        return out, None
    running_mean, running_var, batches = running
    batches = batches + 1
    # nn.BatchNorm's factor: its momentum, or a cumulative average without one
    factor = momentum if momentum is not None else 1.0 / batches.float()
    unbiased = variance.detach() * count / (count - 1).clamp(min=1)
    return out, ((1 - factor) * running_mean + factor * mean.detach(), (1 - factor) * running_var + factor * unbiased,
                 batches)


class BatchNormStep:
    """What the ``PaddedBatchNorm`` layers of one network read and write in one step: the
    batch's sample ``weight`` and each layer's running statistics by layer name (replaced by
    the updated ones as the layers run: a layer run twice updates twice, as nn.BatchNorm does)."""

    def __init__(self) -> None:
        self.weight: Optional[Tensor] = None
        self.running: dict[str, tuple[Tensor, Tensor, Tensor]] = {}


class PaddedBatchNorm(nn.Module):
    """A batch norm layer in training mode, by ``weighted_batch_norm``: its affine parameters
    are its own (``weight``, ``bias``: the names functional_call fills), its statistics are the
    step's (``BatchNormStep``)."""

    def __init__(self, layer: _BatchNorm, name: str, step: BatchNormStep) -> None:
        super().__init__()
        self.weight, self.bias = layer.weight, layer.bias
        self.name, self.step, self.momentum, self.eps = name, step, layer.momentum, layer.eps
        self.tracks = layer.track_running_stats

    def forward(self, x: Tensor) -> Tensor:
        running = self.step.running[self.name] if self.tracks else None
        out, updated = weighted_batch_norm(x, self.step.weight, running, self.weight, self.bias, self.momentum,
                                           self.eps)
        if updated is not None:
            self.step.running[self.name] = updated
        return out


def padded_batch_norm(network: nn.Module) -> BatchNormStep:
    """Swaps (in place) every batch norm layer of ``network`` for a ``PaddedBatchNorm``; the step
    they all read."""
    step = BatchNormStep()
    replace_layers(network, lambda m: isinstance(m, _BatchNorm), lambda name, m: PaddedBatchNorm(m, name, step))
    return step
