"""A client's local optimizer state kept from one of its rounds to its next
(``optimizer.keep_state``).

FedAvg's ClientUpdate starts every local fit with a fresh optimizer. A client that builds and
compiles its model once and calls ``fit`` in each round it is sampled (the Keras clients of
ATHENA-FL's code, ``client.py``) keeps its optimizer's moments and step count instead: the
server's weights replace the model's, not the optimizer's. This callback restores what the
client kept before its fit and reads it back after, keyed by the task's kind and each
parameter's name, so that a state follows the parameter it belongs to; a task of another class
set than the kept one (another set of detectors) starts afresh."""

from __future__ import annotations

from typing import Sequence

import torch
from lightning.pytorch import Callback

from fl_lightning.messages import State, prefixed

#: where the kept state lives in a client's state (``ClientResult.client_state``)
PREFIX = "optimizer_state/"
_CLASSES = "classes"


class KeptOptimizerState(Callback):
    """Restores the optimizer state of ``kept`` (a client's state) into the fit's optimizers at
    the start of training and leaves the state they end with in ``self.kept`` (to be merged
    into the client's state by ``merged``). ``kind`` and ``classes``: the task's."""

    def __init__(self, kind: str, classes: Sequence[int], kept: State) -> None:
        self.prefix = f"{PREFIX}{kind}/"
        self.classes = torch.tensor([int(c) for c in classes], dtype=torch.long)
        own = prefixed(kept, self.prefix)
        same_task = _CLASSES in own and torch.equal(own[_CLASSES], self.classes)
        self.restore: State = own if same_task else {}
        self.kept: State = {}

    def on_train_start(self, trainer, pl_module) -> None:
        for name, param, optimizer in _named_optimized(trainer, pl_module):
            saved = prefixed(self.restore, name + "/")
            if not saved:
                continue
            for key, value in saved.items():
                if key != "step" and value.shape != param.shape:
                    raise ValueError(f"optimizer.keep_state: the kept {key!r} of parameter {name!r} has shape "
                                     f"{tuple(value.shape)}, the parameter {tuple(param.shape)}")
            # as Optimizer.load_state_dict: the step count stays where it was kept, the moments
            # follow the parameter's device and dtype; copies, since the optimizer updates them
            # in place and the kept state must stay what the client's last fit left
            optimizer.state[param] = {key: value.clone() if key == "step"
                                      else value.to(param.device, param.dtype, copy=True) for key, value in saved.items()}

    def on_train_end(self, trainer, pl_module) -> None:
        kept = {self.prefix + _CLASSES: self.classes}
        for name, param, optimizer in _named_optimized(trainer, pl_module):
            for key, value in optimizer.state.get(param, {}).items():
                if torch.is_tensor(value):
                    kept[f"{self.prefix}{name}/{key}"] = value.detach().to("cpu", copy=True)
        self.kept = kept

    def merged(self, client_state: State) -> State:
        """``client_state`` with this task kind's kept optimizer state replaced by the fit's."""
        return {**{k: v for k, v in client_state.items() if not k.startswith(self.prefix)}, **self.kept}


def _named_optimized(trainer, pl_module):
    """(parameter name, parameter, its optimizer) for every parameter the fit's optimizers step."""
    names = {id(p): n for n, p in pl_module.named_parameters()}
    for optimizer in trainer.optimizers:
        for group in optimizer.param_groups:
            for param in group["params"]:
                yield names[id(param)], param, optimizer
