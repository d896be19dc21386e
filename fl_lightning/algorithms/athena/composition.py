"""ATHENA-FL's Step 6: a one-vs-all model composed from detectors of any cluster.

Per class, ``criterion`` decides which detectors speak:
- most_classes (default): the detector whose cluster held the most classes — it saw the most
  varied negatives, which the paper (Section 5.2.2) finds generalise best out of the
  cluster — ties broken by validation accuracy, then by the lower cluster id;
- val_accuracy: the detector with the best validation accuracy (measured inside its own
  cluster, so it favours easy clusters);
- ensemble: every detector of the class, their probabilities averaged.
The prediction is the argmax over classes of the detector probabilities (FedOVA's Eq. 3); a
class without any detector scores -1 and is never predicted."""

from __future__ import annotations

from typing import Literal, Sequence

import torch
from torch import Tensor, nn

from fl_lightning.modules.stacking import StackedModel

Criterion = Literal["most_classes", "val_accuracy", "ensemble"]


def choose_detectors(candidates: Sequence, criterion: Criterion) -> list[int]:
    """Positions in ``candidates`` (objects with class_label, cluster, cluster_classes,
    val_accuracy) of the detectors the composed model uses."""
    by_class: dict[int, list[int]] = {}
    for i, d in enumerate(candidates):
        by_class.setdefault(int(d.class_label), []).append(i)
    if criterion == "ensemble":
        return sorted(i for members in by_class.values() for i in members)
    if criterion == "most_classes":
        key = lambda i: (-len(candidates[i].cluster_classes), -candidates[i].val_accuracy, candidates[i].cluster)
    elif criterion == "val_accuracy":
        key = lambda i: (-candidates[i].val_accuracy, -len(candidates[i].cluster_classes), candidates[i].cluster)
    else:
        raise ValueError(f"composition criterion {criterion!r} must be most_classes, val_accuracy or ensemble")
    return sorted(min(members, key=key) for members in by_class.values())


class OneVsAllModel(nn.Module):
    """Chosen detectors, stacked (D, ...) and run at once; forward gives (batch, num_classes)
    class scores (mean detector probability per class)."""

    def __init__(self, template: nn.Module, stacked: dict[str, Tensor], class_of_detector: Sequence[int],
                 num_classes: int, mode: str = "loop") -> None:
        super().__init__()
        self.detectors = StackedModel(template, stacked, mode=mode)
        self.register_buffer("class_of_detector", torch.as_tensor(list(class_of_detector), dtype=torch.long))
        self.num_classes = num_classes

    def forward(self, x: Tensor) -> Tensor:
        probs = torch.sigmoid(self.detectors(x).squeeze(-1).float())  # (D, batch)
        index = self.class_of_detector.to(x.device)
        total = torch.zeros(self.num_classes, x.shape[0], device=x.device).index_add_(0, index, probs)
        count = torch.zeros(self.num_classes, device=x.device).index_add_(0, index, torch.ones_like(index, dtype=torch.float))
        scores = torch.where(count[:, None] > 0, total / count.clamp(min=1)[:, None], torch.full_like(total, -1.0))
        return scores.transpose(0, 1)


def compose(template: nn.Module, candidates: Sequence, stacked_params: Sequence[dict[str, Tensor]], num_classes: int,
            criterion: Criterion = "most_classes", mode: str = "loop") -> tuple[OneVsAllModel, list[int]]:
    """The composed model from ``candidates`` (with their parameters ``stacked_params[i]``,
    one detector each), and the positions it chose."""
    if not candidates:
        raise ValueError("no detectors to compose a one-vs-all model from")
    chosen = choose_detectors(candidates, criterion)
    names = list(stacked_params[chosen[0]])
    stacked = {n: torch.stack([stacked_params[i][n] for i in chosen]) for n in names}
    model = OneVsAllModel(template, stacked, [candidates[i].class_label for i in chosen], num_classes, mode)
    return model, chosen
