"""Several independent copies of one architecture, held as one set of stacked tensors.

The parameters of G models are stacked along a new leading dimension. Two ways to
run them, with the same result:
- ``vmap``: ``torch.func.vmap`` turns the G small convolutions into one wide (first
  layer) or grouped convolution — what pays on a GPU;
- ``loop``: the copies run one after another on slices of the stacked tensors — what
  pays on a CPU, where oneDNN's grouped convolutions measured slower than separate ones
  (see bench/README.md).
Each copy's output depends on its own slice only, so the copies stay independent.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn
from torch.func import functional_call, stack_module_state, vmap


def stack_models(models: list[nn.Module]) -> dict[str, Tensor]:
    """Parameters of ``models`` stacked along dim 0: name -> tensor (G, ...)."""
    params, buffers = stack_module_state(models)
    if buffers:
        raise ValueError(f"stacked architectures must have no buffers (batch norm?), found {sorted(buffers)}")
    return {name: p.detach().clone() for name, p in params.items()}


class StackedModel(nn.Module):
    """G copies of ``template`` whose parameters are given stacked; forward returns (G, B, ...)."""

    def __init__(self, template: nn.Module, stacked: dict[str, Tensor], mode: str = "loop") -> None:
        super().__init__()
        if mode not in ("loop", "vmap"):
            raise ValueError(f"stacking mode {mode!r} must be 'loop' or 'vmap'")
        self.mode = mode
        # The template only lends its forward code; it lives on the meta device so its own
        # (unused) parameters cost no memory and never reach an optimizer.
        self._template = [copy.deepcopy(template).to("meta")]
        self.names = list(stacked)
        self.weights = nn.ParameterList([nn.Parameter(stacked[n].clone()) for n in self.names])

    @property
    def num_models(self) -> int:
        return self.weights[0].shape[0]

    def forward(self, x: Tensor) -> Tensor:
        template = self._template[0]

        def one_model(params, inputs):
            return functional_call(template, dict(zip(self.names, params)), (inputs,))

        if self.mode == "vmap":
            return vmap(one_model, in_dims=(0, None))(tuple(self.weights), x)
        # Conv weights follow the input's NHWC layout; otherwise oneDNN converts back and forth.
        layout = torch.channels_last if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) else None

        def weights_of(g):
            return [w[g].contiguous(memory_format=layout) if layout and w.dim() == 5 else w[g] for w in self.weights]

        return torch.stack([one_model(weights_of(g), x) for g in range(self.num_models)])

    def stacked_state(self) -> dict[str, Tensor]:
        return {n: p.detach().cpu().clone() for n, p in zip(self.names, self.weights)}
