"""FedDANE (Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith 2019): a federated Newton-type method,
FedAvg whose clients solve DANE's gradient-corrected local problem."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from fl_lightning.aggregation import fedavg
from fl_lightning.algorithms.baselines.classifier import classifier_task
from fl_lightning.algorithms.fimlbfgs.curvature import curvature_task
from fl_lightning.strategy import ClientResult, ClientTask, State
from fl_lightning.algorithms.baselines.fedavg import FedAvg


class FedDANE(FedAvg):
    """Round t, two client phases:

    1. gradient phase: the sampled clients receive w_t and return grad F_k(w_t), the gradient
       of their local loss averaged over their data (a ``CurvatureProbe`` without Fisher, one
       pass); the server averages them into grad f(w_t);
    2. the same clients receive grad f(w_t) (they still hold w_t and their own grad F_k(w_t))
       and approximately solve
           min_w F_k(w) + <grad f(w_t) - grad F_k(w_t), w> + mu/2 ||w - w_t||^2
       by local training (E epochs, batch B, the run's optimizer); the server averages the
       solutions (plain mean, or weighted by sample counts).

    The paper allows the two phases separate client subsets; here both use the round's
    sampled clients. Communication per client and round: w_t and grad f(w_t) down, grad
    F_k(w_t) and w_k up (2d each way).

    Args:
        mu: the proximal term's weight (the paper tunes it over {0.001, 0.01, 0.1, 1}).
        weighted: weight the clients' gradients and models by their sample counts (the
            default, as the FedProx/FedDANE code's aggregate does) or, False, plainly.
    """

    name = "feddane"

    def __init__(self, mu: float = 0.01, weighted: bool = True) -> None:
        super().__init__(weighted)
        if mu < 0:
            raise ValueError(f"algorithm.mu={mu} must be >= 0")
        self.mu = mu
        self._global: Optional[State] = None
        self._probed: set[int] = set()

    def gradient_phase(self, state: State, client_ids: list[int]) -> Optional[list[ClientTask]]:
        self._global, self._probed = None, set()
        # each client keeps its own gradient grad F_k(w_t) for the second phase
        return [curvature_task(k, {n: v.clone() for n, v in state.items()}, fisher=False, keep_gradient=True)
                for k in client_ids]

    def receive_gradients(self, results: list[ClientResult]) -> None:
        self._probed = {r.client_id for r in results}
        self._global = fedavg([r.params for r in results], [r.num_samples for r in results], self.weighted)

    def configure_client(self, state: State, client_id: int, labels: np.ndarray) -> Optional[ClientTask]:
        task = super().configure_client(state, client_id, labels)
        if task is None:
            return None
        if self._global is None or client_id not in self._probed:
            raise RuntimeError(f"FedDANE: client {client_id} has no gradient from this round's gradient phase")
        # w_t came with the gradient phase (params_held: not sent again)
        return classifier_task(client_id, task.params, self.optimizer, prox_mu=self.mu,
                               global_gradient={n: g.clone() for n, g in self._global.items()}, params_held=True)

    def aggregate(self, state: State, results: list[ClientResult]) -> tuple[State, dict[str, Any]]:
        new, _ = super().aggregate(state, results)
        norm = torch.sqrt(sum((g.double() ** 2).sum() for g in self._global.values())) if self._global else float("nan")
        return new, {"feddane/global_grad_norm": float(norm)}
