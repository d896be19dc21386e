"""What every client-side LightningModule shares: the local optimizer."""

from __future__ import annotations

import torch
from lightning.pytorch import LightningModule

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
    ClientUpdate: optimizer state never crosses rounds or clients."""

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
