"""FedKT's two-tier knowledge transfer (Li, He and Song, "Practical One-Shot Federated
Learning for Cross-Silo Setting", IJCAI 2021), the one-shot baseline of FedOV's Table 1/3.

Party side (``train_party``), repeated for each of its s partitionings:
    split the local data into t disjoint parts, train one teacher per part;
    label the unlabelled public data by the teachers' majority vote;
    train a student on the public data with those labels.
The party uploads its s students (under the cohort engine, fedkt/cohort.py trains a group of
parties' teachers, then their students, as cohorts: the same networks). Server side
(``vote_counts``): the final model is trained on the public data labelled by the students' vote. The authors' code, without privacy noise, sums
every student's vote (``consistent=False``, the FedKT strategy's default); the paper's consistent voting
(``consistent=True``) lets a party vote, with s votes, only where all its s students agree.

Defaults follow the authors' scripts and FedOV's use of them: s = 2, t = 5, 100 student
epochs, the run's optimizer (Adam 0.001) and batch size for every model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fl_lightning.config import OptimizerConfig
from fl_lightning.messages import ClientResult, ClientTask, task_settings
from fl_lightning.models import reinitialised
from fl_lightning.plugins import ClientPlugin, register_client_plugin

if TYPE_CHECKING:
    from fl_lightning.client import ClientContext


@dataclass(frozen=True)
class KnowledgeTransferConfig:
    """Attributes:
    partitions: s, the partitionings of each party's data, one student each (2).
    teachers: t, the teachers per partitioning, each on 1/t of the local data (5).
    student_epochs: passes over the public data for each party's student (100).
    """

    partitions: int = 2
    teachers: int = 5
    student_epochs: int = 100

    def __post_init__(self) -> None:
        for name in ("partitions", "teachers", "student_epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"algorithm.{name}={getattr(self, name)} must be >= 1")


def teacher_split(indices: np.ndarray, teachers: int, rng: np.random.Generator) -> list[np.ndarray]:
    """The local sample indices shuffled and cut into ``teachers`` disjoint, near-equal parts."""
    return np.array_split(rng.permutation(indices), teachers)


def majority_vote(predictions: Tensor, num_classes: int) -> Tensor:
    """predictions (M, B) class indices of M models: the most voted class per sample (ties:
    the lowest class index)."""
    return F.one_hot(predictions, num_classes).sum(0).argmax(1)


def vote_counts(predictions: Tensor, num_classes: int, consistent: bool = True) -> Tensor:
    """predictions (P, s, B): the s students of each of P parties. Votes per class (B, n).
    ``consistent``: a party gives its s votes only where its students all agree, else none."""
    per_party = F.one_hot(predictions, num_classes).sum(1)  # (P, B, n)
    if consistent:
        per_party = per_party * (per_party == predictions.shape[1])
    return per_party.sum(0)


@torch.no_grad()
def predict_classes(models: Sequence[nn.Module], x: Tensor, batch: int = 1000) -> Tensor:
    """(M, B) argmax predictions of each model on ``x``."""
    out = []
    for model in models:
        model = model.to(x.device).eval()
        out.append(torch.cat([model(x[i:i + batch]).argmax(1) for i in range(0, len(x), batch)]))
    return torch.stack(out)


def party_task(client_id: int, optimizer: OptimizerConfig, num_classes: int, config: KnowledgeTransferConfig) -> ClientTask:
    """A FedKT party's round one: its s students from s x t teachers (no parameters sent)."""
    return ClientTask(client_id, "knowledge_transfer", {},
                      settings=task_settings(optimizer, num_classes=num_classes, knowledge_transfer=asdict(config)))


class PartyClient(ClientPlugin):
    """FedKT's party: not one module fitted once, so it overrides ``train`` as a whole; under the
    cohort engine a group of parties trains as two cohorts (fedkt/cohort.py)."""

    def build(self, ctx, task, client_state):
        raise NotImplementedError("a FedKT party trains several networks (train_party)")

    def result(self, task, module, num_samples, steps, loss, client_state):
        raise NotImplementedError("a FedKT party trains several networks (train_party)")

    def train(self, ctx, task, indices, seed, callbacks, client_state):
        return train_party(ctx, task, indices, seed, classifier_fitter(ctx, task, callbacks))

    def train_group_in_cohorts(self, jobs, seeds, cohorts, cohort_size):
        from fl_lightning.algorithms.fedkt.cohort import train_parties_in_cohorts

        return train_parties_in_cohorts(jobs, seeds, cohorts, cohort_size)


def classifier_fitter(ctx: "ClientContext", task: ClientTask, callbacks: Sequence):
    """``fit(network, x, y, indices, epochs, seed) -> (network, steps, last-epoch loss)``:
    cross-entropy training of one network by a per-client Trainer (teachers and students); the
    network's ``seed`` orders its batches and draws its dropout masks."""
    from fl_lightning.algorithms.baselines.classifier import MultiClassClassifier
    from fl_lightning.callbacks.dropout import DropoutDraws
    from fl_lightning.client import fit_module
    from fl_lightning.data.batches import ClientBatches

    def fit(network: nn.Module, x: Tensor, y: Tensor, indices: np.ndarray, epochs: int, seed: int):
        batches = ClientBatches(x, y, torch.as_tensor(indices), ctx.federation.batch_size,
                                torch.Generator().manual_seed(seed))
        module = MultiClassClassifier(network, task.optimizer)
        # masks drawn from the network's own seed, not from torch's global generator (which also
        # draws the next network's initial parameters): the cohort engine draws the same masks
        steps, loss = fit_module(ctx, module, batches, epochs, [*callbacks, DropoutDraws(seed, tuple(x.shape[1:]))])
        return module.network, steps, loss

    return fit


@dataclass
class NetworkToTrain:
    """A teacher or student before training: its initial network, the samples it trains on
    (local indices for a teacher, public ones for a student) and its seed (batch order, dropout)."""

    network: nn.Module
    samples: np.ndarray
    seed: int


@dataclass
class Partitioning:
    """One of a party's s partitionings: its t teachers (those with samples) and its student."""

    teachers: list[NetworkToTrain]
    student: NetworkToTrain


def party_config(task: ClientTask) -> KnowledgeTransferConfig:
    return KnowledgeTransferConfig(**task.settings["knowledge_transfer"])


def drawn_partitionings(ctx: "ClientContext", task: ClientTask, indices: np.ndarray, seed: int):
    """A party's partitionings, one after another: the split into t parts (a part with no sample,
    fewer samples than teachers, has no teacher), each teacher's initial network (torch's global
    generator) and seed, then the student's (``np.random.default_rng(seed)`` for the split and
    seeds). Training draws nothing from either generator, so drawing a partitioning just before
    training it (per client) or every partitioning up front (the cohort) gives the same networks."""
    if ctx.public_x is None:
        raise ValueError("FedKT's parties need the unlabelled public data (ClientContext.public_x)")
    cfg = party_config(task)
    rng = np.random.default_rng(seed)
    public = np.arange(len(ctx.public_x))
    for _ in range(cfg.partitions):
        teachers = [NetworkToTrain(reinitialised(ctx.template), part, int(rng.integers(2**31)))
                    for part in teacher_split(indices, cfg.teachers, rng) if len(part)]
        yield Partitioning(teachers, NetworkToTrain(reinitialised(ctx.template), public, int(rng.integers(2**31))))


def teacher_epochs(ctx: "ClientContext", task: ClientTask) -> int:
    """The teachers' local epochs: the task's, else federation.local_epochs."""
    return task.epochs if task.epochs is not None else ctx.federation.local_epochs


def public_labels(teachers: Sequence[nn.Module], public_x: Tensor, num_classes: int) -> Tensor:
    """The public data labelled by the teachers' majority vote."""
    return majority_vote(predict_classes(teachers, public_x), num_classes)


def party_result(task: ClientTask, students: Sequence[dict[str, Tensor]], num_samples: int, loss: float,
                 steps: int) -> ClientResult:
    """The party's upload: its s students' state dicts stacked (s, ...); ``loss``: the last student's."""
    states = [{k: v.detach().cpu() for k, v in s.items()} for s in students]
    params = {k: torch.stack([s[k] for s in states]) for k in states[0]}
    return ClientResult(task.client_id, params, num_samples, (), loss, steps)


def train_party(ctx: "ClientContext", task: ClientTask, indices: np.ndarray, seed: int, fit) -> ClientResult:
    """One party's s students (stacked (s, ...) in the result's params).

    ``fit(network, x, y, indices, epochs, seed) -> (trained network, steps, last-epoch loss)``
    trains a multi-class classifier by cross-entropy with a per-client Trainer
    (fl_lightning.client)."""
    num_classes = task.settings["num_classes"]
    students, steps, loss = [], 0, float("nan")
    for partitioning in drawn_partitionings(ctx, task, indices, seed):
        teachers = []
        for drawn in partitioning.teachers:
            teacher, n, _ = fit(drawn.network, ctx.x, ctx.y, drawn.samples, teacher_epochs(ctx, task), drawn.seed)
            teachers.append(teacher)
            steps += n
        labels = public_labels(teachers, ctx.public_x, num_classes)
        drawn = partitioning.student
        student, n, loss = fit(drawn.network, ctx.public_x, labels, drawn.samples, party_config(task).student_epochs,
                               drawn.seed)
        students.append(student.state_dict())
        steps += n
    return party_result(task, students, len(indices), loss, steps)


register_client_plugin("knowledge_transfer", PartyClient())
