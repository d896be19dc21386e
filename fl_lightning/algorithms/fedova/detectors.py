"""FedOVA's one-vs-all binary detectors (Eq. 2: f_i(x) = P(y = i | x; w_i))."""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fl_lightning.cohort.members import CohortPlugin, Member
from fl_lightning.config import OptimizerConfig
from fl_lightning.functional import Forward, weighted_mean
from fl_lightning.modules.learner import LocalLearner
from fl_lightning.modules.stacking import StackedModel
from fl_lightning.messages import ClientResult, ClientTask, task_settings
from fl_lightning.plugins import ClientPlugin, register_client_plugin


def detector_objective(forward: Forward, params: dict[str, Tensor], consts: dict[str, Tensor], x: Tensor, y: Tensor,
                       weight: Tensor) -> Tensor:
    """FedOVA's local loss (Eq. 2), written once for both engines: binary cross-entropy of a
    detector's logit on y == its class (``consts["target"]``), averaged over the batch's real
    samples. A vector of G classes with a ``forward`` giving G detectors' logits (G, B) (the
    per-client module's stacked detectors) gives the sum of their losses: each detector still
    receives exactly its own gradient."""
    logits = forward(params, x).squeeze(-1).float()  # (B,) or (G, B)
    targets = (y == consts["target"].unsqueeze(-1)).float()
    return weighted_mean(F.binary_cross_entropy_with_logits(logits, targets, reduction="none"), weight)


class BinaryDetector(LocalLearner):
    """One binary classifier per entry of ``classes``, each trained with binary
    cross-entropy on ``y == class`` (positives: that class; negatives: every other
    sample of the client).

    A single class is the paper's classifier f_i. With several classes the detectors
    are stacked and trained in one pass: the loss is the *sum* of their independent
    losses, so each detector receives exactly its own gradient, and the optimizers used
    here (SGD, Adam) act element-wise — the updates equal separate training
    (``tests/test_detectors.py`` checks it). ``fim_lbfgs`` (FIM-L-BFGS's client-side reading of
    the journal's Algorithm 2) is not element-wise: each detector gets its own
    ``FIMLBFGSOptimizer``, its own pairs and the Fisher of its own loss.
    """

    def __init__(self, template: nn.Module, classes: Sequence[int], stacked: dict[str, Tensor],
                 optimizer: OptimizerConfig, stacking: str = "loop") -> None:
        super().__init__(optimizer)
        if len(classes) != next(iter(stacked.values())).shape[0]:
            raise ValueError(f"{len(classes)} classes but {next(iter(stacked.values())).shape[0]} stacked detectors")
        # An optimizer per detector needs each detector's parameters as separate tensors: the
        # loop stacking (same results as vmap, tests/test_stacking.py)
        self.automatic_optimization = optimizer.name != "fim_lbfgs"
        self.detectors = StackedModel(template, stacked, mode=stacking if self.automatic_optimization else "loop")
        self.register_buffer("classes", torch.as_tensor(list(classes), dtype=torch.long), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        """Logits, shape (num_detectors, batch)."""
        return self.detectors(x).squeeze(-1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        if not self.automatic_optimization:
            return self._fim_lbfgs_step(x, y)
        return self.objective(x, y)

    def objective(self, x: Tensor, y: Tensor) -> Tensor:
        """The sum of the detectors' own losses: ``detector_objective`` on this module's stacked
        detectors (their parameters are the module's own, so the module is called directly:
        functional_call would only swap in the same tensors). The stacked logits go in as (G, B, 1),
        so that a batch of one sample keeps its batch axis."""
        return detector_objective(lambda params, inputs: self.detectors(inputs),
                                  dict(self.detectors.named_parameters()), {"target": self.classes}, x, y,
                                  torch.ones(len(y), device=x.device))

    def configure_optimizers(self):
        if self.automatic_optimization:
            return super().configure_optimizers()
        from fl_lightning.algorithms.fimlbfgs.optimizer import FIMLBFGSOptimizer

        cfg = self.optimizer_cfg
        return [FIMLBFGSOptimizer(detector.parameters(), lr=cfg.lr, history=cfg.history, damping=cfg.damping,
                                  max_step_norm=cfg.max_step_norm) for detector in self.detectors.copies]

    def _fim_lbfgs_step(self, x: Tensor, y: Tensor) -> Tensor:
        """One FIM-based L-BFGS step per detector (Algorithm 2 on the client): the diagonal
        empirical Fisher of the detector's own binary cross-entropy on this batch, and its
        two-loop direction from its own gradient (one backward of the sum gives each its own)."""
        from fl_lightning.algorithms.fimlbfgs.optimizer import batch_fisher

        optimizers = self.optimizers()
        optimizers = optimizers if isinstance(optimizers, list) else [optimizers]
        fishers = [batch_fisher(detector, _binary_loss, x, (y == c).float())
                   for detector, c in zip(self.detectors.copies, self.classes.tolist())]
        for optimizer in optimizers:
            optimizer.zero_grad()
        loss = self.objective(x, y)
        self.manual_backward(loss)
        for optimizer, fisher in zip(optimizers, fishers):
            optimizer.step(fisher=fisher)
        return loss.detach()

    def stacked_state(self) -> dict[str, Tensor]:
        return self.detectors.stacked_state()


def _binary_loss(logits: Tensor, targets: Tensor) -> Tensor:
    return F.binary_cross_entropy_with_logits(logits.squeeze(-1).float(), targets)


def detector_task(client_id: int, params: dict[str, Tensor], classes: Sequence[int], optimizer: OptimizerConfig,
                  stacking: str = "loop", epochs: Optional[int] = None) -> ClientTask:
    """Train the stacked detectors ``params`` of ``classes`` (FedOVA's client, Step 2)."""
    return ClientTask(client_id, "detectors", params,
                      settings=task_settings(optimizer, classes=[int(c) for c in classes], stacking=stacking, epochs=epochs))


class DetectorClient(ClientPlugin):
    def build(self, ctx, task, client_state):
        return BinaryDetector(ctx.template, task.classes, task.params, task.optimizer,
                              stacking=task.settings.get("stacking", "loop"))

    def result(self, task, module, num_samples, steps, loss, client_state):
        return ClientResult(task.client_id, module.stacked_state(), num_samples, task.classes, loss, steps)




class DetectorCohort(CohortPlugin):
    """FedOVA's client in the cohort engine: each of the client's detectors is one member
    (its class is the member's constant) trained by ``detector_objective``, all drawing the
    client's batches; the client's loss is the sum of its detectors' losses, as
    ``BinaryDetector.training_step`` reports."""

    def stack_key(self, task):
        return "stacked detectors"

    def member_count(self, task):
        return len(task.classes)

    def members(self, task, client_state):
        return [Member({name: t[g] for name, t in task.params.items()}, {"target": torch.tensor(c)})
                for g, c in enumerate(task.classes)]

    def loss(self, forward, params, consts, x, y, weight):
        return detector_objective(forward, params, consts, x, y, weight)

    def result(self, task, params, losses, steps, num_samples, client_state):
        stacked = {name: torch.stack([p[name] for p in params]) for name in params[0]}
        return ClientResult(task.client_id, stacked, num_samples, task.classes, float(sum(losses)), steps)


DetectorClient.cohort = DetectorCohort()
register_client_plugin("detectors", DetectorClient())
