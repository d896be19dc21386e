"""Client plug-ins: what a client does with a task of each kind.

A plug-in builds the LightningModule that trains a task and says what goes back to the server
(and what the client keeps for its later rounds). Each one lives beside the module it trains
and registers itself under its task kind; the client executor (fl_lightning.client), the
cohort engine and the Flower ClientApp look plug-ins up by kind and know no algorithm.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np
import torch

from fl_lightning.config import FederationConfig
from fl_lightning.messages import ClientResult, ClientTask, State

if TYPE_CHECKING:  # the executor's context; imported lazily to keep the loop below the plug-ins
    from fl_lightning.client import ClientContext, ClientFailure, CohortJob
    from fl_lightning.cohort.engine import CohortTrainer
    from fl_lightning.cohort.members import CohortPlugin

#: packages whose import registers the shipped plug-ins (looked up on first use, so that a
#: worker process or a Flower SuperNode finds them without importing any strategy)
PLUGIN_PACKAGES = ("fl_lightning.algorithms",)

_PLUGINS: dict[str, "ClientPlugin"] = {}


class ClientPlugin(ABC):
    """The client side of one task kind. The default ``train`` is FedAvg's ClientUpdate shape:
    build a module, fit it on the client's batches for E local epochs, read the result (with
    ``optimizer.keep_state``, the client's optimizer state restored before the fit and kept
    after it).
    ``cohort``: how its tasks' members stack in the cohort engine (None: per client only); a
    plug-in whose one task is several trainings one after another trains a group of its tasks
    with the cohort engine itself instead (``train_group_in_cohorts``)."""

    cohort: Optional["CohortPlugin"] = None

    def local_epochs(self, task: ClientTask, federation: FederationConfig) -> int:
        return task.epochs if task.epochs is not None else federation.local_epochs

    @abstractmethod
    def build(self, ctx: "ClientContext", task: ClientTask, client_state: State):
        """The LightningModule that trains ``task`` (``client_state``: what this client kept)."""

    def fit_callbacks(self, ctx: "ClientContext", task: ClientTask, seed: int) -> list:
        """Lightning callbacks this task's fit needs that depend on the client's ``seed`` (e.g.
        the callback that hands every step its random draws); none by default."""
        return []

    @abstractmethod
    def result(self, task: ClientTask, module, num_samples: int, steps: int, loss: float,
               client_state: State) -> ClientResult:
        """What goes back (and, in ``client_state``, what the client keeps) after the fit."""

    def train(self, ctx: "ClientContext", task: ClientTask, indices: np.ndarray, seed: int, callbacks: Sequence,
              client_state: State) -> ClientResult:
        from fl_lightning.callbacks.optimizer_state import KeptOptimizerState
        from fl_lightning.client import fit_module
        from fl_lightning.data.batches import ClientBatches

        batches = ClientBatches(ctx.x, ctx.y, torch.from_numpy(indices), ctx.federation.batch_size,
                                torch.Generator().manual_seed(seed))
        module = self.build(ctx, task, client_state)
        kept_optimizer = KeptOptimizerState(task.kind, task.classes, client_state) if task.optimizer.keep_state else None
        callbacks = [*callbacks, *self.fit_callbacks(ctx, task, seed), *([kept_optimizer] if kept_optimizer else [])]
        steps, loss = fit_module(ctx, module, batches, self.local_epochs(task, ctx.federation), callbacks)
        result = self.result(task, module, len(indices), steps, loss, client_state)
        if kept_optimizer is not None:
            result.client_state = kept_optimizer.merged(result.client_state)
        return result

    def train_group_in_cohorts(self, jobs: Sequence["CohortJob"], seeds: Sequence[int], cohorts: "CohortTrainer",
                               cohort_size: int) -> list[Optional[ClientResult | "ClientFailure"]]:
        """Several clients' tasks of this kind trained at once by the cohort engine (``trainer.engine
        cohort``), for a kind without a ``cohort``: the outcome of each job, in job order, or None
        for a job left to per-client training (the default: every job). ``seeds``: each job's client
        seed (``fl_lightning.client.client_seed``: ``train`` would get it, with torch's global
        generator seeded by it); ``cohorts``: the run's cohort trainer (its ``ctx`` holds the data
        the jobs share, its ``fit_callbacks`` the time budget of each cohort fit); ``cohort_size``:
        the most members a cohort may stack (0: no limit). An exception drops every job's client."""
        return [None] * len(jobs)


def register_client_plugin(kind: str, plugin: ClientPlugin) -> None:
    _PLUGINS[kind] = plugin


def client_plugin(kind: str) -> ClientPlugin:
    if kind not in _PLUGINS:
        for package in PLUGIN_PACKAGES:
            importlib.import_module(package)
    if kind not in _PLUGINS:
        raise ValueError(f"no client plug-in for task kind {kind!r} (registered: {sorted(_PLUGINS)})")
    return _PLUGINS[kind]
