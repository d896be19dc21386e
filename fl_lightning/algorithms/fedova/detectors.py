"""FedOVA's one-vs-all binary detectors (Eq. 2: f_i(x) = P(y = i | x; w_i))."""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fl_lightning.cohort.batch_norm import has_batch_norm, normalisable
from fl_lightning.cohort.dropout import DrawnDropout, StepMasks
from fl_lightning.cohort.members import CohortPlugin, Member
from fl_lightning.config import OptimizerConfig
from fl_lightning.functional import Forward, functional_forward, replace_layers, weighted_mean
from fl_lightning.modules.learner import LocalLearner
from fl_lightning.modules.stacking import StackedModel
from fl_lightning.messages import ClientResult, ClientTask, task_settings
from fl_lightning.plugins import ClientPlugin, register_client_plugin


def detector_sample_losses(forward: Forward, params: dict[str, Tensor], consts: dict[str, Tensor], x: Tensor,
                           y: Tensor) -> Tensor:
    """Each sample's binary cross-entropy of a detector's logit on y == its class
    (``consts["target"]``): (B,), or (G, B) for G classes with a ``forward`` giving G detectors'
    logits. FedOVA's data loss, whose per-sample gradients make FIM-L-BFGS's diagonal Fisher."""
    logits = forward(params, x).squeeze(-1).float()  # (B,) or (G, B)
    targets = (y == consts["target"].unsqueeze(-1)).float()
    return F.binary_cross_entropy_with_logits(logits, targets, reduction="none")


def detector_objective(forward: Forward, params: dict[str, Tensor], consts: dict[str, Tensor], x: Tensor, y: Tensor,
                       weight: Tensor) -> Tensor:
    """FedOVA's local loss (Eq. 2), written once for both engines: ``detector_sample_losses``
    averaged over the batch's real samples. A vector of G classes with a ``forward`` giving G
    detectors' logits (G, B) (the per-client module's stacked detectors) gives the sum of their
    losses: each detector still receives exactly its own gradient."""
    return weighted_mean(detector_sample_losses(forward, params, consts, x, y), weight)


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

    A network with batch norm or dropout (a detector on MobileNet, ATHENA-FL's) trains as module
    copies one after another: each keeps its own running statistics, a lone-sample batch is
    skipped (as ``MultiClassClassifier`` skips it), and every copy applies the step's dropout
    masks drawn from the client's generator (callbacks/dropout.py), as each detector trained
    alone by this client would draw them and as the cohort engine draws them.
    """

    def __init__(self, template: nn.Module, classes: Sequence[int], stacked: dict[str, Tensor],
                 optimizer: OptimizerConfig, stacking: str = "loop") -> None:
        super().__init__(optimizer)
        if len(classes) != next(iter(stacked.values())).shape[0]:
            raise ValueError(f"{len(classes)} classes but {next(iter(stacked.values())).shape[0]} stacked detectors")
        # An optimizer per detector needs each detector's parameters as separate tensors, and
        # running statistics and drawn dropout need module copies: the loop stacking (same
        # results as vmap, tests/test_stacking.py)
        self.automatic_optimization = optimizer.name != "fim_lbfgs"
        self._batch_norm = has_batch_norm(template)
        with_state = self._batch_norm or any(type(m) is nn.Dropout for m in template.modules())
        loop = not self.automatic_optimization or with_state
        self.detectors = StackedModel(template, stacked, mode="loop" if loop else stacking)
        self.dropout = StepMasks()  # one draw per step, applied by every copy
        if self.detectors.mode == "loop":
            for copy in self.detectors.copies:
                replace_layers(copy, lambda m: type(m) is nn.Dropout, lambda name, m: DrawnDropout(m, name, self.dropout))
        self.register_buffer("classes", torch.as_tensor(list(classes), dtype=torch.long), persistent=False)

    @property
    def network(self) -> nn.Module:
        """One detector's network (they share one architecture: its dropout layers are every copy's)."""
        return self.detectors.architecture

    def trains_on(self, samples: int) -> bool:
        """Whether a batch of ``samples`` is trained on (batch norm cannot normalise a lone sample)."""
        return not self._batch_norm or bool(normalisable(samples))

    def forward(self, x: Tensor) -> Tensor:
        """Logits, shape (num_detectors, batch)."""
        return self.detectors(x).squeeze(-1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        if not self.trains_on(len(x)):
            return None  # skipped, as drop_last would (the cohort's plan skips it too)
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
        from fl_lightning.algorithms.fimlbfgs.per_sample import batch_fisher_of

        optimizers = self.optimizers()
        optimizers = optimizers if isinstance(optimizers, list) else [optimizers]
        fishers = []
        for detector, target in zip(self.detectors.copies, self.classes):
            forward, consts = functional_forward(detector), {"target": target}
            params = {n: p.detach() for n, p in detector.named_parameters()}
            fisher = batch_fisher_of(lambda p, xb, yb: detector_sample_losses(forward, p, consts, xb, yb), params, x, y)
            fishers.append([fisher[n] for n in params])  # its optimizer's (parameters') order
        for optimizer in optimizers:
            optimizer.zero_grad()
        loss = self.objective(x, y)
        self.manual_backward(loss)
        for optimizer, fisher in zip(optimizers, fishers):
            optimizer.step(fisher=fisher)
        return loss.detach()

    def stacked_state(self) -> dict[str, Tensor]:
        return self.detectors.stacked_state()

    def exchanged_parameters(self):
        return self.detectors.exchanged_parameters()


def detector_task(client_id: int, params: dict[str, Tensor], classes: Sequence[int], optimizer: OptimizerConfig,
                  stacking: str = "loop", epochs: Optional[int] = None) -> ClientTask:
    """Train the stacked detectors ``params`` of ``classes`` (FedOVA's client, Step 2)."""
    return ClientTask(client_id, "detectors", params,
                      settings=task_settings(optimizer, classes=[int(c) for c in classes], stacking=stacking, epochs=epochs))


class DetectorClient(ClientPlugin):
    def build(self, ctx, task, client_state):
        return BinaryDetector(ctx.template, task.classes, task.params, task.optimizer,
                              stacking=task.settings.get("stacking", "loop"))

    def fit_callbacks(self, ctx, task, seed):
        from fl_lightning.callbacks.dropout import DropoutDraws

        return [DropoutDraws(seed, tuple(ctx.x.shape[1:]))]

    def result(self, task, module, num_samples, steps, loss, client_state):
        return ClientResult(task.client_id, module.stacked_state(), num_samples, task.classes, loss, steps)




class DetectorCohort(CohortPlugin):
    """FedOVA's client in the cohort engine: each of the client's detectors is one member
    (its class is the member's constant) trained by ``detector_objective``, all drawing the
    client's batches; the client's loss is the sum of its detectors' losses, as
    ``BinaryDetector.training_step`` reports. Its loss runs the network on the batch alone, so
    detectors with batch norm and dropout (MobileNet) stack too."""

    gives_sample_losses = True  # fim_lbfgs stacks too
    batch_norm_and_dropout = True

    def stack_key(self, task):
        return "stacked detectors"

    def member_count(self, task):
        return len(task.classes)

    def member_slices(self, task):
        return list(range(len(task.classes)))  # detector g: the g-th of the stacked tensors

    def members(self, task, client_state):
        return [Member({name: t[g] for name, t in task.params.items()}, {"target": torch.tensor(c)})
                for g, c in enumerate(task.classes)]

    def loss(self, forward, params, consts, x, y, weight):
        return detector_objective(forward, params, consts, x, y, weight)

    def sample_losses(self, forward, params, consts, x, y):
        return detector_sample_losses(forward, params, consts, x, y)

    def result(self, task, params, losses, steps, num_samples, client_state):
        stacked = {name: torch.stack([p[name] for p in params]) for name in params[0]}
        return ClientResult(task.client_id, stacked, num_samples, task.classes, float(sum(losses)), steps)


DetectorClient.cohort = DetectorCohort()
register_client_plugin("detectors", DetectorClient())
