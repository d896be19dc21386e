"""The batches every member of a cohort draws in a round, laid out for one vectorised step.

A member trained in a cohort must see exactly the batches it would see on its own
(``fl_lightning.data.batches.ClientBatches`` seeded with ``client_seed``): the same
permutation per epoch from its client's own generator, batches of B in that order, the last
one shorter. Members then take different numbers of steps (unequal client sizes, B = whole
local set), so every step of the plan carries, per member, B sample indices (padded), a
sample weight (1 real, 0 padding) and whether the member steps at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor


@dataclass
class BatchPlan:
    """Per step s and stream k: ``index[s, k]`` (B sample indices into the data set),
    ``weight[s, k]`` (1 for a real sample, 0 for padding), ``active[s, k]`` (the stream's
    member takes an optimizer step) and ``last_epoch[s, k]`` (the step belongs to its last
    epoch: its loss is the one reported)."""

    index: Tensor  # (S, K, B) long
    weight: Tensor  # (S, K, B) float
    active: Tensor  # (S, K) float
    last_epoch: Tensor  # (S, K) float
    steps: list[int]  # optimizer steps per stream
    last_epoch_batches: list[int]  # batches per stream in its last epoch

    @property
    def num_steps(self) -> int:
        return self.index.shape[0]

    def to(self, device) -> "BatchPlan":
        return BatchPlan(self.index.to(device), self.weight.to(device), self.active.to(device),
                         self.last_epoch.to(device), self.steps, self.last_epoch_batches)


def stream_batches(indices: Tensor, batch_size: int, epochs: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """One stream's batches over ``epochs`` as (index, weight), each (steps, width): drawn as
    ClientBatches draws them (one ``randperm`` of the local set per epoch from the stream's
    generator, consecutive batches of ``batch_size``, the last one shorter), padded with
    weight 0. ``width`` is ``min(batch_size, n)`` (0: the whole local set)."""
    n = len(indices)
    size = min(batch_size or n, n)
    per_epoch = math.ceil(n / size)
    order = indices[torch.stack([torch.randperm(n, generator=generator) for _ in range(epochs)])]  # (E, n)
    padded = torch.full((epochs, per_epoch * size), -1, dtype=torch.long)
    padded[:, :n] = order
    padded = padded.view(epochs * per_epoch, size)
    return padded.clamp(min=0), (padded >= 0).float()


def build_plan(streams: Sequence[Tensor], seeds: Sequence[int], batch_size: int | Sequence[int],
               epochs: Sequence[int]) -> BatchPlan:
    """The plan of streams with local samples ``streams[k]`` (indices into the data set, at
    least one), generator seeds ``seeds[k]`` and ``epochs[k]`` local epochs, batches of
    ``batch_size`` (0: the whole local set), or of ``batch_size[k]`` per stream (the runs of a
    stacked sweep: a narrower stream is padded to the widest, its padding weighted 0)."""
    sizes = [batch_size] * len(streams) if isinstance(batch_size, int) else list(batch_size)
    for size in sizes:
        if size < 0:
            raise ValueError(f"federation.batch_size={size} must be >= 0 (0 = whole local set)")
    per_stream = [stream_batches(torch.as_tensor(idx, dtype=torch.long), size, e, torch.Generator().manual_seed(seed))
                  for idx, seed, size, e in zip(streams, seeds, sizes, epochs)]
    width = max(index.shape[1] for index, _ in per_stream)
    num_steps = max(index.shape[0] for index, _ in per_stream)
    k = len(streams)
    index = torch.zeros(num_steps, k, width, dtype=torch.long)
    weight = torch.zeros(num_steps, k, width)
    active = torch.zeros(num_steps, k)
    last_epoch = torch.zeros(num_steps, k)
    steps, last_epoch_batches = [], []
    for j, ((own_index, own_weight), e) in enumerate(zip(per_stream, epochs)):
        count, own_width = own_index.shape
        index[:count, j, :own_width] = own_index
        weight[:count, j, :own_width] = own_weight
        active[:count, j] = 1.0
        per_epoch = count // e
        last_epoch[count - per_epoch:count, j] = 1.0
        steps.append(count)
        last_epoch_batches.append(per_epoch)
    return BatchPlan(index, weight, active, last_epoch, steps, last_epoch_batches)


def without_steps(plan: BatchPlan, skipped: Tensor) -> BatchPlan:
    """``plan`` where the streams do not step at the steps ``skipped[s, k]`` (a batch that batch
    norm cannot normalise, which the per-client module skips too): the step changes nothing and
    its loss is not among the last epoch's, but it still counts in ``steps``, as the per-client
    engine counts it (Lightning calls the optimizer with no gradient, which leaves every
    parameter and its state as they were). Steps at the end where no stream steps are dropped."""
    keep = 1.0 - skipped.float()
    active, last_epoch = plan.active * keep, plan.last_epoch * keep
    stepping = torch.nonzero(active.sum(1) > 0).flatten()
    end = int(stepping[-1]) + 1 if len(stepping) else 0
    return BatchPlan(plan.index[:end], plan.weight[:end], active[:end], last_epoch[:end], plan.steps,
                     [int(n) for n in last_epoch.sum(0).tolist()])
