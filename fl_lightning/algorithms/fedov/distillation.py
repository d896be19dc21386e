"""Server-side knowledge distillation on unlabelled public data (FedDF; Distilled FedOV,
FedOV Appendix B.1): a student is trained towards a teacher's probabilities."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fl_lightning.config import OptimizerConfig
from fl_lightning.modules.learner import LocalLearner


@dataclass(frozen=True)
class DistillationConfig:
    """Attributes (defaults: FedOV Appendix B.1):
    epochs: passes over the public data (100).
    lr: Adam's learning rate (0.001).
    batch_size: 64.
    weight_decay: Adam's L2 penalty (0).
    """

    epochs: int = 100
    lr: float = 1e-3
    batch_size: int = 64
    weight_decay: float = 0.0


class DistillationStudent(LocalLearner):
    """Minimises KL(teacher || student) = sum_c t_c log(t_c / s_c), batch-averaged; the
    paper writes KL(sigma(f_s(x)), v_n(x)) for the same divergence between the two."""

    def __init__(self, network: nn.Module, optimizer: OptimizerConfig) -> None:
        super().__init__(optimizer)
        self.network = network.to(memory_format=torch.channels_last)

    def training_step(self, batch, batch_idx):
        x, teacher = batch
        log_student = F.log_softmax(self.network(x).float(), dim=1)
        return F.kl_div(log_student, teacher, reduction="batchmean")


@torch.no_grad()
def teacher_probabilities(predict, x: Tensor, batch: int = 1000) -> Tensor:
    """``predict(x_batch) -> probabilities``, evaluated over ``x`` in large batches."""
    return torch.cat([predict(x[i:i + batch]) for i in range(0, len(x), batch)])


def distill(student: nn.Module, x: Tensor, teacher: Tensor, cfg: DistillationConfig, seed: int,
            accelerator: str = "cpu") -> dict[str, Tensor]:
    """Trains ``student`` on (x, teacher probabilities); returns its new state."""
    from lightning.pytorch import Trainer

    from fl_lightning.data.batches import ClientBatches

    if cfg.epochs < 1 or cfg.batch_size < 1:
        raise ValueError(f"distillation needs epochs >= 1 and batch_size >= 1, got {cfg.epochs}, {cfg.batch_size}")
    if len(x) != len(teacher):
        raise ValueError(f"{len(x)} public samples but {len(teacher)} teacher rows")
    torch.manual_seed(seed)
    module = DistillationStudent(student, OptimizerConfig("adam", lr=cfg.lr, weight_decay=cfg.weight_decay))
    batches = ClientBatches(x, teacher.float(), torch.arange(len(x), device=x.device), cfg.batch_size,
                            torch.Generator().manual_seed(seed))
    trainer = Trainer(max_epochs=cfg.epochs, accelerator=accelerator, devices=1, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0, limit_val_batches=0)
    trainer.fit(module, train_dataloaders=batches)
    return {k: v.detach().cpu().clone() for k, v in module.network.state_dict().items()}
