"""FedOVA (Algorithm 2 of the IJCNN 2021 paper)."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch
from torch import Tensor

from fl_lightning.aggregation import one_vs_all_groups
from fl_lightning.algorithms.fedova.detectors import detector_task
from fl_lightning.modules.stacking import StackedModel, stack_models
from fl_lightning.strategy import ClientResult, ClientTask, State, Strategy


class FedOVA(Strategy):
    """n one-vs-all binary classifiers f_1..f_n.

    - Server, line 2-3: n independently initialised classifiers, held stacked (n, ...).
    - Client (Step 2): a client initialises and trains only the classifiers of the labels
      it holds, each on its whole local set (that label positive, the rest negative).
    - Server, lines 10-11: each classifier averaged over its group G_i (Eq. 5).
    - Prediction (Eq. 3): argmax_i f_i(x).

    Args:
        weighted: average each group weighted by client sample counts instead of Eq. (5)'s
            plain mean.
    """

    name = "fedova"
    client_optimizers = ("sgd", "adam", "fim_lbfgs")  # fim_lbfgs: FIM-L-BFGS's client-side reading (Algorithm 2)

    def __init__(self, weighted: bool = False) -> None:
        self.weighted = weighted

    def num_outputs(self, num_classes: int) -> int:
        return 1  # one logit per binary detector

    def initial_state(self, generator: torch.Generator) -> State:
        return stack_models(self.fresh_models(generator, self.num_classes))

    def configure_client(self, state: State, client_id: int, labels: np.ndarray) -> Optional[ClientTask]:
        classes = tuple(int(c) for c in np.unique(labels))
        if not classes:
            return None
        index = torch.tensor(classes)
        params = {name: t[index].clone() for name, t in state.items()}
        return detector_task(client_id, params, classes, self.optimizer, self.stacking)

    def aggregate(self, state: State, results: list[ClientResult]) -> tuple[State, dict[str, Any]]:
        new, group_sizes = one_vs_all_groups(
            state, [(r.classes, r.params, r.num_samples) for r in results], self.weighted
        )
        return new, {f"group_size/{c}": n for c, n in sorted(group_sizes.items())}

    def predict_logits(self, state: State, x: Tensor) -> Tensor:
        model = StackedModel(self.template, state, mode=self.stacking).to(x.device).eval()
        return model(x).squeeze(-1).transpose(0, 1)  # (batch, n)

    def extra_metrics(self, state: State, x: Tensor, y: Tensor, scores: Tensor) -> dict[str, float]:
        """Per-detector binary accuracy: is f_i(x) > 1/2 exactly when y == i?"""
        classes = torch.arange(scores.shape[1], device=y.device)
        correct = (scores > 0) == (y.unsqueeze(1) == classes)
        return {f"detector_acc/{c}": float(v) for c, v in enumerate(correct.float().mean(0).tolist())}
