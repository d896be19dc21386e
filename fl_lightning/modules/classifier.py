"""The multi-class classifier trained by FedAvg and its variants."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fl_lightning.config import OptimizerConfig
from fl_lightning.modules.learner import LocalLearner


class MultiClassClassifier(LocalLearner):
    """Cross-entropy on all n classes (FedAvg's ClientUpdate, Algorithm 1)."""

    def __init__(self, network: nn.Module, optimizer: OptimizerConfig) -> None:
        super().__init__(optimizer)
        # NHWC, like the inputs (LocalLearner.on_after_batch_transfer): mixed layouts make
        # oneDNN convert every activation back and forth.
        self.network = network.to(memory_format=torch.channels_last)

    def forward(self, x: Tensor) -> Tensor:
        return self.network(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x).float(), y)

    def flat_state(self) -> dict[str, Tensor]:
        return {k: v.detach().cpu().clone() for k, v in self.network.state_dict().items()}
