"""Mini-batches of one client straight from the shared in-memory tensors.

A DataLoader would collate sample by sample and (with workers) copy the data;
here each batch is one fancy-indexing op on the whole-data-set tensors.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


class ClientBatches:
    """Reshuffled every pass (``iter``) by the client's own generator.

    ``batch_size`` 0 means the whole local set in one batch (FedOVA's B = infinity).
    The last, smaller batch is kept, as PyTorch's DataLoader does by default.
    """

    def __init__(self, x: Tensor, y: Tensor, indices: Tensor, batch_size: int, generator: torch.Generator) -> None:
        if batch_size < 0:
            raise ValueError(f"federation.batch_size={batch_size} must be >= 0 (0 = whole local set)")
        self.x, self.y, self.indices = x, y, indices
        self.batch_size = batch_size or len(indices)
        self.generator = generator

    def __len__(self) -> int:
        return math.ceil(len(self.indices) / self.batch_size)

    def __iter__(self):
        order = self.indices[torch.randperm(len(self.indices), generator=self.generator)]
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            yield self.x[idx], self.y[idx]
