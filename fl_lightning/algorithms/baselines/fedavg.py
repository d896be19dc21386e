"""FedAvg (Algorithm 1 of the FedOVA paper; McMahan et al. 2017)."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch
from torch import Tensor

from fl_lightning.aggregation import fedavg
from fl_lightning.algorithms.baselines.classifier import classifier_task
from fl_lightning.strategy import ClientResult, ClientTask, State, Strategy, model_logits


class FedAvg(Strategy):
    """One n-class model; the server averages the sampled clients' models.

    Args:
        weighted: weight clients by their sample counts n_k / n (McMahan et al.; NIID-Bench,
            the FedOV paper's baseline code), the default; False: the plain mean of FedOVA's
            Algorithm 1, line 8 (the FedOVA comparison configs set it).
    """

    name = "fedavg"

    client_optimizers = ("sgd", "adam", "fim_lbfgs")  # fim_lbfgs: FIM-L-BFGS's client-side reading

    def __init__(self, weighted: bool = True) -> None:
        self.weighted = weighted

    def initial_state(self, generator: torch.Generator) -> State:
        (model,) = self.fresh_models(generator, 1)
        return {k: v.detach().clone() for k, v in model.state_dict().items()}

    def configure_client(self, state: State, client_id: int, labels: np.ndarray) -> Optional[ClientTask]:
        if len(labels) == 0:
            return None
        return classifier_task(client_id, {k: v.clone() for k, v in state.items()}, self.optimizer)

    def aggregate(self, state: State, results: list[ClientResult]) -> tuple[State, dict[str, Any]]:
        return fedavg([r.params for r in results], [r.num_samples for r in results], self.weighted), {}

    def predict_logits(self, state: State, x: Tensor) -> Tensor:
        return model_logits(self.template, state, x)
