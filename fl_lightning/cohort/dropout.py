"""Dropout as draws: every step's dropout masks drawn beforehand from the client's own generator.

``nn.Dropout`` draws its mask from the global generator inside the forward pass, which ties
a loss to one engine and to eager execution (under ``vmap`` it cannot draw at all). Here a
client's masks are data: ``DropoutMasks`` draws them on the host, step after step, from a
generator seeded by the client seed, and ``DrawnDropout`` layers apply them. The per-client
module reads them through the callback callbacks/dropout.py ``DropoutDraws``; the cohort
engine reads the same draws for each member as ``StepDraws`` (a window of steps at a time),
so both engines drop the same units by construction.
"""

from __future__ import annotations

import copy
from typing import Optional

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn.modules.dropout import _DropoutNd

from fl_lightning.functional import replace_layers

DROPOUT_STREAM = 0xD0  # the dropout generator's seed: SeedSequence([client seed, DROPOUT_STREAM])

#: a network's dropout layers that drop something: name -> (p, the shape of one sample's input)
Layers = dict[str, tuple[float, tuple[int, ...]]]


def has_other_dropout(network: nn.Module) -> bool:
    """Dropout of another kind than ``nn.Dropout``'s (whole channels, alpha dropout): not drawn here."""
    return any(isinstance(m, _DropoutNd) and type(m) not in (nn.Dropout, DrawnDropout) for m in network.modules())


def dropout_layers(network: nn.Module, sample_shape: tuple[int, ...]) -> Layers:
    """The ``nn.Dropout`` layers of ``network`` with p > 0 and the shape of one sample's input to
    each, found by running a copy on the meta device (no arithmetic) on inputs of ``sample_shape``."""
    if not any(isinstance(m, nn.Dropout) and m.p > 0 for m in network.modules()):
        return {}  # most networks: no copy to trace on every client's fit
    meta = copy.deepcopy(network).to("meta").eval()
    found: Layers = {}

    def record(name: str, p: float):
        def hook(module, args, out) -> None:  # returns nothing: the output stays the layer's
            found.setdefault(name, (p, tuple(args[0].shape[1:])))

        return hook

    for name, module in meta.named_modules():
        if isinstance(module, nn.Dropout) and module.p > 0:
            module.register_forward_hook(record(name, module.p))
    meta(torch.zeros((2, *sample_shape), device="meta"))
    return found


class DropoutMasks:
    """One client's dropout masks, step after step (a ``members.DrawSource``): for every layer of
    ``layers``, whether each unit of each real sample is kept (probability 1 - p), from a generator
    seeded by the client's ``seed``."""

    def __init__(self, layers: Layers, seed: int) -> None:
        self.layers = layers
        own = int(np.random.SeedSequence([seed, DROPOUT_STREAM]).generate_state(1)[0])
        self.generator = torch.Generator().manual_seed(own)
        self.last_step = -1

    def take(self, step: int, n: int, width: int = 0) -> dict[str, Tensor]:
        """Step ``step``'s keep masks for ``n`` real samples, padded to ``width`` rows (default n;
        padding drops everything): layer name -> bool (width, *shape). Steps are taken in order; a
        step that trains on nothing (a lone sample under batch norm) takes nothing."""
        if step <= self.last_step:
            raise RuntimeError(f"dropout masks taken out of turn: step {step} asked after step {self.last_step}")
        self.last_step = step
        width = width or n
        if width < n:
            raise ValueError(f"a batch of {n} samples does not fit a width of {width}")
        masks = {}
        for name, (p, shape) in self.layers.items():
            mask = torch.zeros((width, *shape), dtype=torch.bool)
            mask[:n] = torch.rand((n, *shape), generator=self.generator) >= p
            masks[name] = mask
        return masks


class StepMasks:
    """The masks the ``DrawnDropout`` layers of one network apply in the current step (None: no
    masks were drawn; the layers then draw as nn.Dropout does)."""

    def __init__(self) -> None:
        self.masks: Optional[dict[str, Tensor]] = None


class DrawnDropout(nn.Dropout):
    """``nn.Dropout`` applying the step's drawn keep mask (``StepMasks``), scaled by 1 / (1 - p) as
    nn.Dropout scales; without masks (a forward pass outside a client's fit) it is nn.Dropout."""

    def __init__(self, layer: nn.Dropout, name: str, step: StepMasks) -> None:
        super().__init__(layer.p)
        self.name, self.step = name, step

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0:
            return x
        if self.step.masks is None:
            return super().forward(x)
        scale = 1.0 / (1.0 - self.p) if self.p < 1 else 0.0
        return x * self.step.masks[self.name].to(x.dtype) * scale


def drawn_dropout(network: nn.Module) -> StepMasks:
    """Swaps (in place) every ``nn.Dropout`` of ``network`` for a ``DrawnDropout``; the masks they read."""
    step = StepMasks()
    replace_layers(network, lambda m: type(m) is nn.Dropout, lambda name, m: DrawnDropout(m, name, step))
    return step
