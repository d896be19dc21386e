"""One-shot ensembles of local models: FedOV's open-set voting and the close-set voting
baseline (FedOV, ICLR 2023: Algorithm 1 lines 10-17, Section 4, Appendix B.1 and B.4).

The global state holds every client's model stacked (N, ...), plus ``voters`` (N,): 1
for the clients that have trained (only they vote). Each round a client continues its
own model, so ``rounds: 1`` is the paper's one-shot setting and more rounds simply train
longer.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch
from torch import Tensor

from fl_lightning.algorithms.fedov.distillation import DistillationConfig, distill, teacher_probabilities
from fl_lightning.algorithms.baselines.classifier import classifier_task
from fl_lightning.algorithms.fedov.open_set import OpenSetLoss, open_set_task
from fl_lightning.modules.stacking import StackedModel, stack_models
from fl_lightning.algorithms.fedov.destruction import DESTRUCTION_OPS
from fl_lightning.messages import prefixed
from fl_lightning.strategy import ClientResult, ClientTask, State, Strategy, model_logits

VOTERS = "voters"
STUDENT = "student."

# The authors' destruction pool (FedOV's experiments.py, ``aug_crop``): one of seven transforms drawn
# uniformly per image, RandomResizedCrop, blur, RandomErasing, cut, rot, cut, rot. Their ``cut`` pastes
# half the image over another place (4 of its 6 cases: our copy_paste) or swaps the halves (2 of 6:
# our swap); ``rot`` is our rotate. destruction.py draws uniformly over the tuple, so this one, with
# each op repeated in proportion, gives their law: resized_crop, blur, erase 3/21 each, rotate 6/21,
# copy_paste 4/21, swap 2/21. The paper's text lists the six operations once each (DESTRUCTION_OPS).
CODE_DESTRUCTION_OPS: tuple[str, ...] = (("resized_crop",) * 3 + ("blur",) * 3 + ("erase",) * 3 + ("rotate",) * 6
                                         + ("copy_paste",) * 4 + ("swap",) * 2)


def close_set_vote(probs: Tensor) -> Tensor:
    """probs (N, B, n): the sum of the N models' class probabilities (B, n)."""
    return probs.sum(0)


def open_set_vote(probs: Tensor, top_k: Optional[int] = None) -> Tensor:
    """probs (N, B, n + 1), the last column "unknown": the sum of the known-class
    probabilities, unknown dropped (Algorithm 1, lines 13-16). With ``top_k``, per sample
    only the k models least sure it is unknown vote (Appendix B.4)."""
    known = probs[..., :-1]
    if top_k is None or top_k >= probs.shape[0]:
        return known.sum(0)
    if top_k < 1:
        raise ValueError(f"top_k={top_k} must be >= 1")
    confident = probs[..., -1].topk(top_k, dim=0, largest=False).indices  # (k, B)
    mask = torch.zeros_like(probs[..., -1]).scatter_(0, confident, 1.0)
    return (known * mask.unsqueeze(-1)).sum(0)


class _Ensemble(Strategy):
    """What both voting strategies share: the stacked local models and Distilled-ensemble
    option. Subclasses say how clients train and how the ensemble votes."""

    kind = "classifier"

    def __init__(self, distill: bool = False, distill_epochs: int = 100, distill_lr: float = 1e-3,
                 distill_batch_size: int = 32, distill_weight_decay: float = 1e-5) -> None:
        self.distill = distill
        self.distill_epochs, self.distill_lr, self.distill_batch_size = distill_epochs, distill_lr, distill_batch_size
        self.distill_weight_decay = distill_weight_decay

    @property
    def uses_public_data(self) -> bool:  # type: ignore[override]
        return self.distill

    def initial_state(self, generator: torch.Generator) -> State:
        # Line 2: every client initialises its own model.
        state = stack_models(self.fresh_models(generator, self.context.num_clients))
        state[VOTERS] = torch.zeros(self.context.num_clients)
        if self.distill:
            with torch.random.fork_rng():
                torch.manual_seed(int(torch.randint(2**31 - 1, (1,), generator=generator)))
                student = self.context.make_model(self.num_classes)
            state.update({STUDENT + k: v.detach().clone() for k, v in student.state_dict().items()})
        return state

    def models(self, state: State) -> State:
        return {k: v for k, v in state.items() if k != VOTERS and not k.startswith(STUDENT)}

    def configure_client(self, state: State, client_id: int, labels: np.ndarray) -> Optional[ClientTask]:
        if len(labels) == 0:
            return None
        params = {k: v[client_id].clone() for k, v in self.models(state).items()}
        return self.client_task(client_id, params)

    def client_task(self, client_id: int, params: State) -> ClientTask:
        return classifier_task(client_id, params, self.optimizer)

    def aggregate(self, state: State, results: list[ClientResult]) -> tuple[State, dict[str, Any]]:
        """Line 11: collect f_1..f_N as an ensemble (each result goes to its client's slot)."""
        new = {k: v.clone() for k, v in state.items()}
        for r in results:
            for k, v in r.params.items():
                new[k][r.client_id] = v
            new[VOTERS][r.client_id] = 1.0
        facts: dict[str, Any] = {"voters": int(new[VOTERS].sum())}
        if self.distill:
            new.update(self.distilled_student(new))
        return new, facts

    # ---- prediction ----------------------------------------------------------------------
    def member_probabilities(self, state: State, x: Tensor) -> Tensor:
        """Softmax outputs (V, B, outputs) of the V clients that have trained."""
        voters = state[VOTERS].to(x.device).bool()
        if not bool(voters.any()):
            raise RuntimeError("no client has trained yet: the ensemble has no voters")
        stacked = {k: v.to(x.device)[voters] for k, v in self.models(state).items()}
        return StackedModel(self.template, stacked, mode=self.stacking).to(x.device).eval()(x).float().softmax(-1)

    def vote(self, probs: Tensor) -> Tensor:
        raise NotImplementedError

    def predict_logits(self, state: State, x: Tensor) -> Tensor:
        return self.vote(self.member_probabilities(state, x))

    # ---- distillation (Appendix B.1) -----------------------------------------------------
    def distilled_student(self, state: State) -> State:
        x = self.context.public_x
        if x is None:
            raise RuntimeError("distillation needs public data (ServerContext.public_x)")
        votes = teacher_probabilities(lambda xb: self.vote(self.member_probabilities(state, xb)), x)
        teacher = votes / votes.sum(1, keepdim=True).clamp_min(1e-12)  # v_n(x) = v(x) / |v(x)|_1
        student = self.context.make_model(self.num_classes)
        student.load_state_dict(prefixed(state, STUDENT))
        cfg = DistillationConfig(self.distill_epochs, self.distill_lr, self.distill_batch_size, self.distill_weight_decay)
        trained = distill(student, x, teacher, cfg, self.context.seed, self.context.accelerator)
        return {STUDENT + k: v for k, v in trained.items()}

    def extra_metrics(self, state: State, x: Tensor, y: Tensor, scores: Tensor) -> dict[str, float]:
        out = {}
        if self.distill:
            student = self.context.make_model(self.num_classes)
            params = prefixed(state, STUDENT)
            with torch.no_grad():
                pred = torch.cat([model_logits(student, params, x[i:i + 1000]).argmax(1)
                                  for i in range(0, len(x), 1000)])
            out["distilled_accuracy"] = float((pred == y).float().mean())
        return out


class CloseSetVoting(_Ensemble):
    """The close-set baseline: clients train n-way classifiers by cross-entropy; the
    server sums all members' softmax outputs."""

    name = "close_set_voting"

    def vote(self, probs: Tensor) -> Tensor:
        return close_set_vote(probs)


class FedOV(_Ensemble):
    """FedOV: clients train (n + 1)-way open-set classifiers (``OpenSetDetector``) with
    PROSER, data destruction and adversarial outlier enhancement; the server votes with
    the known-class probabilities (open-set voting).

    Defaults follow the rule in docs/reproduction_readings.md: where the paper defers to its code
    or is silent, the authors' code. Two settings have a second, named reading:

    - PROSER's weights. Appendix B.1 takes "the default trade-off parameter setting in the
      official code" but prints beta = 0.01, gamma = 1; PROSER's official code and FedOV's code
      weight the dummy term 1 and the mixup term 0.01 (``reading: code``, the default). The
      printed numbers are ``reading: text``: ``dummy_weight: 0.01, mixup_weight: 1.0``.
    - The destruction pool. The code draws from CODE_DESTRUCTION_OPS (cut and rotation listed
      twice, the default); the text lists six operations, ``reading: text``:
      ``destruction_ops: [copy_paste, swap, rotate, erase, blur, resized_crop]``.

    The third setting of the code reading, raw [0, 1] pixels, is the data's ``standardize: false``.

    Args:
        dummy_weight: PROSER's dummy-classifier term (code: 1; the paper prints beta = 0.01).
        mixup_weight: PROSER's embedding-mixup term (code: 0.01; the paper prints gamma = 1).
        mixup_alpha: lambda ~ Beta(alpha, alpha).
        destruction_weight: weight of the data-destruction outliers' loss (0: off).
        adversarial_weight: weight of the FGSM-enhanced outliers' loss (0: no enhancement).
        fgsm_steps: FGSM iterations (paper 5).
        fgsm_step_size: FGSM step (paper 0.002).
        destruction_ops: the operations one of which is drawn uniformly per outlier; repeats
            weight an operation (the default is the authors' law, CODE_DESTRUCTION_OPS).
        top_k: only the k members least sure a sample is unknown vote (None: all). Every
            k = 1..N is also reported as ``topk_accuracy/k``.
        distill: Distilled FedOV: also train a student on the public half of the test set
            towards the normalised votes; everything is then evaluated on the other half.
        distill_epochs, distill_lr: the student's Adam training (Appendix B.1: 100 epochs, 1e-3).
        distill_batch_size, distill_weight_decay: the appendix is silent; the code's (32, 1e-5):
            its student trains on the test loader's batches of 32 with Adam's weight decay
            ``--reg`` (utils.py ``distill_soft``).
    """

    name = "fedov"
    kind = "open_set"

    def __init__(self, dummy_weight: float = 1.0, mixup_weight: float = 0.01, mixup_alpha: float = 1.0,
                 destruction_weight: float = 1.0, adversarial_weight: float = 1.0, fgsm_steps: int = 5,
                 fgsm_step_size: float = 0.002, destruction_ops: tuple[str, ...] = CODE_DESTRUCTION_OPS,
                 top_k: Optional[int] = None, distill: bool = False, distill_epochs: int = 100,
                 distill_lr: float = 1e-3, distill_batch_size: int = 32, distill_weight_decay: float = 1e-5) -> None:
        super().__init__(distill, distill_epochs, distill_lr, distill_batch_size, distill_weight_decay)
        unknown_ops = set(destruction_ops) - set(DESTRUCTION_OPS)
        if unknown_ops or not destruction_ops:
            what = f"unknown {sorted(unknown_ops)}" if unknown_ops else "is empty"
            raise ValueError(f"algorithm.destruction_ops {what}; choose from {DESTRUCTION_OPS} "
                             "(repeats weight an operation)")
        if top_k is not None and top_k < 1:
            raise ValueError(f"algorithm.top_k={top_k} must be >= 1 (or null for all voters)")
        self.dummy_weight, self.mixup_weight, self.mixup_alpha = dummy_weight, mixup_weight, mixup_alpha
        self.destruction_weight, self.adversarial_weight = destruction_weight, adversarial_weight
        self.fgsm_steps, self.fgsm_step_size = fgsm_steps, fgsm_step_size
        self.destruction_ops = tuple(destruction_ops)
        self.top_k = top_k

    def num_outputs(self, num_classes: int) -> int:
        return num_classes + 1  # the last output is "unknown"

    def loss(self) -> OpenSetLoss:
        return OpenSetLoss(self.dummy_weight, self.mixup_weight, self.mixup_alpha, self.destruction_weight,
                           self.adversarial_weight, self.fgsm_steps, self.fgsm_step_size, self.destruction_ops,
                           self.context.pixel_mean, self.context.pixel_std)

    def client_task(self, client_id: int, params: State) -> ClientTask:
        return open_set_task(client_id, params, self.optimizer, self.num_classes, self.loss())

    def vote(self, probs: Tensor) -> Tensor:
        return open_set_vote(probs, self.top_k)

    def extra_metrics(self, state: State, x: Tensor, y: Tensor, scores: Tensor) -> dict[str, float]:
        """Top-k confidence voting for every k (Table 11 reports the best k)."""
        out = super().extra_metrics(state, x, y, scores)
        probs = torch.cat([self.member_probabilities(state, x[i:i + 1000]) for i in range(0, len(x), 1000)], dim=1)
        by_k = {k: float((open_set_vote(probs, k).argmax(1) == y).float().mean()) for k in range(1, len(probs) + 1)}
        out.update({f"topk_accuracy/{k}": acc for k, acc in by_k.items()})
        out["topk_best_k"] = max(by_k, key=by_k.get)
        out["topk_best_accuracy"] = by_k[out["topk_best_k"]]
        return out
