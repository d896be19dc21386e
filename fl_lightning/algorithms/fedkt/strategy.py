"""FedKT (Li, He and Song, IJCAI 2021): one-shot federated learning by two-tier knowledge
transfer, FedOV's one-shot baseline with public data (Table 1 and Table 3).

Round 1 is FedKT itself: every party trains s x t teachers and s students
(fl_lightning.algorithms.fedkt.knowledge_transfer.train_party); the server labels the public data by
the parties' votes (every student's vote summed, as the authors' code does without privacy noise,
or the paper's consistent votes) and trains the final model on it. Later rounds, if any, run
FedProx (FedAvg with ``mu`` = 0) from the final model: FedOV's FedKT_FedProx (Figure 4).
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fl_lightning.aggregation import fedavg
from fl_lightning.algorithms.fedov.distillation import DistillationConfig, distill
from fl_lightning.algorithms.fedkt.knowledge_transfer import KnowledgeTransferConfig, party_task, predict_classes, vote_counts
from fl_lightning.algorithms.baselines.classifier import classifier_task
from fl_lightning.messages import prefixed
from fl_lightning.strategy import ClientResult, ClientTask, State, Strategy, model_logits

STUDENTS = "students."
PARTIES = "parties"  # (N,): 1 for the parties whose students are in the state


class FedKT(Strategy):
    """Args:
        partitions: s, each party's partitionings of its data, one student each (2).
        teachers: t, teachers per partitioning, each trained on 1/t of the local data (5).
        student_epochs: epochs of each party's student on the public data (100).
        final_epochs, final_lr, final_batch_size: the server's final model, trained by
            cross-entropy on the vote-labelled public data with Adam (100, 1e-3, 64; no
            weight decay, the same trainer as FedDF's and Distilled FedOV's distillation).
        consistent_voting: false (the default, ``reading: code``): every student votes, as
            the authors' code computes when no privacy noise is added (FedKT's experiments.py,
            get_prediction_labels: with gamma unset it sums each party's students' votes and
            applies the consistency mask only on the noisy path; FedOV ran it so). True
            (``reading: text``): a party votes, with s votes, only where its s students agree,
            FedKT's consistent voting as its paper describes it.
        mu: FedProx's proximal weight for rounds after the first (0: FedAvg).
        weighted: FedAvg's sample-count weighting for rounds after the first (default; False: plain mean).

    Every model trains with the run's optimizer and batch size; the teachers for
    ``federation.local_epochs``. Public samples that get no vote at all (no party's
    students agree) are left out of the final model's training, not given a label.
    """

    name = "fedkt"
    uses_public_data = True

    def __init__(self, partitions: int = 2, teachers: int = 5, student_epochs: int = 100, final_epochs: int = 100,
                 final_lr: float = 1e-3, final_batch_size: int = 64, consistent_voting: bool = False,
                 mu: float = 0.0, weighted: bool = True) -> None:
        self.party = KnowledgeTransferConfig(partitions, teachers, student_epochs)
        self.final = DistillationConfig(final_epochs, final_lr, final_batch_size)
        if mu < 0:
            raise ValueError(f"algorithm.mu={mu} must be >= 0")
        self.consistent_voting, self.mu, self.weighted = consistent_voting, mu, weighted

    # ---- state: the final model, every party's s students, which parties have sent them -----
    def initial_state(self, generator: torch.Generator) -> State:
        (model,) = self.fresh_models(generator, 1)
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        slots = self.context.num_clients * self.party.partitions
        state.update({STUDENTS + k: torch.zeros((slots, *v.shape), dtype=v.dtype) for k, v in state.items()})
        state[PARTIES] = torch.zeros(self.context.num_clients)
        return state

    def final_model(self, state: State) -> State:
        return {k: v for k, v in state.items() if k != PARTIES and not k.startswith(STUDENTS)}

    def state_num_bytes(self, state: State) -> int:
        return sum(t.numel() * t.element_size() for t in self.final_model(state).values())

    def transferred(self, state: State) -> bool:
        return bool(state[PARTIES].any())

    def configure_client(self, state: State, client_id: int, labels: np.ndarray) -> Optional[ClientTask]:
        if len(labels) == 0:
            return None
        if not self.transferred(state):
            # The parties initialise their own teachers and students: nothing is sent down.
            return party_task(client_id, self.optimizer, self.num_classes, self.party)
        params = {k: v.clone() for k, v in self.final_model(state).items()}
        return classifier_task(client_id, params, self.optimizer, prox_mu=self.mu)

    # ---- server ----------------------------------------------------------------------------
    def aggregate(self, state: State, results: list[ClientResult]) -> tuple[State, dict[str, Any]]:
        if self.transferred(state):  # FedProx rounds
            new = dict(state)
            new.update(fedavg([r.params for r in results], [r.num_samples for r in results], self.weighted))
            return new, {}
        new = {k: v.clone() for k, v in state.items()}
        s = self.party.partitions
        for r in results:
            for k, v in r.params.items():
                new[STUDENTS + k][r.client_id * s:(r.client_id + 1) * s] = v
            new[PARTIES][r.client_id] = 1.0
        x = self.context.public_x
        if x is None:
            raise RuntimeError("FedKT needs public data (ServerContext.public_x)")
        counts = self.votes(new, x)
        voted = counts.sum(1) > 0
        if not bool(voted.any()):
            raise RuntimeError("FedKT: no public sample got a consistent vote from any party; "
                               "try algorithm.consistent_voting=false")
        labels = counts.argmax(1)
        student = self.context.make_model(self.num_classes)
        student.load_state_dict(self.final_model(state))
        # KL towards a one-hot target is the cross-entropy on the voted label.
        target = F.one_hot(labels[voted], self.num_classes).float()
        new.update(distill(student, x[voted], target, self.final, self.context.seed, self.context.accelerator))
        return new, {"parties": int(new[PARTIES].sum()), "fedkt/public_labelled": int(voted.sum()),
                     "fedkt/public_fraction_labelled": float(voted.float().mean())}

    def student_models(self, state: State, device: torch.device) -> list[torch.nn.Module]:
        """The students of the parties that sent them, party by party (s consecutive each)."""
        s = self.party.partitions
        slots = [p * s + j for p in torch.nonzero(state[PARTIES]).flatten().tolist() for j in range(s)]
        models = []
        for slot in slots:
            model = self.context.make_model(self.num_classes)
            model.load_state_dict({k: v[slot] for k, v in prefixed(state, STUDENTS).items()})
            models.append(model.to(device))
        return models

    def votes(self, state: State, x: Tensor) -> Tensor:
        """(B, n) the parties' (consistent) votes on ``x``."""
        predictions = predict_classes(self.student_models(state, x.device), x)
        predictions = predictions.view(-1, self.party.partitions, len(x))
        return vote_counts(predictions, self.num_classes, self.consistent_voting)

    def predict_logits(self, state: State, x: Tensor) -> Tensor:
        return model_logits(self.template, self.final_model(state), x)

    def extra_metrics(self, state: State, x: Tensor, y: Tensor, scores: Tensor) -> dict[str, float]:
        """The accuracy of the students' vote itself, the teacher of the final model (samples
        without any vote count as wrong)."""
        if not self.transferred(state):
            return {}
        counts = self.votes(state, x)
        correct = (counts.argmax(1) == y) & (counts.sum(1) > 0)
        return {"fedkt/student_vote_accuracy": float(correct.float().mean())}
