"""FedDF (Lin et al., NeurIPS 2020): FedAvg, then ensemble distillation of the averaged
model towards the clients' averaged logits on unlabelled public data."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.func import functional_call

from fl_lightning.algorithms.fedov.distillation import DistillationConfig, distill, teacher_probabilities
from fl_lightning.strategy import ClientResult, State
from fl_lightning.algorithms.baselines.fedavg import FedAvg


class FedDF(FedAvg):
    """Args:
        distill_epochs, distill_lr, distill_batch_size: the server's distillation (Adam),
            by default FedOV Appendix B.1's budget (100 epochs, 1e-3) at the paper's batch
            size 64 (FedOV's code has no FedDF to read a batch size or weight decay from).
        weighted: as FedAvg's (sample counts by default).
    """

    name = "feddf"
    uses_public_data = True

    def __init__(self, distill_epochs: int = 100, distill_lr: float = 1e-3, distill_batch_size: int = 64,
                 weighted: bool = True) -> None:
        super().__init__(weighted)
        self.distill_cfg = DistillationConfig(distill_epochs, distill_lr, distill_batch_size)

    def aggregate(self, state: State, results: list[ClientResult]) -> tuple[State, dict[str, Any]]:
        averaged, facts = super().aggregate(state, results)
        x = self.context.public_x
        model = self.template.to(x.device)

        def ensemble(xb: Tensor) -> Tensor:
            logits = torch.stack([functional_call(model, {k: v.to(x.device) for k, v in r.params.items()}, (xb,))
                                  for r in results])
            return logits.float().mean(0).softmax(1)

        teacher = teacher_probabilities(ensemble, x)
        student = self.context.make_model(self.num_classes)
        student.load_state_dict(averaged)
        return distill(student, x, teacher, self.distill_cfg, self.context.seed, self.context.accelerator), facts
