"""FedKT's parties in the cohort engine (fl_lightning/algorithms/fedkt/cohort.py) against the
per-client ``train_party``, the reference: every party's teachers in one cohort, the votes, every
party's students in one cohort, with each party's own splits, initial networks, seeds and batch
orders; on smooth networks (``tests.conftest.smoothed`` says why), parameters equal to float
rounding. And a whole FedKT run with ``--trainer.engine cohort`` against ``per_client``."""

import numpy as np
import pytest
import torch
from torch import nn

from fl_lightning import client
from fl_lightning.algorithms.fedkt.knowledge_transfer import KnowledgeTransferConfig, party_task
from fl_lightning.client import ClientContext, ClientFailure, CohortJob, make_trainer, train_client, train_in_cohorts
from fl_lightning.cohort.engine import CohortTrainer
from fl_lightning.config import FederationConfig, OptimizerConfig, TrainerConfig
from fl_lightning.messages import ClientResult
from fl_lightning.models import SimpleCNN
from tests.conftest import smoothed
from tests.test_cohort import run_engine, smooth_simple_cnn
from tests.test_cohort_batchnorm import small_network
from tests.test_fedkt import FEDKT_ARGS

# three parties of unequal sizes; with t = 3 teachers the third (2 samples) has an empty part
SIZES = (13, 7, 2)
CONFIG = KnowledgeTransferConfig(partitions=2, teachers=3, student_epochs=2)


def context(template: nn.Module, classes: int = 3, public_x: bool = True) -> ClientContext:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(30, 1, 16, 16, generator=g), torch.randint(0, classes, (30,), generator=g)
    public = torch.randn(20, 1, 16, 16, generator=g) if public_x else None
    return ClientContext(x, y, template, FederationConfig(local_epochs=2, batch_size=4),
                         TrainerConfig(threads=1), seed=3, public_x=public)


def parties(optimizer: OptimizerConfig, classes: int = 3) -> list[tuple]:
    starts = np.cumsum([0, *SIZES])
    return [(party_task(k, optimizer, classes, CONFIG), np.arange(starts[k], starts[k + 1])) for k in range(len(SIZES))]


def no_client_trained_alone(monkeypatch) -> None:
    """From here on, a job that ``train_in_cohorts`` leaves to per-client training fails the test."""
    def refused(*args, **kwargs):
        raise AssertionError("a party was trained per client under the cohort engine")

    monkeypatch.setattr(client, "guarded_train", refused)


def train_both(ctx: ClientContext, optimizer: OptimizerConfig, classes: int, monkeypatch):
    """The parties trained per client (``train_client``) and by the cohort engine's routing
    (``train_in_cohorts``: one group of parties, trained as two cohorts)."""
    jobs = parties(optimizer, classes)
    alone = [train_client(ctx, task, idx, round_index=0) for task, idx in jobs]
    no_client_trained_alone(monkeypatch)
    trainer = CohortTrainer(ctx, make_trainer)
    cohort = train_in_cohorts([CohortJob(ctx, task, idx, 0) for task, idx in jobs], lambda _: trainer, 0)
    return alone, cohort


def worst_difference(alone: list[ClientResult], cohort: list[ClientResult]) -> float:
    return max((ours.params[k] - ref.params[k]).abs().max().item() for ref, ours in zip(alone, cohort) for k in ref.params)


# Measured on one CPU thread, the students' parameters: SGD 9e-8 (SimpleCNN), 2e-6 (batch norm
# and dropout), Adam 1e-6 (it divides by sqrt(v): a gradient entry that is rounding noise becomes a
# step of ~lr, tests/test_cohort.py); the last student's loss: SGD 7e-8, Adam 1.8e-5 relative.
CASES = {  # (network, its classes, optimizer, tolerance)
    "simple_cnn_sgd": (lambda: smoothed(SimpleCNN(1, 16, 3)), 3, OptimizerConfig("sgd", lr=0.05, momentum=0.9), 1e-5),
    "simple_cnn_adam": (lambda: smoothed(SimpleCNN(1, 16, 3)), 3, OptimizerConfig("adam", lr=1e-3), 1e-5),
    # batch norm (the 2-sample party's teachers train on 1 sample each: every batch a lone sample,
    # skipped by both engines) and dropout (each network's masks drawn from its own seed in both)
    "batch_norm_and_dropout_sgd": (small_network, 10, OptimizerConfig("sgd", lr=0.05), 1e-5),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_parties_in_the_cohort_equal_their_per_client_training(case, monkeypatch):
    network, classes, optimizer, tolerance = CASES[case]
    ctx = context(network(), classes)

    alone, cohort = train_both(ctx, optimizer, classes, monkeypatch)

    assert all(isinstance(r, ClientResult) for r in cohort), cohort
    for ref, ours in zip(alone, cohort):
        assert ours.client_id == ref.client_id and ours.num_samples == ref.num_samples
        assert {k: v.shape for k, v in ours.params.items()} == {k: v.shape for k, v in ref.params.items()}
        assert ours.steps == ref.steps  # every teacher and student took exactly its own steps
        assert ours.train_loss == pytest.approx(ref.train_loss, rel=1e-4)
    assert worst_difference(alone, cohort) < tolerance, f"{case}: students differ by {worst_difference(alone, cohort)}"


def test_chunked_cohorts_equal_one_cohort(monkeypatch):
    no_client_trained_alone(monkeypatch)
    ctx = context(smoothed(SimpleCNN(1, 16, 3)))
    optimizer = OptimizerConfig("sgd", lr=0.05, momentum=0.9)
    trainer = CohortTrainer(ctx, make_trainer)
    jobs = [CohortJob(ctx, task, idx, 0) for task, idx in parties(optimizer)]
    whole = train_in_cohorts(jobs, lambda _: trainer, 0)

    chunked = train_in_cohorts(jobs, lambda _: trainer, 4)  # 16 teachers, 6 students: chunks of 4 members

    assert worst_difference(whole, chunked) < 1e-6
    assert [r.steps for r in whole] == [r.steps for r in chunked]


def test_a_failing_group_drops_its_parties_only(monkeypatch):
    no_client_trained_alone(monkeypatch)
    ctx = context(smoothed(SimpleCNN(1, 16, 3)), public_x=False)
    trainer = CohortTrainer(ctx, make_trainer)
    jobs = [CohortJob(ctx, task, idx, 0) for task, idx in parties(OptimizerConfig("sgd", lr=0.05))]

    outcomes = train_in_cohorts(jobs, lambda _: trainer, 0)

    assert [o.client_id for o in outcomes] == [0, 1, 2]
    assert all(isinstance(o, ClientFailure) and "public data" in o.reason for o in outcomes)


@pytest.fixture
def smooth_network(monkeypatch):
    from fl_lightning.models.architectures import ARCHITECTURES

    monkeypatch.setitem(ARCHITECTURES, "simple_cnn", smooth_simple_cnn)


def test_a_fedkt_run_in_the_cohort_engine_equals_per_client(tmp_path, smooth_network, monkeypatch):
    one_shot = [*FEDKT_ARGS, "--federation.rounds", "1"]  # after run_engine's rounds: the last one counts
    reference, ref_history = run_engine(tmp_path, "per_client", *one_shot)
    no_client_trained_alone(monkeypatch)

    state, history = run_engine(tmp_path, "cohort", *one_shot)

    assert state.keys() == reference.keys()
    worst = max((state[k] - reference[k]).abs().max().item() for k in state)
    assert worst < 1e-5, f"the students and the final model differ by {worst}"
    (ours,), (theirs,) = history, ref_history
    assert ours["parties"] == theirs["parties"] == 4
    for key in ("train/steps", "bytes/up", "bytes/down", "fedkt/public_labelled", "test/accuracy",
                "test/fedkt/student_vote_accuracy"):
        assert ours[key] == theirs[key], key
    assert ours["train/loss"] == pytest.approx(theirs["train/loss"], rel=1e-5)


def test_stacked_fedkt_runs_equal_each_run_alone(tmp_path, smooth_network, monkeypatch):
    # two seeds x two student epochs: every run's teachers in one cohort (the same B and E), the
    # students in a cohort per student_epochs; each party with its own run's seed and settings
    from tests.test_stacking import assert_equal_runs, run, run_counting_cohorts
    from tests.test_sweep import tiny_fixed, write

    grid = write(tmp_path / "grid.yaml", "method: grid\nparameters:\n  seed: {values: [0, 1]}\n"
                                         "  algorithm.student_epochs: {values: [1, 2]}\n")
    fedkt = [a for pair in zip(FEDKT_ARGS[::2], FEDKT_ARGS[1::2]) if pair[0] != "--algorithm.student_epochs" for a in pair]
    args = [*tiny_fixed("--seed"), *fedkt, "--federation.rounds", "1", "--trainer.engine", "cohort",
            "--algorithm.teachers", "2"]

    stacked, trained = run_counting_cohorts(monkeypatch, grid, tmp_path / "stacked", *args)
    alone = run(grid, tmp_path / "alone", *args, stack=None)

    assert [c.status for c in stacked] == ["done"] * 4
    # 4 runs x 4 parties x 2 partitionings: 64 teachers at most (a part may be empty), then 16 students per E
    assert len(trained) == 3 and trained[0][1] <= 64 and [n for _, n in trained[1:]] == [16, 16]
    assert_equal_runs(stacked, alone)
