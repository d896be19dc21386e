"""FedProx (Li et al., MLSys 2020): FedAvg whose clients add mu/2 ||w - w_global||^2."""

from __future__ import annotations

from typing import Optional

import numpy as np

from fl_lightning.strategy import ClientTask, State
from fl_lightning.algorithms.baselines.fedavg import FedAvg


class FedProx(FedAvg):
    """Args:
        mu: the proximal term's weight (FedOV's paper tunes it over {0.001, 0.01, 0.1, 1}).
        weighted: as FedAvg's (sample counts by default, as NIID-Bench).
    """

    name = "fedprox"

    def __init__(self, mu: float = 0.01, weighted: bool = True) -> None:
        super().__init__(weighted)
        if mu < 0:
            raise ValueError(f"algorithm.mu={mu} must be >= 0")
        self.mu = mu

    def configure_client(self, state: State, client_id: int, labels: np.ndarray) -> Optional[ClientTask]:
        task = super().configure_client(state, client_id, labels)
        if task is not None:
            task.settings["prox_mu"] = self.mu
        return task
