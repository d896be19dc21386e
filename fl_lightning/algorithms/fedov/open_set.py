"""FedOV's local open-set classifier (ICLR 2023, Section 3 and Algorithm 1, lines 2-8): the
LightningModule a client trains, and its client plug-in.

The loss is objective.py's ``open_set_objective``, called on the module's own parameters; each
step's random draws (destruction operations, mixup pairs and lambda) come from the client's own
generators through the ``callbacks.outliers.OutlierDraws`` callback, the same draws the cohort
engine reads (open_set_cohort.py).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Optional

import torch
from torch import Tensor, nn

from fl_lightning.algorithms.fedov.objective import OpenSetLoss, open_set_objective, open_set_terms
from fl_lightning.config import OptimizerConfig
from fl_lightning.functional import functional_forward
from fl_lightning.messages import ClientResult, ClientTask, task_settings
from fl_lightning.modules.learner import LocalLearner
from fl_lightning.plugins import ClientPlugin, register_client_plugin

__all__ = ["OpenSetClient", "OpenSetDetector", "OpenSetLoss", "open_set_task", "task_loss"]


class OpenSetDetector(LocalLearner):
    """A client's (n + 1)-way classifier. ``network`` must expose ``features`` (PROSER's
    phi_pre) and ``head`` (phi_post), with ``forward = head(features(x))``."""

    def __init__(self, network: nn.Module, num_classes: int, optimizer: OptimizerConfig,
                 loss: OpenSetLoss = OpenSetLoss()) -> None:
        super().__init__(optimizer)
        if not (hasattr(network, "features") and hasattr(network, "head")):
            raise ValueError(f"{type(network).__name__} has no features/head split, which PROSER's mixup needs")
        self.network = network.to(memory_format=torch.channels_last)
        self.unknown = num_classes  # the extra, last output
        self.loss = loss
        self.functional = functional_forward(self.network)
        #: this step's random draws (OpenSetDraws.take), handed over by callbacks.outliers.OutlierDraws
        self.step_draws: Optional[dict[str, Tensor]] = None

    def forward(self, x: Tensor) -> Tensor:
        return self.network(x)

    def _objective_args(self, x: Tensor, y: Tensor, draws: dict[str, Tensor]) -> tuple:
        return (self.functional, dict(self.network.named_parameters()), x, y,
                torch.ones(len(y), device=x.device), draws, self.loss, self.unknown)

    def loss_terms(self, x: Tensor, y: Tensor, draws: dict[str, Tensor]) -> dict[str, Tensor]:
        """The unweighted terms of the loss on one batch with the given draws."""
        return open_set_terms(*self._objective_args(x, y, draws))

    def training_step(self, batch, batch_idx):
        x, y = batch
        draws, self.step_draws = self.step_draws, None  # each step's draws are used once
        if draws is None:
            raise RuntimeError("OpenSetDetector needs each step's random draws: train it with the "
                               "callbacks.outliers.OutlierDraws callback (OpenSetClient adds it)")
        return open_set_objective(*self._objective_args(x, y, draws))

    def flat_state(self) -> dict[str, Tensor]:
        return {k: v.detach().cpu().clone() for k, v in self.network.state_dict().items()}


def open_set_task(client_id: int, params: dict[str, Tensor], optimizer: OptimizerConfig, num_classes: int,
                  loss: OpenSetLoss) -> ClientTask:
    """Train an (n + 1)-way open-set classifier with ``loss`` (FedOV's client, Algorithm 1)."""
    settings = task_settings(optimizer, num_classes=num_classes, open_set=asdict(loss))
    return ClientTask(client_id, "open_set", params, settings=settings)


def task_loss(task: ClientTask) -> OpenSetLoss:
    """The ``OpenSetLoss`` an open-set task carries (its JSON lists back to tuples)."""
    raw = task.settings["open_set"]
    return OpenSetLoss(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()})


class OpenSetClient(ClientPlugin):
    def build(self, ctx, task, client_state):
        from fl_lightning.algorithms.baselines.classifier import client_network

        return OpenSetDetector(client_network(ctx, task), task.settings["num_classes"], task.optimizer,
                               task_loss(task))

    def fit_callbacks(self, ctx, task, seed):
        from fl_lightning.callbacks.outliers import OutlierDraws

        return [OutlierDraws(task_loss(task), seed, tuple(ctx.x.shape[-2:]))]

    def result(self, task, module, num_samples, steps, loss, client_state):
        return ClientResult(task.client_id, module.flat_state(), num_samples, task.classes, loss, steps)


register_client_plugin("open_set", OpenSetClient())
