"""FedKT (the one-shot baseline with public data of FedOV's Table 1/3): the party's teacher
split, majority and consistent voting on hand-made predictions, the server's labelling of
the public data, and a run end to end (and resumed)."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from fl_lightning.checkpoint import load_checkpoint
from fl_lightning.cli import main
from fl_lightning.client import ClientContext, train_client
from fl_lightning.config import FederationConfig, OptimizerConfig, TrainerConfig
from fl_lightning.algorithms.fedkt.knowledge_transfer import KnowledgeTransferConfig, majority_vote, party_task, teacher_split, vote_counts
from fl_lightning.strategies import FedKT, ServerContext
from fl_lightning.strategy import ClientResult
from fl_lightning.algorithms.fedkt.strategy import PARTIES, STUDENTS
from tests.conftest import outcome, tiny_args


def test_teacher_split_is_disjoint_covers_the_party_and_is_balanced():
    indices = np.arange(100, 123)
    parts = teacher_split(indices, 5, np.random.default_rng(0))
    assert len(parts) == 5 and sorted(len(p) for p in parts) == [4, 4, 5, 5, 5]
    assert sorted(np.concatenate(parts).tolist()) == indices.tolist()


def test_majority_vote_by_hand():
    predictions = torch.tensor([[0, 1, 2, 1],
                                [0, 2, 2, 0],
                                [1, 2, 0, 2]])  # 3 teachers, 4 samples
    # sample 3 is a three-way tie: the lowest class wins
    assert majority_vote(predictions, 3).tolist() == [0, 2, 2, 0]


def test_consistent_voting_counts_a_party_only_where_its_students_agree():
    predictions = torch.tensor([[[0, 1], [0, 2]],   # party 0: agree on sample 0 (class 0), not on sample 1
                                [[1, 1], [1, 1]]])  # party 1: agrees on class 1 everywhere
    assert vote_counts(predictions, 3, consistent=True).tolist() == [[2, 2, 0], [0, 2, 0]]
    assert vote_counts(predictions, 3, consistent=False).tolist() == [[2, 2, 0], [0, 3, 1]]


def _synthetic_context(public: int = 20):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 1, 28, 28, generator=g), torch.randint(0, 3, (40,), generator=g)
    from fl_lightning.models import SimpleCNN

    fed = FederationConfig(rounds=1, client_fraction=1.0, local_epochs=2, batch_size=4)
    return ClientContext(x, y, SimpleCNN(1, 28, 3), fed, TrainerConfig(threads=1), 0,
                         torch.randn(public, 1, 28, 28, generator=g))


def test_party_uploads_s_students_after_training_s_times_t_teachers_and_s_students():
    ctx = _synthetic_context(public=20)
    cfg = KnowledgeTransferConfig(partitions=2, teachers=3, student_epochs=1)
    task = party_task(0, OptimizerConfig("adam", lr=1e-3), 3, cfg)
    local = np.arange(13)
    result = train_client(ctx, task, local, round_index=1)
    assert {k: tuple(v.shape) for k, v in result.params.items()} == {
        k: (2, *v.shape) for k, v in ctx.template.state_dict().items()}
    assert not torch.equal(result.params["head.2.weight"][0], result.params["head.2.weight"][1])
    # per partitioning: teachers on 5, 4, 4 samples for E = 2 epochs of B = 4, a student on 20 public samples
    teacher_steps = 2 * sum(math.ceil(n / 4) for n in (5, 4, 4))
    assert result.steps == 2 * (teacher_steps + math.ceil(20 / 4) * 1)
    assert result.num_samples == 13 and result.sent_bytes() == 2 * sum(
        v.numel() * v.element_size() for v in ctx.template.state_dict().values())
    again = train_client(ctx, task, local, round_index=1)
    assert all(torch.equal(again.params[k], v) for k, v in result.params.items())  # seeded per (seed, round, client)


def _constant_classifier(cls: int, features: int = 4, classes: int = 3) -> dict[str, torch.Tensor]:
    """A linear model that predicts ``cls`` whatever the input."""
    bias = torch.full((classes,), -10.0)
    bias[cls] = 10.0
    return {"weight": torch.zeros(classes, features), "bias": bias}


def _server(consistent: bool = True) -> FedKT:
    strategy = FedKT(partitions=2, final_epochs=30, final_lr=0.05, final_batch_size=8, consistent_voting=consistent)
    public = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
    context = ServerContext(num_clients=3, make_model=lambda n: nn.Linear(4, n), public_x=public)
    strategy.setup(nn.Linear(4, 3), 3, OptimizerConfig("adam", lr=1e-3), "loop", context)
    return strategy


def _party(client_id: int, *classes: int) -> ClientResult:
    students = [_constant_classifier(c) for c in classes]
    return ClientResult(client_id, {k: torch.stack([s[k] for s in students]) for k in students[0]}, 10)


def test_server_labels_public_data_by_consistent_votes_and_trains_the_final_model_on_them():
    strategy = _server()
    state = strategy.initial_state(torch.Generator().manual_seed(0))
    assert strategy.configure_client(state, 0, np.array([1])).kind == "knowledge_transfer"
    # party 0's students both say 2: its 2 votes; party 2's disagree (0 vs 1): no vote
    new, facts = strategy.aggregate(state, [_party(0, 2, 2), _party(2, 0, 1)])
    assert new[PARTIES].tolist() == [1.0, 0.0, 1.0]
    assert torch.equal(new[STUDENTS + "bias"][0:2], _party(0, 2, 2).params["bias"])
    assert torch.equal(new[STUDENTS + "bias"][4:6], _party(2, 0, 1).params["bias"])
    assert not new[STUDENTS + "bias"][2:4].any()  # party 1 sent nothing
    assert facts["fedkt/public_labelled"] == 16
    assert strategy.predict_logits(new, strategy.context.public_x).argmax(1).tolist() == [2] * 16
    # after the transfer, clients continue the final model (FedProx rounds)
    task = strategy.configure_client(new, 1, np.array([0]))
    assert task.kind == "classifier" and torch.equal(task.params["bias"], new["bias"])


def test_server_refuses_when_no_party_votes_consistently():
    strategy = _server()
    state = strategy.initial_state(torch.Generator().manual_seed(0))
    with pytest.raises(RuntimeError, match="consistent vote"):
        strategy.aggregate(state, [_party(0, 0, 1), _party(1, 1, 2)])
    loose = _server(consistent=False)
    counts = loose.votes(_stacked_state(loose, [_party(0, 0, 1), _party(1, 1, 2)]), loose.context.public_x)
    assert counts[0].tolist() == [1, 2, 1]  # every student votes when consistency is off


def _stacked_state(strategy: FedKT, parties: list[ClientResult]) -> dict[str, torch.Tensor]:
    state = strategy.initial_state(torch.Generator().manual_seed(0))
    for r in parties:
        for k, v in r.params.items():
            state[STUDENTS + k][r.client_id * 2:(r.client_id + 1) * 2] = v
        state[PARTIES][r.client_id] = 1.0
    return state


FEDKT_ARGS = ["--algorithm", "FedKT", "--model.architecture", "simple_cnn", "--partition.scheme", "num_labels",
              "--partition.num_clients", "4", "--partition.labels_per_client", "2", "--federation.client_fraction",
              "1.0", "--federation.local_epochs", "1", "--federation.batch_size", "32", "--federation.final_window",
              "1", "--optimizer.name", "adam", "--optimizer.lr", "0.001", "--algorithm.student_epochs", "1",
              "--algorithm.final_epochs", "2", "--algorithm.mu", "0.01", "--run.checkpoint_every", "1"]


def test_fedkt_runs_one_shot_then_fedprox_and_resumes_exactly(tmp_path):
    full = main(["fit", *tiny_args(tmp_path / "full", *FEDKT_ARGS, "--federation.rounds", "2")])
    first, second = full["history"]
    assert first["bytes/down"] == 0 and first["parties"] == 4  # parties initialise their own models
    assert first["bytes/up"] == 2 * second["bytes/up"]  # s = 2 students each, then one model each
    # the students' vote, recomputed by hand on the held-out half (samples 75..149 of the test set)
    expected = _consistent_vote_accuracy(load_checkpoint(tmp_path / "full" / "checkpoints" / "last.ckpt")["state"])
    assert first["test/fedkt/student_vote_accuracy"] == second["test/fedkt/student_vote_accuracy"] == pytest.approx(expected)
    main(["fit", *tiny_args(tmp_path / "resumed", *FEDKT_ARGS, "--federation.rounds", "1")])
    resumed = main(["fit", *tiny_args(tmp_path / "resumed", *FEDKT_ARGS, "--federation.rounds", "2"),
                    "--ckpt_path", str(tmp_path / "resumed" / "checkpoints" / "last.ckpt")])
    assert outcome(resumed) == outcome(full)


def _consistent_vote_accuracy(state, s=2):
    """FedKT's vote on the held-out half, by hand: a party votes for a class where its s
    students agree; most votes wins (ties: the lowest class); a sample with no vote is wrong."""
    from fl_lightning.data.datasets import synthetic_dataset
    from fl_lightning.models import SimpleCNN

    data = synthetic_dataset(600)
    x, y = data.test_x[75:], data.test_y[75:].tolist()
    votes = np.zeros((len(y), 10), dtype=int)
    for party in np.flatnonzero(state[PARTIES].numpy()):
        predictions = []
        for slot in range(party * s, (party + 1) * s):
            student = SimpleCNN(1, 28, 10)
            student.load_state_dict({k[len(STUDENTS):]: v[slot] for k, v in state.items() if k.startswith(STUDENTS)})
            with torch.no_grad():
                predictions.append(student(x).argmax(1).tolist())
        for i, classes in enumerate(zip(*predictions)):
            if len(set(classes)) == 1:
                votes[i, classes[0]] += 1
    correct = [v.sum() > 0 and int(v.argmax()) == label for v, label in zip(votes, y)]
    return sum(correct) / len(y)


def test_default_vote_is_the_authors_code_sum_of_every_students_vote():
    # FedKT's code without privacy noise sums each party's students' votes (reading: code);
    # the paper's consistent voting (reading: text) keeps only parties whose students agree.
    parties = [_party(0, 2, 2), _party(1, 0, 1), _party(2, 0, 1), _party(3, 0, 1), _party(4, 0, 2)]
    labels = {}
    for reading, strategy in {"code": FedKT(partitions=2, final_epochs=30, final_lr=0.05, final_batch_size=8),
                              "text": FedKT(partitions=2, final_epochs=30, final_lr=0.05, final_batch_size=8,
                                            consistent_voting=True)}.items():
        public = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
        context = ServerContext(num_clients=5, make_model=lambda n: nn.Linear(4, n), public_x=public)
        strategy.setup(nn.Linear(4, 3), 3, OptimizerConfig("adam", lr=1e-3), "loop", context)
        state = strategy.initial_state(torch.Generator().manual_seed(0))
        new, _ = strategy.aggregate(state, parties)
        counts = strategy.votes(new, public)
        labels[reading] = strategy.predict_logits(new, public).argmax(1).tolist()
        expected = [4, 3, 3] if reading == "code" else [0, 0, 2]  # class votes on every public sample
        assert all(row == expected for row in counts.tolist())
    assert labels == {"code": [0] * 16, "text": [2] * 16}
