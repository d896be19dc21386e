"""Several independent copies of one architecture, exchanged as one set of stacked tensors.

The parameters of G models travel stacked along a new leading dimension (name ->
tensor (G, ...)). Two ways to run them, with the same result:
- ``vmap``: ``torch.func.vmap`` turns the G small convolutions into one wide (first
  layer) or grouped convolution — what pays on a GPU;
- ``loop``: G ordinary module copies in NHWC layout run one after another — what pays
  on a CPU, where oneDNN's grouped convolutions and per-call parameter swapping measured
  slower than plain modules (bench/README.md).
Each copy's output depends on its own parameters only, so the copies stay independent.
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
    """G copies of ``template`` built from stacked parameters; forward returns (G, B, ...)."""

    def __init__(self, template: nn.Module, stacked: dict[str, Tensor], mode: str = "loop") -> None:
        super().__init__()
        if mode not in ("loop", "vmap"):
            raise ValueError(f"stacking mode {mode!r} must be 'loop' or 'vmap'")
        self.mode = mode
        self.names = list(stacked)
        count = next(iter(stacked.values())).shape[0]
        if mode == "vmap":
            # The template only lends its forward code; on the meta device its own
            # parameters cost no memory and never reach an optimizer.
            self._template = [copy.deepcopy(template).to("meta")]
            self.weights = nn.ParameterList([nn.Parameter(stacked[n].clone()) for n in self.names])
        else:
            self.copies = nn.ModuleList()
            for g in range(count):
                model = copy.deepcopy(template)
                model.load_state_dict({n: stacked[n][g] for n in self.names})
                self.copies.append(model.to(memory_format=torch.channels_last))

    @property
    def num_models(self) -> int:
        return len(self.copies) if self.mode == "loop" else self.weights[0].shape[0]

    def forward(self, x: Tensor) -> Tensor:
        if self.mode == "loop":
            return torch.stack([model(x) for model in self.copies])
        template = self._template[0]

        def one_model(params, inputs):
            return functional_call(template, dict(zip(self.names, params)), (inputs,))

        return vmap(one_model, in_dims=(0, None))(tuple(self.weights), x)

    def stacked_state(self) -> dict[str, Tensor]:
        if self.mode == "vmap":
            return {n: p.detach().cpu().clone() for n, p in zip(self.names, self.weights)}
        states = [dict(model.named_parameters()) for model in self.copies]
        return {n: torch.stack([s[n].detach().cpu().contiguous() for s in states]) for n in self.names}
