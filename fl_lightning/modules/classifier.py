"""The multi-class classifier trained by FedAvg and its variants."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fl_lightning.config import OptimizerConfig
from fl_lightning.modules.learner import LocalLearner


class MultiClassClassifier(LocalLearner):
    """Cross-entropy on all n classes (FedAvg's ClientUpdate, Algorithm 1); with
    ``prox_mu`` > 0, FedProx's proximal term mu/2 ||w - w_start||^2 is added."""

    def __init__(self, network: nn.Module, optimizer: OptimizerConfig, prox_mu: float = 0.0) -> None:
        super().__init__(optimizer)
        # NHWC, like the inputs (LocalLearner.on_after_batch_transfer): mixed layouts make
        # oneDNN convert every activation back and forth.
        self.network = network.to(memory_format=torch.channels_last)
        self.prox_mu = prox_mu
        self._start = [p.detach().clone() for p in self.network.parameters()] if prox_mu > 0 else []

    def forward(self, x: Tensor) -> Tensor:
        return self.network(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x).float(), y)
        if self.prox_mu > 0:
            distance = sum(((p - p0.to(p.device)) ** 2).sum() for p, p0 in zip(self.network.parameters(), self._start))
            loss = loss + self.prox_mu / 2 * distance
        return loss

    def flat_state(self) -> dict[str, Tensor]:
        return {k: v.detach().cpu().clone() for k, v in self.network.state_dict().items()}
