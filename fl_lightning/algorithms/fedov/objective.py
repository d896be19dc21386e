"""FedOV's local objective (ICLR 2023, Section 3 and Algorithm 1, lines 4-8), written once.

n + 1 outputs: the n classes of the data set and "unknown" (index n). The local loss is

    L = CE(f(x), y)                                  real data
      + beta  * CE(f(x) without y, unknown)          PROSER's dummy classifier (Eq. 1)
      + gamma * CE(post(lam*pre(x_i) + (1-lam)*pre(x_j)), unknown)   PROSER's manifold mixup
      + w_dd  * CE(f(DataDestruction(x)), unknown)   Section 3.4
      + w_aoe * CE(f(FGSM(f, DataDestruction(x))), unknown)           Section 3.5

as a pure function of the network's parameters, a batch with per-sample weights (1 real, 0
padding) and the step's random draws (draws.py). The client's LightningModule calls it on its
own parameters; the cohort engine vmaps it over members.

Precision: the outliers (destruction and FGSM's input gradient) are made in float32 with
autocast off, in both engines; under bf16-mixed only the training forward passes run in bf16.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

from fl_lightning.algorithms.fedov.destruction import DESTRUCTION_OPS, apply_destruction, check_ops
from fl_lightning.functional import Forward, weighted_mean


@dataclass(frozen=True)
class OpenSetLoss:
    """Weights and settings of the local open-set loss. Defaults: the numbers FedOV's paper prints
    (Appendix B.1, ``reading: text``); the ``FedOV`` strategy defaults to its authors' code
    (PROSER's weights 1 / 0.01, their destruction pool: voting.py, docs/reproduction_readings.md).

    Attributes:
        dummy_weight: beta, PROSER's dummy-classifier term (paper: 0.01).
        mixup_weight: gamma, PROSER's embedding-mixup term (paper: 1).
        mixup_alpha: lambda ~ Beta(alpha, alpha) (the reference code: Beta(1, 1)).
        destruction_weight: the data-destruction outliers' term (0 turns it off; the outliers
            are still made when ``adversarial_weight`` needs them, as in the paper's Table 9).
        adversarial_weight: the FGSM-enhanced outliers' term (0: no enhancement at all).
        fgsm_steps, fgsm_step_size: FGSM iterations and step (paper: 5 and 0.002).
        destruction_ops: the operations one of which is drawn per outlier.
        pixel_mean, pixel_std: the inputs' standardisation x = (pixel - mean) / std. With
            them, outliers are made and FGSM steps taken on [0, 1] pixels, as in the paper
            and its code: erased boxes are black and a step moves a pixel by 0.002.
            Empty: both act on the inputs as given.
    """

    dummy_weight: float = 0.01
    mixup_weight: float = 1.0
    mixup_alpha: float = 1.0
    destruction_weight: float = 1.0
    adversarial_weight: float = 1.0
    fgsm_steps: int = 5
    fgsm_step_size: float = 0.002
    destruction_ops: tuple[str, ...] = DESTRUCTION_OPS
    pixel_mean: tuple[float, ...] = ()
    pixel_std: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if len(self.pixel_mean) != len(self.pixel_std) or any(s <= 0 for s in self.pixel_std):
            raise ValueError(f"pixel_mean {self.pixel_mean} and pixel_std {self.pixel_std} must have one entry "
                             "per channel, std > 0 (or both be empty)")
        if self.needs_destruction:
            check_ops(self.destruction_ops)
        if self.adversarial_weight > 0 and (self.fgsm_steps < 1 or self.fgsm_step_size <= 0):
            raise ValueError(f"FGSM needs fgsm_steps >= 1 and fgsm_step_size > 0, got {self.fgsm_steps} and "
                             f"{self.fgsm_step_size} (adversarial_weight 0 turns it off)")

    def weights(self) -> dict[str, float]:
        return {"ce": 1.0, "dummy": self.dummy_weight, "mixup": self.mixup_weight,
                "destroyed": self.destruction_weight, "enhanced": self.adversarial_weight}

    @property
    def needs_destruction(self) -> bool:
        return self.destruction_weight > 0 or self.adversarial_weight > 0


def _per_channel(values, x: Tensor) -> Tensor:
    if len(values) != x.shape[1]:
        raise ValueError(f"{len(values)} per-channel pixel statistics for inputs of {x.shape[1]} channels")
    # filled on the device (no host-to-device copy, which a CUDA graph capture refuses)
    return torch.stack([torch.full((), float(v), dtype=x.dtype, device=x.device) for v in values]).view(1, -1, 1, 1)


def destroyed(x: Tensor, op: Tensor, op_args: Tensor, loss: OpenSetLoss) -> Tensor:
    """x' = DataDestruction(x) with the drawn operations. With the data's standardisation
    (``loss.pixel_mean``/``pixel_std``) the images are destroyed as [0, 1] pixels, as the paper's
    code does, and standardised again: every operation but erasing commutes with the per-channel
    affine map, and erasing then leaves black boxes rather than boxes of the mean colour."""
    if not loss.pixel_std:
        return apply_destruction(x, op, op_args, loss.destruction_ops)
    mean, std = _per_channel(loss.pixel_mean, x), _per_channel(loss.pixel_std, x)
    return (apply_destruction(x * std + mean, op, op_args, loss.destruction_ops) - mean) / std


def fgsm_step_size(loss: OpenSetLoss, x: Tensor) -> Tensor | float:
    """FGSM's step on the inputs: ``loss.fgsm_step_size`` in [0, 1] pixel units (the paper's),
    i.e. step / std per channel on standardised inputs."""
    return loss.fgsm_step_size / _per_channel(loss.pixel_std, x) if loss.pixel_std else loss.fgsm_step_size


def fgsm_away_from(forward: Forward, params: Mapping[str, Tensor], x: Tensor, weight: Tensor, label: int, steps: int,
                   step_size: Tensor | float) -> Tensor:
    """``steps`` signed-gradient ascent steps on CE(f(x), label) over the real samples: the result
    looks less like ``label`` to the model (Section 3.5). Only the input is differentiated (the
    parameters are held constant). (The reference code projects onto an L-inf ball of 0.5, which
    5 steps of 0.002 can never leave, so no projection is done.)"""
    from torch.func import grad

    frozen = {n: p.detach() for n, p in params.items()}
    target = torch.full(weight.shape, label, dtype=torch.long, device=x.device)

    def outlier_loss(inputs: Tensor) -> Tensor:
        return (F.cross_entropy(forward(frozen, inputs).float(), target, reduction="none") * weight).sum()

    x = x.detach()
    for _ in range(steps):
        x = (x + step_size * grad(outlier_loss)(x).sign()).detach()
    return x


def outliers(forward: Forward, params: Mapping[str, Tensor], x: Tensor, weight: Tensor, draws: Mapping[str, Tensor],
             loss: OpenSetLoss, unknown: int) -> dict[str, Tensor]:
    """Algorithm 1, lines 5-6: the destroyed outliers and their FGSM enhancement (the current
    model moves them until it takes them for a seen class), in float32 whatever the autocast."""
    if not loss.needs_destruction:
        return {}
    with torch.autocast(x.device.type, enabled=False):
        made = {"destroyed": destroyed(x.float(), draws["op"], draws["op_args"], loss)}
        if loss.adversarial_weight > 0:
            made["enhanced"] = fgsm_away_from(forward, params, made["destroyed"], weight, unknown, loss.fgsm_steps,
                                              fgsm_step_size(loss, made["destroyed"]))
    return made


def open_set_terms(forward: Forward, params: Mapping[str, Tensor], x: Tensor, y: Tensor, weight: Tensor,
                   draws: Mapping[str, Tensor], loss: OpenSetLoss, unknown: int) -> dict[str, Tensor]:
    """The unweighted terms of L whose weight is not 0, on the outliers the draws make."""
    made = outliers(forward, params, x, weight, draws, loss, unknown)
    return terms_with_outliers(forward, params, x, y, weight, made, draws, loss, unknown)


def terms_with_outliers(forward: Forward, params: Mapping[str, Tensor], x: Tensor, y: Tensor, weight: Tensor,
                        made: Mapping[str, Tensor], draws: Mapping[str, Tensor], loss: OpenSetLoss,
                        unknown: int) -> dict[str, Tensor]:
    """The terms on given outliers ``made`` ("destroyed", "enhanced"); ``draws`` gives the mixup's
    ``pair`` and ``lam``. One forward pass for the real data and every outlier set: without batch
    norm, concatenating changes nothing."""
    weights = loss.weights()
    kinds = [k for k in ("destroyed", "enhanced") if k in made and weights[k] != 0]
    features = forward(params, torch.cat([x, *(made[k] for k in kinds)]), "features")
    chunks = forward(params, features, "head").float().split(len(x))
    real = chunks[0]
    target_unknown = torch.full_like(y, unknown)

    def ce(logits: Tensor, target: Tensor, mask: Tensor) -> Tensor:
        return weighted_mean(F.cross_entropy(logits, target, reduction="none"), mask)

    terms = {"ce": ce(real, y, weight)}
    if weights["dummy"] != 0:
        # Without its true class, "unknown" must be the runner-up.
        true_class = torch.arange(real.shape[1], device=y.device) == y[:, None]  # one_hot checks values: no vmap
        terms["dummy"] = ce(real.masked_fill(true_class, float("-inf")), target_unknown, weight)
    for kind, logits in zip(kinds, chunks[1:]):
        terms[kind] = ce(logits, target_unknown, weight)
    if weights["mixup"] != 0:
        # Embeddings of pairs from different classes, interpolated, are "unknown"; pairs of one
        # class count for nothing (the reference code's ignore_index): 0 when there are none.
        pair, lam = draws["pair"], draws["lam"]
        different = (y != y[pair]).to(weight.dtype) * weight
        real_features = features[: len(x)]
        mixed = lam * real_features + (1 - lam) * real_features[pair]
        terms["mixup"] = ce(forward(params, mixed, "head").float(), target_unknown, different)
    return terms


def open_set_objective(forward: Forward, params: Mapping[str, Tensor], x: Tensor, y: Tensor, weight: Tensor,
                       draws: Mapping[str, Tensor], loss: OpenSetLoss, unknown: int) -> Tensor:
    """L, the terms weighted by ``loss.weights()`` (an ``OpenSetLoss``)."""
    weights = loss.weights()
    terms = open_set_terms(forward, params, x, y, weight, draws, loss, unknown)
    return sum(weights[name] * term for name, term in terms.items())
