"""Several independent copies of one architecture, exchanged as one set of stacked tensors.

The parameters of G models travel stacked along a new leading dimension (name ->
tensor (G, ...)). Two ways to run them, with the same result:
- ``vmap``: ``torch.func.vmap`` turns the G small convolutions into one wide (first
  layer) or grouped convolution — what pays on a GPU;
- ``loop``: G ordinary module copies in NHWC layout run one after another — what pays
  on a CPU, where oneDNN's grouped convolutions and per-call parameter swapping measured
  slower than plain modules (bench/README.md).
Each copy's output depends on its own parameters only, so the copies stay independent.
Batch norm's running statistics travel stacked beside the parameters (a detector on MobileNet):
each copy keeps its own; ``vmap`` runs such copies in evaluation only (their statistics are
updated in place, which vmap cannot do; the loop and the cohort engine train them).
"""

from __future__ import annotations

import copy
from typing import Optional

import torch
from torch import Tensor, nn
from torch.func import functional_call, stack_module_state, vmap


def stack_models(models: list[nn.Module]) -> dict[str, Tensor]:
    """State dicts of ``models`` (parameters and batch norm's running statistics) stacked
    along dim 0: name -> tensor (G, ...), in state-dict order."""
    params, buffers = stack_module_state(models)
    order = list(models[0].state_dict())
    stacked = {**params, **buffers}
    return {name: stacked[name].detach().clone() for name in order}


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
            parameters = {n for n, _ in template.named_parameters()}
            self.weights = nn.ParameterList([nn.Parameter(stacked[n].clone()) for n in self.names if n in parameters])
            self.buffer_names = [n for n in self.names if n not in parameters]
            for k, n in enumerate(self.buffer_names):  # moved with the module, never trained
                self.register_buffer(f"stacked_buffer_{k}", stacked[n].clone())
        else:
            self.copies = nn.ModuleList()
            for g in range(count):
                model = copy.deepcopy(template)
                model.load_state_dict({n: stacked[n][g] for n in self.names})
                self.copies.append(model.to(memory_format=torch.channels_last))

    @property
    def architecture(self) -> nn.Module:
        """One copy's network (loop), or the template lending vmap its code: the layers every copy has."""
        return self.copies[0] if self.mode == "loop" else self._template[0]

    @property
    def num_models(self) -> int:
        return len(self.copies) if self.mode == "loop" else self.weights[0].shape[0]

    def _stacked_buffers(self) -> list[Tensor]:
        return [getattr(self, f"stacked_buffer_{k}") for k in range(len(self.buffer_names))]

    def forward(self, x: Tensor) -> Tensor:
        if self.mode == "loop":
            return torch.stack([model(x) for model in self.copies])
        if self.buffer_names and self.training:
            raise ValueError("stacking 'vmap' trains networks without batch norm only (vmap cannot update "
                             "running statistics in place): use stacking 'loop' or the cohort engine")
        template = self._template[0].train(self.training)
        names = [n for n in self.names if n not in self.buffer_names] + self.buffer_names

        def one_model(tensors, inputs):
            return functional_call(template, dict(zip(names, tensors)), (inputs,))

        return vmap(one_model, in_dims=(0, None))((*self.weights, *self._stacked_buffers()), x)

    def exchanged_parameters(self) -> list[tuple[nn.Parameter, str, Optional[int]]]:
        """Each trained tensor with its place in ``stacked_state``: (tensor, name, copy index),
        the index None for vmap's stacked tensors (every copy at once)."""
        if self.mode == "vmap":
            names = [n for n in self.names if n not in self.buffer_names]
            return [(param, name, None) for name, param in zip(names, self.weights)]
        return [(param, name, g) for g, model in enumerate(self.copies) for name, param in model.named_parameters()]

    def stacked_state(self) -> dict[str, Tensor]:
        """Every copy's state dict (parameters and running statistics), stacked, in state-dict order."""
        if self.mode == "vmap":
            tensors = dict(zip([n for n in self.names if n not in self.buffer_names] + self.buffer_names,
                               [*self.weights, *self._stacked_buffers()]))
            return {n: tensors[n].detach().cpu().clone() for n in self.names}
        states = [model.state_dict() for model in self.copies]
        return {n: torch.stack([s[n].detach().cpu().contiguous() for s in states]) for n in self.names}
