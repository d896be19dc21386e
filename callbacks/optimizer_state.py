"""A client's local optimizer state kept from one of its rounds to its next
(``optimizer.keep_state``).

FedAvg's ClientUpdate starts every local fit with a fresh optimizer. A client that builds and
compiles its model once and calls ``fit`` in each round it is sampled (the Keras clients of
ATHENA-FL's code, ``client.py``) keeps its optimizer's moments and step count instead: the
server's weights replace the model's, not the optimizer's.

The kept state is laid out as the task's exchanged parameters (``ClientTask.params``), whichever
engine trained it: ``optimizer_state/<task kind>/<parameter name>/<key>`` (``exp_avg``,
``exp_avg_sq``, ``momentum_buffer``: the parameter's shape; ``step``: one count, or one per
stacked copy), beside the class set it belongs to. So a state follows the parameter it belongs
to through a per-client fit (this callback, with the module's ``exchanged_parameters``: a
detector copy of the loop stacking, or vmap's stacked tensor) or the cohort engine (one member per
copy, ``CohortPlugin.member_slices``), and a task of another class set than the kept one
(another set of detectors) starts afresh."""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import torch
from lightning.pytorch import Callback
from torch import Tensor

from fl_lightning.messages import State, prefixed

#: where the kept state lives in a client's state (``ClientResult.client_state``)
PREFIX = "optimizer_state/"
_CLASSES = "classes"
STEP = "step"  # Adam's step count, as torch.optim.Adam names it

#: one trained tensor's optimizer state in the exchanged layout: (its parameter's name there, the
#: index of its copy along the stacked leading dimension (None: the whole tensor), key -> tensor)
Slot = tuple[str, Optional[int], dict[str, Tensor]]


def kept_for(kind: str, classes: Sequence[int], client_state: State) -> State:
    """What the client kept for tasks of ``kind`` (names without the prefix); empty when it
    kept none, or kept another class set's."""
    own = prefixed(client_state, f"{PREFIX}{kind}/")
    wanted = torch.tensor([int(c) for c in classes], dtype=torch.long)
    return own if _CLASSES in own and torch.equal(own[_CLASSES], wanted) else {}


def check_kept_names(kept: State, names: Iterable[str]) -> None:
    """Refuses a kept state with parameters the trained module does not have (a state kept by
    another architecture, or in another layout), which would otherwise be dropped unnoticed."""
    unknown = sorted({key.rsplit("/", 1)[0] for key in kept if key != _CLASSES} - set(names))
    if unknown:
        raise ValueError(f"optimizer.keep_state: the client kept optimizer state for parameters {unknown[:5]} that "
                         f"the task's parameters do not have (the kept layout names each parameter as the task's "
                         f"exchanged state does)")


def slot_state(kept: State, name: str, index: Optional[int], shape: Sequence[int]) -> dict[str, Tensor]:
    """The kept state of parameter ``name``'s copy ``index`` (None: the whole tensor), checked
    against the trained tensor's ``shape``; empty if nothing is kept for it. A step count kept
    once for every copy (a stacked tensor's) is each copy's; copies' counts read as one tensor's
    must agree."""
    state = {}
    for key, value in prefixed(kept, name + "/").items():
        if key == STEP:
            if value.dim() > 0 and index is None and not torch.all(value == value[0]):
                raise ValueError(f"optimizer.keep_state: the copies of parameter {name!r} kept different step "
                                 f"counts {value.tolist()}, which one stacked tensor cannot take")
            if value.dim() > 0:
                value = value[0 if index is None else index]
        else:
            value = value if index is None else value[index]
            if tuple(value.shape) != tuple(shape):
                where = name if index is None else f"{name}[{index}]"
                raise ValueError(f"optimizer.keep_state: the kept {key!r} of parameter {where!r} has shape "
                                 f"{tuple(value.shape)}, the parameter {tuple(shape)}")
        state[key] = value
    return state


def kept_state(kind: str, classes: Sequence[int], slots: Iterable[Slot]) -> State:
    """The client's kept state (prefixed) from each trained tensor's ``slots``: a parameter's
    copies stacked in index order, as its exchanged tensor is."""
    prefix = f"{PREFIX}{kind}/"
    kept = {prefix + _CLASSES: torch.tensor([int(c) for c in classes], dtype=torch.long)}
    copies: dict[str, dict[int, dict[str, Tensor]]] = {}
    for name, index, state in slots:
        if index is None:
            kept.update({f"{prefix}{name}/{key}": value.detach().to("cpu", copy=True) for key, value in state.items()})
        else:
            copies.setdefault(name, {})[index] = state
    for name, by_index in copies.items():
        order = sorted(by_index)
        for key in by_index[order[0]]:
            kept[f"{prefix}{name}/{key}"] = torch.stack([by_index[g][key].detach().cpu() for g in order])
    return kept


def merged(kind: str, client_state: State, kept: State) -> State:
    """``client_state`` with task kind ``kind``'s kept optimizer state replaced by ``kept``."""
    prefix = f"{PREFIX}{kind}/"
    return {**{k: v for k, v in client_state.items() if not k.startswith(prefix)}, **kept}


class KeptOptimizerState(Callback):
    """Restores the optimizer state of ``kept`` (a client's state) into the fit's optimizers at
    the start of training and leaves the state they end with in ``self.kept`` (to be merged
    into the client's state by ``merged``). ``kind`` and ``classes``: the task's. The module
    says where each parameter sits in the exchanged state (``exchanged_parameters``)."""

    def __init__(self, kind: str, classes: Sequence[int], kept: State) -> None:
        self.kind, self.classes = kind, [int(c) for c in classes]
        self.restore: State = kept_for(kind, classes, kept)
        self.kept: Optional[State] = None  # None: the fit stepped no optimizer, the client's state stays

    def on_train_start(self, trainer, pl_module) -> None:
        optimizers = _optimizers(trainer)
        if not optimizers:
            return  # a module that trains nothing (a probe) has nothing to restore or keep
        if not hasattr(pl_module, "exchanged_parameters"):
            raise ValueError(f"optimizer.keep_state: {type(pl_module).__name__} does not say where its parameters "
                             f"sit in the exchanged state (LocalLearner.exchanged_parameters)")
        check_kept_names(self.restore, [name for _, name, _ in pl_module.exchanged_parameters()])
        for param, name, index in pl_module.exchanged_parameters():
            if id(param) not in optimizers:
                continue
            saved = slot_state(self.restore, name, index, param.shape)
            if not saved:
                continue
            # as Optimizer.load_state_dict: the step count stays as it was kept, the moments
            # follow the parameter's device and dtype; copies, since the optimizer updates them
            # in place and the kept state must stay what the client's last fit left
            optimizers[id(param)].state[param] = {
                key: value.clone() if key == STEP else value.to(param.device, param.dtype, copy=True)
                for key, value in saved.items()}

    def on_train_end(self, trainer, pl_module) -> None:
        optimizers = _optimizers(trainer)
        if not optimizers:
            return
        slots = [(name, index, {k: v for k, v in optimizers[id(param)].state.get(param, {}).items() if torch.is_tensor(v)})
                 for param, name, index in pl_module.exchanged_parameters() if id(param) in optimizers]
        self.kept = kept_state(self.kind, self.classes, slots)

    def merged(self, client_state: State) -> State:
        """``client_state`` with this task kind's kept optimizer state replaced by the fit's."""
        return client_state if self.kept is None else merged(self.kind, client_state, self.kept)


def _optimizers(trainer) -> dict[int, torch.optim.Optimizer]:
    """id(parameter) -> the fit's optimizer that steps it."""
    return {id(param): optimizer for optimizer in trainer.optimizers
            for group in optimizer.param_groups for param in group["params"]}
