"""Client-side Lightning callbacks that make FedOV's outliers for each training batch
(Algorithm 1, lines 5-6) and hand them to the ``OpenSetDetector`` as ``pl_module.outliers``."""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from lightning.pytorch import Callback
from torch import Tensor, nn

from fl_lightning.outliers.destruction import destroy


class DataDestruction(Callback):
    """x' = DataDestruction(x): one destruction operation per image (Section 3.4)."""

    def __init__(self, ops: Sequence[str]) -> None:
        self.ops = tuple(ops)
        self.generator = torch.Generator()

    def on_fit_start(self, trainer, pl_module) -> None:
        # From the global RNG, which the client fit seeds: reproducible per client and round.
        self.generator.manual_seed(int(torch.randint(2**62, (1,))))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        pl_module.outliers["destroyed"] = destroy(batch[0], self.generator, self.ops)


def fgsm_away_from(model: nn.Module, x: Tensor, label: int, steps: int, step_size: float) -> Tensor:
    """``steps`` signed-gradient ascent steps on CE(model(x), label): the result looks less
    like ``label`` to the model. Only the input is differentiated; parameters' gradients
    are left untouched. (The reference code projects onto an L-inf ball of 0.5, which
    5 steps of 0.002 can never leave, so no projection is done.)"""
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
    the boundary around the real data. Needs ``DataDestruction`` before it."""

    def __init__(self, steps: int = 5, step_size: float = 0.002) -> None:
        if steps < 1 or step_size <= 0:
            raise ValueError(f"FGSM needs steps >= 1 and step_size > 0, got {steps} and {step_size}")
        self.steps, self.step_size = steps, step_size

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        destroyed = pl_module.outliers.get("destroyed")
        if destroyed is None:
            raise RuntimeError("AdversarialOutlierEnhancement needs the DataDestruction callback before it")
        pl_module.outliers["enhanced"] = fgsm_away_from(pl_module.network, destroyed, pl_module.unknown,
                                                        self.steps, self.step_size)
