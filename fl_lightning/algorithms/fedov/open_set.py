"""FedOV's local open-set classifier (ICLR 2023, Section 3 and Algorithm 1, lines 2-8).

n + 1 outputs: the n classes of the data set and "unknown" (index n). The local loss is

    L = CE(f(x), y)                                  real data
      + beta  * CE(f(x) without y, unknown)          PROSER's dummy classifier (Eq. 1)
      + gamma * CE(post(lam*pre(x_i) + (1-lam)*pre(x_j)), unknown)   PROSER's manifold mixup
      + w_dd  * CE(f(DataDestruction(x)), unknown)   Section 3.4
      + w_aoe * CE(f(FGSM(f, DataDestruction(x))), unknown)           Section 3.5

The outliers of a batch are made by the Lightning callbacks this module configures
(``callbacks.outliers``) and handed over through ``self.outliers``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fl_lightning.config import OptimizerConfig
from fl_lightning.messages import ClientResult, ClientTask, task_settings
from fl_lightning.modules.learner import LocalLearner
from fl_lightning.algorithms.fedov.destruction import DESTRUCTION_OPS
from fl_lightning.plugins import ClientPlugin, register_client_plugin


@dataclass(frozen=True)
class OpenSetLoss:
    """Weights and settings of the local open-set loss. Defaults: FedOV's paper (Appendix B.1).

    Attributes:
        dummy_weight: beta, PROSER's dummy-classifier term (paper: 0.01).
        mixup_weight: gamma, PROSER's embedding-mixup term (paper: 1).
        mixup_alpha: lambda ~ Beta(alpha, alpha) (the reference code: Beta(1, 1)).
        destruction_weight: the data-destruction outliers' term (0 turns it off; the outliers
            are still made when ``adversarial_weight`` needs them, as in the paper's Table 9).
        adversarial_weight: the FGSM-enhanced outliers' term (0: no enhancement at all).
        fgsm_steps, fgsm_step_size: FGSM iterations and step (paper: 5 and 0.002).
        destruction_ops: the operations one of which is drawn per outlier.
        pixel_mean, pixel_std: the inputs' standardisation x = (pixel - mean) / std. With
            them, outliers are made and FGSM steps taken on [0, 1] pixels, as in the paper
            and its code: erased boxes are black and a step moves a pixel by 0.002.
            Empty: both act on the inputs as given.
    """

    dummy_weight: float = 0.01
    mixup_weight: float = 1.0
    mixup_alpha: float = 1.0
    destruction_weight: float = 1.0
    adversarial_weight: float = 1.0
    fgsm_steps: int = 5
    fgsm_step_size: float = 0.002
    destruction_ops: tuple[str, ...] = DESTRUCTION_OPS
    pixel_mean: tuple[float, ...] = ()
    pixel_std: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if len(self.pixel_mean) != len(self.pixel_std) or any(s <= 0 for s in self.pixel_std):
            raise ValueError(f"pixel_mean {self.pixel_mean} and pixel_std {self.pixel_std} must have one entry "
                             "per channel, std > 0 (or both be empty)")

    def weights(self) -> dict[str, float]:
        return {"ce": 1.0, "dummy": self.dummy_weight, "mixup": self.mixup_weight,
                "destroyed": self.destruction_weight, "enhanced": self.adversarial_weight}

    @property
    def needs_destruction(self) -> bool:
        return self.destruction_weight > 0 or self.adversarial_weight > 0


class OpenSetDetector(LocalLearner):
    """A client's (n + 1)-way classifier. ``network`` must expose ``features`` (PROSER's
    phi_pre) and ``head`` (phi_post), with ``forward = head(features(x))``."""

    def __init__(self, network: nn.Module, num_classes: int, optimizer: OptimizerConfig,
                 loss: OpenSetLoss = OpenSetLoss()) -> None:
        super().__init__(optimizer)
        if not (hasattr(network, "features") and hasattr(network, "head")):
            raise ValueError(f"{type(network).__name__} has no features/head split, which PROSER's mixup needs")
        self.network = network.to(memory_format=torch.channels_last)
        self.unknown = num_classes  # the extra, last output
        self.loss = loss
        self.outliers: dict[str, Tensor] = {}

    def configure_callbacks(self):
        from callbacks.outliers import AdversarialOutlierEnhancement, DataDestruction

        made = []
        if self.loss.needs_destruction:
            made.append(DataDestruction(self.loss.destruction_ops, self.loss.pixel_mean, self.loss.pixel_std))
        if self.loss.adversarial_weight > 0:
            made.append(AdversarialOutlierEnhancement(self.loss.fgsm_steps, self.loss.fgsm_step_size,
                                                      self.loss.pixel_std))
        return made

    def forward(self, x: Tensor) -> Tensor:
        return self.network(x)

    def loss_terms(self, x: Tensor, y: Tensor, skip: frozenset = frozenset()) -> dict[str, Tensor]:
        """The unweighted terms of L; outliers from ``self.outliers``. One forward pass for
        the real data and every outlier set: without batch norm, concatenating changes nothing."""
        kinds = [k for k in ("destroyed", "enhanced") if k in self.outliers and k not in skip]
        parts = [x] + [self.outliers[k] for k in kinds]
        features = self.network.features(torch.cat(parts))
        logits = self.network.head(features).float()
        chunks = logits.split([len(p) for p in parts])
        real = chunks[0]
        unknown = torch.full_like(y, self.unknown)
        terms = {"ce": F.cross_entropy(real, y)}
        if "dummy" not in skip:
            # Without its true class, "unknown" must be the runner-up.
            without_true = real.masked_fill(F.one_hot(y, real.shape[1]).bool(), float("-inf"))
            terms["dummy"] = F.cross_entropy(without_true, unknown)
        for kind, out in zip(kinds, chunks[1:]):
            terms[kind] = F.cross_entropy(out, unknown[: len(out)])
        if "mixup" not in skip:
            # Embeddings of pairs from different classes, interpolated, are "unknown"; pairs
            # of one class are skipped (the reference code's ignore_index).
            # drawn on the CPU on any device: the same pairs on a GPU, and in the cohort engine
            pair = torch.randperm(len(y)).to(y.device)
            different = y != y[pair]
            lam = torch.distributions.Beta(self.loss.mixup_alpha, self.loss.mixup_alpha).sample().item()
            if bool(different.any()):
                real_features = features[: len(y)]
                mixed = lam * real_features[different] + (1 - lam) * real_features[pair][different]
                terms["mixup"] = F.cross_entropy(self.network.head(mixed).float(), unknown[different])
        return terms

    def training_step(self, batch, batch_idx):
        x, y = batch
        weights = self.loss.weights()
        skip = frozenset(name for name, w in weights.items() if w == 0)
        terms = self.loss_terms(x, y, skip)
        self.outliers = {}
        return sum(weights[name] * term for name, term in terms.items())

    def flat_state(self) -> dict[str, Tensor]:
        return {k: v.detach().cpu().clone() for k, v in self.network.state_dict().items()}


def open_set_task(client_id: int, params: dict[str, Tensor], optimizer: OptimizerConfig, num_classes: int,
                  loss: OpenSetLoss) -> ClientTask:
    """Train an (n + 1)-way open-set classifier with ``loss`` (FedOV's client, Algorithm 1)."""
    settings = task_settings(optimizer, num_classes=num_classes, open_set=asdict(loss))
    return ClientTask(client_id, "open_set", params, settings=settings)


def task_loss(task: ClientTask) -> OpenSetLoss:
    """The ``OpenSetLoss`` an open-set task carries (its JSON lists back to tuples)."""
    raw = task.settings["open_set"]
    return OpenSetLoss(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()})


class OpenSetClient(ClientPlugin):
    def build(self, ctx, task, client_state):
        from fl_lightning.algorithms.baselines.classifier import client_network

        return OpenSetDetector(client_network(ctx, task), task.settings["num_classes"], task.optimizer,
                               task_loss(task))

    def result(self, task, module, num_samples, steps, loss, client_state):
        return ClientResult(task.client_id, module.flat_state(), num_samples, task.classes, loss, steps)


register_client_plugin("open_set", OpenSetClient())
