"""A client that measures instead of training: ClientUpdate of FIM-L-BFGS (the FedOVA journal
paper, Algorithm 1) and FedDANE's gradient phase.

Per client, a ``CurvatureProbe`` (a LightningModule run for one pass); in the cohort engine,
curvature_cohort.py's ``CurvatureCohort``. Both engines compute the sums with ``probe_sums``
(per_sample.py's ``gradient_sums`` of ``probe_sample_losses``) and return ``probe_result``.

Precision, in both engines: the probe runs in float32 with autocast off, forward and backward
(the loss, the per-sample gradients, the sums), whatever the Trainer's precision, so bf16-mixed
leaves the probes exact. The autocast context must enclose the gradient computation, not only
the loss: torch.func's ``grad`` runs the backward where it is called, and under CPU bf16
autocast that backward rounds the probe's gradients to bf16 (1e-3 of head.2.weight's
gradient, measured on the smooth test network).
"""

from __future__ import annotations

import copy
from typing import Optional, Sequence

import torch
from lightning.pytorch import LightningModule
from torch import Tensor, nn

from fl_lightning.algorithms.baselines.classifier import classifier_sample_losses
from fl_lightning.algorithms.fedova.detectors import detector_sample_losses
from fl_lightning.algorithms.fimlbfgs.per_sample import SampleLosses, gradient_sums, ones_like_batch
from fl_lightning.functional import Forward, functional_forward
from fl_lightning.messages import ClientResult, ClientTask, with_prefix
from fl_lightning.plugins import ClientPlugin, register_client_plugin


def probe_sample_losses(forward: Forward, params: dict[str, Tensor], consts: dict[str, Tensor], x: Tensor,
                        y: Tensor) -> Tensor:
    """Each sample's probed loss (B,): a detector's binary cross-entropy on y == its class
    (``consts["target"]``, FedOVA's) or the classifier's cross-entropy (FedAvg's); in float32
    with autocast off."""
    with torch.autocast(x.device.type, enabled=False):
        x = x.float()
        if "target" in consts:
            return detector_sample_losses(forward, params, consts, x, y)
        return classifier_sample_losses(forward, params, x, y)


def probe_sums(sample_losses: SampleLosses, params: dict[str, Tensor], x: Tensor, y: Tensor, weight: Tensor,
               squares: bool, chunk_size: Optional[int] = None) -> tuple[dict[str, Tensor], dict[str, Tensor], Tensor]:
    """One network's batch sums over its real samples (``gradient_sums`` of ``sample_losses``,
    ``probe_sample_losses`` of that network), with autocast off around the backward too (the
    module's note)."""
    with torch.autocast(x.device.type, enabled=False):
        return gradient_sums(sample_losses, params, x, y, weight, squares, chunk_size)


class CurvatureProbe(LightningModule):
    """At the global model w_t, one pass over the client's data in mini-batches of
    ``federation.batch_size``, no parameter update, and two sums over its samples:

    - the gradient of the local loss, averaged over all local samples: (1/N) sum_i grad f_i(w_t)
      (the batches only bound memory: the result is the whole local set's gradient, whatever
      the batch size or order, up to float rounding);
    - with ``fisher``, the diagonal Fisher information, the mean over samples of the squared
      per-sample gradients, (1/N) sum_i grad f_i(w_t)^2 (Eq. 11 diagonalised), from
      per-sample gradients by ``torch.func.vmap(grad(...))``.

    ``networks``: the models probed, each with its own loss — one multi-class network
    (cross-entropy, FedAvg's) or, when ``classes`` is given, FedOVA's binary detectors, one
    per class (binary cross-entropy on y == class). Manual optimisation and no optimizer: the
    per-client Trainer runs it like any other client module (and ``client.train_client`` runs
    it for one epoch, whatever ``federation.local_epochs``). Computed in float32 with autocast
    off, so mixed precision leaves the probes exact.
    """

    def __init__(self, networks: Sequence[nn.Module], classes: Sequence[int] = (), fisher: bool = True,
                 chunk_size: Optional[int] = None) -> None:
        super().__init__()
        if classes and len(classes) != len(networks):
            raise ValueError(f"{len(classes)} classes but {len(networks)} detectors")
        if not classes and len(networks) != 1:
            raise ValueError("a multi-class probe takes exactly one network")
        self.automatic_optimization = False
        self.networks = nn.ModuleList(networks)
        self.classes = tuple(int(c) for c in classes)
        self.fisher = fisher
        self.chunk_size = chunk_size  # vmap's: bounds the per-sample gradients held at once
        self.samples = 0
        self._grad_sum: list[dict[str, Tensor]] = []
        self._fisher_sum: list[dict[str, Tensor]] = []

    @classmethod
    def from_state(cls, template: nn.Module, params: dict[str, Tensor], classes: Sequence[int] = (),
                   fisher: bool = True) -> "CurvatureProbe":
        """``params``: one model's state dict, or with ``classes`` the detectors stacked (G, ...)."""
        rows = [{name: t[g] for name, t in params.items()} for g in range(len(classes))] if classes else [params]
        networks = []
        for state in rows:
            # A fixed (contiguous) layout, whatever the template's: the sums' rounding, hence
            # the results, must not depend on the process the probe runs in (the main
            # process's template may have been switched to channels_last by evaluation).
            network = copy.deepcopy(template).to(memory_format=torch.contiguous_format)
            network.load_state_dict(state)
            networks.append(network)
        return cls(networks, classes, fisher)

    def configure_optimizers(self):
        return None  # nothing is trained

    def training_step(self, batch, batch_idx):
        x, y = batch
        if not self._grad_sum:
            for network in self.networks:
                zeros = {k: torch.zeros_like(p, dtype=torch.float32, memory_format=torch.contiguous_format)
                         for k, p in network.named_parameters()}
                self._grad_sum.append(zeros)
                self._fisher_sum.append({k: v.clone() for k, v in zeros.items()} if self.fisher else {})
        total = torch.zeros((), device=x.device)
        for j, network in enumerate(self.networks):
            params = {k: p.detach().float() for k, p in network.named_parameters()}
            forward = functional_forward(network)
            consts = {"target": torch.tensor(self.classes[j], device=y.device)} if self.classes else {}
            gradient, squares, values = probe_sums(lambda p, xb, yb: probe_sample_losses(forward, p, consts, xb, yb),
                                                   params, x, y, ones_like_batch(y), self.fisher, self.chunk_size)
            for k, v in gradient.items():
                self._grad_sum[j][k] += v
            for k, v in squares.items():
                self._fisher_sum[j][k] += v
            total += values.detach().mean()
        self.samples += len(y)
        return total  # recorded as train/loss: the local loss at w_t (summed over detectors)

    def on_train_epoch_start(self) -> None:
        if self.current_epoch > 0:
            raise RuntimeError("a CurvatureProbe makes exactly one pass over the local data")

    def _result(self, sums: list[dict[str, Tensor]]) -> dict[str, Tensor]:
        if self.samples == 0:
            raise ValueError("the probe saw no samples")
        means = [{k: (v / self.samples).cpu() for k, v in s.items()} for s in sums]
        if not self.classes:
            return means[0]
        return {k: torch.stack([m[k] for m in means]) for k in means[0]}

    def gradient(self) -> dict[str, Tensor]:
        """(1/N) sum_i grad f_i(w_t) per parameter name (detectors stacked (G, ...))."""
        return self._result(self._grad_sum)

    def diagonal_fisher(self) -> dict[str, Tensor]:
        """(1/N) sum_i grad f_i(w_t)^2 per parameter name (detectors stacked (G, ...))."""
        if not self.fisher:
            raise ValueError("this probe was built with fisher=False")
        return self._result(self._fisher_sum)


FISHER = "fisher."  # payload: the diagonal Fisher
KEPT_GRADIENT = "local_gradient."  # client state: the gradient, kept for the round's second phase (FedDANE)


def curvature_task(client_id: int, params: dict[str, Tensor], classes: Sequence[int] = (), fisher: bool = True,
                   keep_gradient: bool = False) -> ClientTask:
    """Probe the local gradient (and with ``fisher`` the diagonal Fisher) at ``params``, one
    pass over the local data, no training (FIM-L-BFGS's ClientUpdate, FedDANE's gradient
    phase; ``keep_gradient``: the client also keeps it for the round's second phase)."""
    return ClientTask(client_id, "curvature", params, settings={
        "classes": [int(c) for c in classes], "fisher": fisher, "keep_gradient": keep_gradient})


class CurvatureClient(ClientPlugin):
    def local_epochs(self, task, federation) -> int:
        return 1  # one pass, however many local epochs the run sets

    def build(self, ctx, task, client_state):
        return CurvatureProbe.from_state(ctx.template, task.params, task.classes, fisher=task.settings["fisher"])

    def result(self, task, module, num_samples, steps, loss, client_state):
        fisher = module.diagonal_fisher() if task.settings["fisher"] else None
        return probe_result(task, module.gradient(), fisher, num_samples, loss, steps, client_state)


def probe_result(task: ClientTask, gradient: dict[str, Tensor], fisher: Optional[dict[str, Tensor]], num_samples: int,
                 loss: float, steps: int, client_state: dict[str, Tensor]) -> ClientResult:
    """The gradient, sent back in place of a model; the Fisher (if probed) as payload; the
    gradient kept by the client for the round's second phase (``keep_gradient``, FedDANE)."""
    payload = with_prefix(fisher, FISHER) if fisher is not None else {}
    kept = {**client_state, **with_prefix(gradient, KEPT_GRADIENT)} if task.settings.get("keep_gradient") \
        else client_state
    return ClientResult(task.client_id, gradient, num_samples, task.classes, loss, steps, payload, kept)


register_client_plugin("curvature", CurvatureClient())
