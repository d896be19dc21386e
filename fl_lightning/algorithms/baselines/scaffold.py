"""SCAFFOLD (Karimireddy et al., ICML 2020), option II control variates, global learning
rate 1 (as in NIID-Bench).

The global state holds the model under its plain parameter names and the server's control
variate c as ``control_global/<name>``. Each client's own c_i is client state: the client
keeps it between rounds (ClientResult.client_state; the federation checkpoints what its
clients keep, so a resumed run repeats the uninterrupted one) and never sends it.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch
from torch import Tensor

from fl_lightning.aggregation import fedavg, scaffold_server_control
from fl_lightning.config import OptimizerConfig
from fl_lightning.algorithms.baselines.classifier import CONTROL, classifier_task
from fl_lightning.messages import prefixed
from fl_lightning.strategy import ClientResult, ClientTask, ServerContext, State
from fl_lightning.algorithms.baselines.fedavg import FedAvg
from fl_lightning.algorithms.baselines.fednova import require_sgd

CONTROL_GLOBAL = "control_global/"


class SCAFFOLD(FedAvg):
    """Each local SGD step of client i uses g + c - c_i; after K steps of learning rate eta,
    c_i+ = c_i - c + (x - y_i) / (K eta) and the client returns y_i and delta c_i = c_i+ - c_i.
    The server sets x <- mean of the y_i, c <- c + (1/N) sum_i delta c_i (N: all clients)
    and c_i <- c_i+. The clients need SGD; option II assumes plain SGD steps, so use
    ``optimizer.momentum: 0`` (momentum runs, as NIID-Bench allows, but the control
    variates then only approximate the local gradients).

    Args:
        weighted: average the clients' models weighted by their sample counts (the default,
            as NIID-Bench does) or, False, plainly (the control variates are always averaged
            over all N clients).
    """

    name = "scaffold"

    def __init__(self, weighted: bool = True) -> None:
        super().__init__(weighted)

    def setup(self, template: torch.nn.Module, num_classes: int, optimizer: OptimizerConfig, stacking: str,
              context: Optional[ServerContext] = None) -> None:
        require_sgd(optimizer, "SCAFFOLD", "its control variates are built from SGD steps")
        super().setup(template, num_classes, optimizer, stacking, context)
        self.param_names = [name for name, _ in template.named_parameters()]

    def initial_state(self, generator: torch.Generator) -> State:
        state = super().initial_state(generator)
        for name in self.param_names:  # c = 0; each client's c_i = 0 is kept by the client
            state[CONTROL_GLOBAL + name] = torch.zeros_like(state[name])
        return state

    @staticmethod
    def model(state: State) -> State:
        return {k: v for k, v in state.items() if not k.startswith(CONTROL_GLOBAL)}

    def configure_client(self, state: State, client_id: int, labels: np.ndarray) -> Optional[ClientTask]:
        if len(labels) == 0:
            return None
        control = {name: state[CONTROL_GLOBAL + name].clone() for name in self.param_names}
        return classifier_task(client_id, {k: v.clone() for k, v in self.model(state).items()}, self.optimizer,
                               control=control)

    def aggregate(self, state: State, results: list[ClientResult]) -> tuple[State, dict[str, Any]]:
        new = fedavg([r.params for r in results], [r.num_samples for r in results], self.weighted)
        c = scaffold_server_control({k: state[CONTROL_GLOBAL + k] for k in self.param_names},
                                    [prefixed(r.payload, CONTROL) for r in results], self.context.num_clients)
        new.update({CONTROL_GLOBAL + k: v for k, v in c.items()})
        norm = torch.sqrt(sum((v.double() ** 2).sum() for v in c.values()))
        return new, {"scaffold/control_norm": float(norm)}

    def predict_logits(self, state: State, x: Tensor) -> Tensor:
        return super().predict_logits(self.model(state), x)
