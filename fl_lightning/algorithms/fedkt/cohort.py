"""FedKT's parties in the cohort engine (``trainer.engine cohort``): a group of parties trains as
two cohorts instead of s x (t + 1) fits, one network at a time, per party.

1. Every party's teachers, of all s partitionings, in one cohort. A party's splits, initial
   networks and seeds do not depend on training, so they are drawn up front, each party's as its
   own ``train_party`` draws them (``drawn_partitionings``, after seeding torch's global generator
   with its client seed, as ``train_client`` does).
2. Each partitioning's teachers label the public data by their majority vote (``public_labels``).
3. Every party's students in one cohort, all on the public data, each with its own labels.

Teachers and students are the FedAvg family's classifier, trained by ``classifier_objective``
(``MultiClassClassifier``'s loss, per client): the teachers as ``classifier_task``s by its
cohort plug-in, the students by ``StudentCohort``, which looks each batch's labels up in the
student's own label vector and then calls the same objective. Each network keeps its own seed
(batch order, dropout masks), batch size and epochs, so every party's students equal its
per-client ones to float rounding (tests/test_fedkt_cohort.py).
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Optional, Sequence

import torch
from torch import Tensor, nn

from fl_lightning.algorithms.baselines.classifier import classifier_task
from fl_lightning.algorithms.fedkt.knowledge_transfer import (NetworkToTrain, drawn_partitionings, party_config,
                                                              party_result, public_labels, teacher_epochs)
from fl_lightning.cohort.engine import CohortTrainer
from fl_lightning.cohort.members import CohortPlugin, Member
from fl_lightning.messages import ClientResult, ClientTask, task_settings

if TYPE_CHECKING:
    from fl_lightning.client import CohortJob

LABELS = "labels"  # a student's constant: its label of every public sample


class StudentCohort(CohortPlugin):
    """FedKT's students in the cohort engine: the classifier's cohort plug-in (``classifiers``)
    with labels of their own. Students share the inputs (the public data) but not the labels, so
    the engine's data are the public inputs with each sample's index as its target
    (``students_context``), every student's constant is its label vector, and its losses read the
    batch's labels by index before the classifier's (``classifier_objective``, and its per-sample
    losses for an optimizer that reads them); what the classifier's plug-in stacks, this stacks."""

    def __init__(self, classifiers: CohortPlugin) -> None:
        self.classifiers = classifiers

    @property
    def batch_norm_and_dropout(self) -> bool:
        return self.classifiers.batch_norm_and_dropout

    @property
    def gives_sample_losses(self) -> bool:
        return self.classifiers.gives_sample_losses

    def stack_key(self, task):
        return task.kind

    def member_count(self, task):
        return 1

    def members(self, task, client_state):
        return [Member(dict(task.params), {LABELS: task.payload[LABELS]})]

    def loss(self, forward, params, consts, x, y, weight):
        return self.classifiers.loss(forward, params, {}, x, consts[LABELS][y], weight)

    def sample_losses(self, forward, params, consts, x, y):
        return self.classifiers.sample_losses(forward, params, {}, x, consts[LABELS][y])

    def result(self, task, params, losses, steps, num_samples, client_state):
        return ClientResult(task.client_id, params[0], num_samples, (), losses[0], steps)


def students_context(ctx):
    """``ctx`` with the public inputs as its data and each sample's index as its target."""
    return replace(ctx, x=ctx.public_x, y=torch.arange(len(ctx.public_x), device=ctx.public_x.device))


@dataclass
class Training:
    """One network to train in a cohort: its task (initial parameters, optimizer, a student's
    labels), samples and seed, with its run's batch size and its epochs."""

    task: ClientTask
    drawn: NetworkToTrain
    batch_size: int
    epochs: int

    @property
    def shape(self) -> tuple:
        """Trainings of one shape share a cohort: no padded batch, no masked epoch (the arithmetic
        of each network alone), one optimizer (every setting but the learning rate, which is per member)."""
        settings = {k: v for k, v in asdict(self.task.optimizer).items() if k != "lr"}
        return self.batch_size, self.epochs, tuple(sorted(settings.items()))


def trained_in_cohorts(cohorts: CohortTrainer, plugin: CohortPlugin, trainings: Sequence[Training],
                       round_index: int, cohort_size: int) -> list[ClientResult]:
    """Each training's result, in order: one cohort per shape, in chunks of at most ``cohort_size``
    networks (0: no limit; each network is one member, trained alone in any chunk)."""
    chunks: dict[tuple, list[list[int]]] = {}
    for k, training in enumerate(trainings):
        own = chunks.setdefault(training.shape, [[]])
        if cohort_size and len(own[-1]) == cohort_size:
            own.append([])
        own[-1].append(k)
    results: list[Optional[ClientResult]] = [None] * len(trainings)
    for chunk in (c for shape in chunks.values() for c in shape):
        chosen = [trainings[k] for k in chunk]
        trained = cohorts.train(plugin, [(t.task, t.drawn.samples) for t in chosen], round_index,
                                [t.drawn.seed for t in chosen], [t.epochs for t in chosen], [{} for _ in chosen],
                                [t.batch_size for t in chosen])
        for k, result in zip(chunk, trained):
            results[k] = result
    return results


def loaded(template: nn.Module, state: dict[str, Tensor]) -> nn.Module:
    network = copy.deepcopy(template)
    network.load_state_dict(state)
    return network


def initial(network: NetworkToTrain) -> dict[str, Tensor]:
    return {k: v.detach() for k, v in network.network.state_dict().items()}


def train_parties_in_cohorts(jobs: Sequence["CohortJob"], seeds: Sequence[int], cohorts: CohortTrainer,
                             cohort_size: int) -> list[Optional[ClientResult]]:
    """The parties' results in job order (None for a party whose network or optimizer the cohort
    engine does not stack: it trains per client). ``cohorts`` trains on the data the runs of
    ``jobs`` share (its ``ctx``); each party draws and counts with its own run's context."""
    # a classifier that stacks stacks as a student too (StudentCohort): the same network and optimizer
    found = [cohorts.plugin_for(classifier_task(job.task.client_id, {}, job.task.optimizer)) for job in jobs]
    chosen = [k for k, f in enumerate(found) if f is not None]
    if not chosen:
        return [None] * len(jobs)
    classifiers = found[chosen[0]][0]
    round_index = jobs[chosen[0]].round_index
    drawn = {}
    for k in chosen:
        job = jobs[k]
        torch.manual_seed(seeds[k])  # as train_client seeds it before a party's train
        drawn[k] = list(drawn_partitionings(job.ctx, job.task, job.indices, seeds[k]))

    # 1. the teachers of every party and partitioning
    teachers = [Training(classifier_task(jobs[k].task.client_id, initial(t), jobs[k].task.optimizer), t,
                         jobs[k].ctx.federation.batch_size, teacher_epochs(jobs[k].ctx, jobs[k].task))
                for k in chosen for partitioning in drawn[k] for t in partitioning.teachers]
    taught = iter(trained_in_cohorts(cohorts, classifiers, teachers, round_index, cohort_size))

    # 2. each partitioning's public labels by its teachers' vote, and its student to train on them
    public_x, template = cohorts.ctx.public_x, cohorts.ctx.template
    students, steps = [], {}
    for k in chosen:
        job = jobs[k]
        steps[k] = 0
        for partitioning in drawn[k]:
            own = [next(taught) for _ in partitioning.teachers]
            steps[k] += sum(r.steps for r in own)
            labels = public_labels([loaded(template, r.params) for r in own], public_x, job.task.settings["num_classes"])
            task = ClientTask(job.task.client_id, job.task.kind, initial(partitioning.student), {LABELS: labels},
                              task_settings(job.task.optimizer))
            students.append(Training(task, partitioning.student, job.ctx.federation.batch_size,
                                     party_config(job.task).student_epochs))

    # 3. every student
    on_public = CohortTrainer(students_context(cohorts.ctx), cohorts.make_trainer, cohorts.fit_callbacks)
    learnt = iter(trained_in_cohorts(on_public, StudentCohort(classifiers), students, round_index, cohort_size))
    results: list[Optional[ClientResult]] = [None] * len(jobs)
    for k in chosen:
        own = [next(learnt) for _ in drawn[k]]
        results[k] = party_result(jobs[k].task, [r.params for r in own], len(jobs[k].indices), own[-1].train_loss,
                                  steps[k] + sum(r.steps for r in own))
    return results
