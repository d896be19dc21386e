"""Dropout as draws in a client's fit: the Lightning callback that hands each training batch its
dropout masks, drawn by ``fl_lightning.cohort.dropout.DropoutMasks`` from the client's own
generator in the order of its steps; the module's ``DrawnDropout`` layers apply them. The cohort
engine reads the same draws, so both engines drop the same units."""

from __future__ import annotations

from typing import Optional

from lightning.pytorch import Callback

from fl_lightning.cohort.dropout import DropoutMasks, dropout_layers


class DropoutDraws(Callback):
    """``pl_module.dropout.masks`` for every training batch the module trains on
    (``pl_module.trains_on``), from ``DropoutMasks`` of the client's ``seed``
    (``fl_lightning.client.client_seed``); ``sample_shape``: one input's shape. A module whose
    network has no dropout draws nothing."""

    def __init__(self, seed: int, sample_shape: tuple[int, ...]) -> None:
        self.seed, self.sample_shape = seed, tuple(sample_shape)
        self.draws: Optional[DropoutMasks] = None

    def on_fit_start(self, trainer, pl_module) -> None:
        layers = dropout_layers(pl_module.network, self.sample_shape)
        self.draws = DropoutMasks(layers, self.seed) if layers else None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        x, y = batch[0], batch[1]
        if self.draws is None or not pl_module.trains_on(len(y)):
            return  # a skipped batch draws nothing: the cohort's plan skips its step too
        # the optimizer steps taken so far: this batch's step
        drawn = self.draws.take(trainer.global_step, len(y))
        pl_module.dropout.masks = {name: mask.to(x.device) for name, mask in drawn.items()}

    def on_fit_end(self, trainer, pl_module) -> None:
        pl_module.dropout.masks = None  # later forward passes (outside this fit) draw as nn.Dropout does
