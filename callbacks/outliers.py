"""Client-side Lightning callbacks that make FedOV's outliers for each training batch
(Algorithm 1, lines 5-6) and hand them to the ``OpenSetDetector`` as ``pl_module.outliers``."""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from lightning.pytorch import Callback
from torch import Tensor, nn

from fl_lightning.algorithms.fedov.destruction import destroy


class DataDestruction(Callback):
    """x' = DataDestruction(x): one destruction operation per image (Section 3.4).

    With the data's standardisation (``pixel_mean``, ``pixel_std``), the images are destroyed
    as [0, 1] pixels, as the paper's code does, and standardised again: every operation but
    erasing commutes with the per-channel affine map, and erasing then leaves black boxes
    rather than boxes of the mean colour."""

    def __init__(self, ops: Sequence[str], pixel_mean: Sequence[float] = (), pixel_std: Sequence[float] = ()) -> None:
        self.ops = tuple(ops)
        self.pixel_mean, self.pixel_std = tuple(pixel_mean), tuple(pixel_std)
        self.generator = torch.Generator()

    def on_fit_start(self, trainer, pl_module) -> None:
        # From the global RNG, which the client fit seeds: reproducible per client and round.
        self.generator.manual_seed(int(torch.randint(2**62, (1,))))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        pl_module.outliers["destroyed"] = self.destroy(batch[0])

    def destroy(self, x: Tensor) -> Tensor:
        if not self.pixel_std:
            return destroy(x, self.generator, self.ops)
        mean, std = (_per_channel(v, x) for v in (self.pixel_mean, self.pixel_std))
        return (destroy(x * std + mean, self.generator, self.ops) - mean) / std


def _per_channel(values: Sequence[float], x: Tensor) -> Tensor:
    if len(values) != x.shape[1]:
        raise ValueError(f"{len(values)} per-channel pixel statistics for inputs of {x.shape[1]} channels")
    return torch.tensor(values, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)


def fgsm_away_from(model: nn.Module, x: Tensor, label: int, steps: int, step_size: float | Tensor) -> Tensor:
    """``steps`` signed-gradient ascent steps on CE(model(x), label): the result looks less
    like ``label`` to the model. ``step_size`` may be per channel, shaped (1, C, 1, 1). Only
    the input is differentiated; parameters' gradients are left untouched. (The reference
    code projects onto an L-inf ball of 0.5, which 5 steps of 0.002 can never leave, so no
    projection is done.)"""
    x = x.detach()
    target = torch.full((len(x),), label, dtype=torch.long, device=x.device)
    with torch.enable_grad():
        for _ in range(steps):
            x = x.requires_grad_(True)
            loss = F.cross_entropy(model(x).float(), target)
            (grad,) = torch.autograd.grad(loss, x)
            x = (x + step_size * grad.sign()).detach()
    return x


class AdversarialOutlierEnhancement(Callback):
    """x'' = FGSM(f, x', unknown) (Section 3.5): the destroyed outliers are moved until the
    current local model takes them for a seen class; trained as "unknown", they tighten
    the boundary around the real data. Needs ``DataDestruction`` before it. With the data's
    ``pixel_std``, a step moves each [0, 1] pixel by ``step_size`` (the paper's units), i.e.
    a standardised input by step_size / std."""

    def __init__(self, steps: int = 5, step_size: float = 0.002, pixel_std: Sequence[float] = ()) -> None:
        if steps < 1 or step_size <= 0:
            raise ValueError(f"FGSM needs steps >= 1 and step_size > 0, got {steps} and {step_size}")
        self.steps, self.step_size, self.pixel_std = steps, step_size, tuple(pixel_std)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        destroyed = pl_module.outliers.get("destroyed")
        if destroyed is None:
            raise RuntimeError("AdversarialOutlierEnhancement needs the DataDestruction callback before it")
        step = self.step_size / _per_channel(self.pixel_std, destroyed) if self.pixel_std else self.step_size
        pl_module.outliers["enhanced"] = fgsm_away_from(pl_module.network, destroyed, pl_module.unknown,
                                                        self.steps, step)
