"""What a local objective is written against, so that both engines can call it: a network's
forward as a function of explicit parameters, and the mean over a padded batch.

An algorithm's objective is one pure function of (parameters, constants, batch, sample
weights, that step's random draws). The per-client engine calls it with a LightningModule's
own parameters and all weights 1; the cohort engine vmaps it over stacked members whose
batches are padded (weight 0) to a common width.
"""

from __future__ import annotations

from typing import Callable

from torch import Tensor, nn
from torch.func import functional_call

#: ``forward(params, x, part="")``: the architecture applied with ``params`` (``part``: only that
#: submodule, e.g. "features", reading the parameters under its prefix)
Forward = Callable[..., Tensor]


def functional_forward(network: nn.Module) -> Forward:
    """``network``'s forward with the parameters passed in (its own, or a member's under vmap;
    a network on the meta device lends only its code)."""

    def forward(params: dict[str, Tensor], inputs: Tensor, part: str = "") -> Tensor:
        if not part:
            return functional_call(network, params, (inputs,))
        prefix = part + "."
        own = {n[len(prefix):]: t for n, t in params.items() if n.startswith(prefix)}
        return functional_call(network.get_submodule(part), own, (inputs,))

    return forward


def weighted_mean(per_sample: Tensor, weight: Tensor) -> Tensor:
    """The mean over a batch's real samples (padding has weight 0): equal to the plain mean
    of the unpadded batch, which is what the member would compute alone."""
    return (per_sample * weight).sum() / weight.sum().clamp(min=1)


def replace_layers(network: nn.Module, chosen: Callable[[nn.Module], bool],
                   make: Callable[[str, nn.Module], nn.Module]) -> None:
    """Swaps (in place) every submodule of ``network`` that is ``chosen`` for ``make(its dotted
    name, it)``, e.g. batch norm and dropout layers for ones that read a step's inputs."""
    for name, module in list(network.named_modules()):
        if name and chosen(module):
            parent, _, child = name.rpartition(".")
            setattr(network.get_submodule(parent), child, make(name, module))
