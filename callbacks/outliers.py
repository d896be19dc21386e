"""FedOV's outliers in a client's fit (Algorithm 1, lines 5-7): the Lightning callback that hands
each training batch its random draws — which destruction operation each image gets and its
parameters, PROSER's mixup pairs and lambda — drawn from the client's own generators in the
order of its steps. The module's objective (fl_lightning/algorithms/fedov/objective.py) makes
the destroyed and FGSM-enhanced outliers from them; the cohort engine reads the same draws."""

from __future__ import annotations

from typing import Optional

from lightning.pytorch import Callback

from fl_lightning.algorithms.fedov.draws import OpenSetDraws


class OutlierDraws(Callback):
    """``pl_module.step_draws`` for every training batch: ``OpenSetDraws`` of the client's
    ``seed`` (``fl_lightning.client.client_seed``), one step after another."""

    def __init__(self, loss, seed: int, image_size: tuple[int, int]) -> None:
        self.loss, self.seed, self.image_size = loss, seed, tuple(image_size)
        self.draws: Optional[OpenSetDraws] = None

    def on_fit_start(self, trainer, pl_module) -> None:
        self.draws = OpenSetDraws(self.loss, self.seed, self.image_size)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        x, y = batch[0], batch[1]
        if tuple(x.shape[-2:]) != self.image_size:
            raise ValueError(f"images of {tuple(x.shape[-2:])} but draws for {self.image_size}")
        # the optimizer steps taken so far: this batch's step (every batch is one step)
        drawn = self.draws.take(trainer.global_step, len(y))
        pl_module.step_draws = {name: t.to(x.device) for name, t in drawn.items()}
