"""What every client-side LightningModule shares: the local optimizer."""

from __future__ import annotations

from typing import Optional

import torch
from lightning.pytorch import LightningModule
from torch import nn

from fl_lightning.config import OptimizerConfig, check_optimizer


def build_optimizer(params, cfg: OptimizerConfig) -> torch.optim.Optimizer:
    check_optimizer(cfg)
    if cfg.name == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if cfg.name == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.name == "fim_lbfgs":
        raise ValueError("optimizer.name=fim_lbfgs trains the FedAvg family's classifiers and FedOVA's detectors "
                         "only (they pass it the batch's Fisher)")
    raise ValueError(f"optimizer.name={cfg.name!r} is unknown; choose sgd, adam or fim_lbfgs")


class LocalLearner(LightningModule):
    """Base of the client-side modules. A fresh optimizer per local fit, as in FedAvg's
    ClientUpdate, unless the client keeps its state (``optimizer.keep_state``,
    callbacks/optimizer_state.py, which reads ``exchanged_parameters``); never across clients."""

    def __init__(self, optimizer: OptimizerConfig) -> None:
        super().__init__()
        self.optimizer_cfg = optimizer

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        # NHWC activations: oneDNN's convolutions ran 1.6x faster that way on our CPUs
        # (bench/README.md); the arithmetic is the same up to float rounding.
        x, *rest = batch
        if x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return (x, *rest)

    def configure_optimizers(self):
        return build_optimizer(self.parameters(), self.optimizer_cfg)

    def exchanged_parameters(self) -> list[tuple[nn.Parameter, str, Optional[int]]]:
        """Each trained parameter with its place in the exchanged state (the task's params): its
        name there and the index of its copy along a stacked leading dimension (None: the whole
        tensor). By default ``self.network``'s parameters, named as in its state dict."""
        return [(param, name, None) for name, param in self.network.named_parameters()]
