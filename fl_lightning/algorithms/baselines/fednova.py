"""FedNova (Wang et al., NeurIPS 2020, "Tackling the objective inconsistency problem in
heterogeneous federated optimization"), as in NIID-Bench (Li et al. 2021): clients run
plain FedAvg local SGD; the server normalises each update by its number of local steps."""

from __future__ import annotations

from typing import Any, Optional

import torch

from fl_lightning.aggregation import fednova, fednova_norm
from fl_lightning.config import OptimizerConfig
from fl_lightning.strategy import ClientResult, ServerContext, State
from fl_lightning.algorithms.baselines.fedavg import FedAvg


def require_sgd(optimizer: OptimizerConfig, algorithm: str, why: str) -> None:
    if optimizer.name != "sgd":
        raise ValueError(f"optimizer.name={optimizer.name!r}: {algorithm} needs sgd ({why})")


class FedNova(FedAvg):
    """Client i sends d_i = (w - w_i) / a_i, where a_i = tau_i (its local SGD steps) or,
    with momentum rho, (tau_i - rho (1 - rho^tau_i) / (1 - rho)) / (1 - rho); the server sets
    w <- w - tau_eff sum_i p_i d_i with tau_eff = sum_i p_i a_i. With equal tau_i and no
    momentum this is FedAvg. Only the server differs from FedAvg (the normalisation is
    computed there from the clients' step counts); it needs the clients' SGD (momentum from
    ``optimizer.momentum``).

    Args:
        weighted: p_i = n_i / n (the paper and NIID-Bench); False: p_i = 1/m over the m
            sampled clients.
    """

    name = "fednova"

    def __init__(self, weighted: bool = True) -> None:
        super().__init__(weighted)

    def setup(self, template: torch.nn.Module, num_classes: int, optimizer: OptimizerConfig, stacking: str,
              context: Optional[ServerContext] = None) -> None:
        require_sgd(optimizer, "FedNova", "its normalisation a_i assumes SGD steps")
        fednova_norm(1, optimizer.momentum)  # rejects a momentum outside [0, 1)
        super().setup(template, num_classes, optimizer, stacking, context)

    def aggregate(self, state: State, results: list[ClientResult]) -> tuple[State, dict[str, Any]]:
        rho = self.optimizer.momentum
        steps, counts = [r.steps for r in results], [r.num_samples for r in results]
        new = fednova(state, [r.params for r in results], steps, counts, rho, self.weighted)
        weights = [float(n) if self.weighted else 1.0 for n in counts]
        tau_eff = sum(w * fednova_norm(t, rho) for w, t in zip(weights, steps)) / sum(weights)
        return new, {"fednova/tau_eff": tau_eff}
