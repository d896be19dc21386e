"""FedOV: voting rules, the local open-set loss, FGSM enhancement, the one-shot strategies."""

import copy
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fl_lightning.cli import main
from fl_lightning.config import OptimizerConfig
from fl_lightning.algorithms.fedov.distillation import DistillationConfig, distill
from fl_lightning.models import SimpleCNN
from fl_lightning.algorithms.baselines import MultiClassClassifier
from fl_lightning.algorithms.fedov import OpenSetLoss
from fl_lightning.strategies import CloseSetVoting, FedOV, ServerContext
from fl_lightning.strategy import ClientResult
from fl_lightning.algorithms.fedov.voting import close_set_vote, open_set_vote
from tests.conftest import tiny_args

# Three models, two samples, two known classes + unknown (hand-made softmax outputs).
PROBS = torch.tensor([
    [[0.6, 0.1, 0.3], [0.1, 0.1, 0.8]],
    [[0.1, 0.2, 0.7], [0.2, 0.7, 0.1]],
    [[0.05, 0.05, 0.9], [0.5, 0.3, 0.2]],
])


def test_open_set_vote_drops_unknown_and_sums_known_probabilities():
    expected = torch.tensor([[0.75, 0.35], [0.8, 1.1]])
    torch.testing.assert_close(open_set_vote(PROBS), expected)
    assert open_set_vote(PROBS).argmax(1).tolist() == [0, 1]


def test_top_k_vote_counts_only_the_k_members_least_sure_of_unknown():
    # sample 0: unknown probs 0.3, 0.7, 0.9 -> top-1 is model 0, top-2 models 0 and 1
    # sample 1: unknown probs 0.8, 0.1, 0.2 -> top-1 is model 1, top-2 models 1 and 2
    torch.testing.assert_close(open_set_vote(PROBS, top_k=1), torch.tensor([[0.6, 0.1], [0.2, 0.7]]))
    torch.testing.assert_close(open_set_vote(PROBS, top_k=2), torch.tensor([[0.7, 0.3], [0.7, 1.0]]))
    torch.testing.assert_close(open_set_vote(PROBS, top_k=3), open_set_vote(PROBS))
    with pytest.raises(ValueError, match="top_k"):
        open_set_vote(PROBS, top_k=0)


def test_close_set_vote_sums_every_member():
    probs = PROBS[..., :2] / PROBS[..., :2].sum(-1, keepdim=True)
    torch.testing.assert_close(close_set_vote(probs), probs[0] + probs[1] + probs[2])


def _batch():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 1, 28, 28, generator=g)
    y = torch.tensor([0, 1] * 8)
    return x, y, torch.randn(16, 1, 28, 28, generator=g), torch.randn(16, 1, 28, 28, generator=g)


MEAN, STD = (0.49, 0.48, 0.45), (0.25, 0.24, 0.26)  # a CIFAR-like standardisation


def test_ensemble_keeps_each_client_model_in_its_slot_and_only_trained_clients_vote():
    strategy = CloseSetVoting()
    strategy.setup(SimpleCNN(1, 28, 10), 10, OptimizerConfig(), "loop", ServerContext(num_clients=3))
    state = strategy.initial_state(torch.Generator().manual_seed(0))
    torch.manual_seed(3)
    trained = SimpleCNN(1, 28, 10).state_dict()
    new, facts = strategy.aggregate(state, [ClientResult(2, trained, 10)])
    assert facts["voters"] == 1 and new["voters"].tolist() == [0.0, 0.0, 1.0]
    for k, v in strategy.models(new).items():
        assert torch.equal(v[2], trained[k]) and torch.equal(v[0], state[k][0])
    x = torch.randn(4, 1, 28, 28)
    only = SimpleCNN(1, 28, 10)
    only.load_state_dict(trained)
    torch.testing.assert_close(strategy.predict_logits(new, x), only(x).softmax(1), rtol=1e-5, atol=1e-6)


def test_fedov_has_an_unknown_output_and_validates_its_settings():
    assert FedOV().num_outputs(10) == 11 and CloseSetVoting().num_outputs(10) == 10
    with pytest.raises(ValueError, match="destruction_ops"):
        FedOV(destruction_ops=("erase", "melt"))
    with pytest.raises(ValueError, match="pixel_mean"):
        OpenSetLoss(pixel_mean=(0.5,), pixel_std=(0.2, 0.2))


def test_fedov_clients_get_the_data_standardisation_for_their_outliers():
    strategy = FedOV()
    strategy.setup(SimpleCNN(3, 32, 11), 10, OptimizerConfig("adam"), "loop",
                   ServerContext(num_clients=2, pixel_mean=MEAN, pixel_std=STD))
    task = strategy.client_task(0, {})
    loss = task.settings["open_set"]  # JSON: tuples travel as lists
    assert (tuple(loss["pixel_mean"]), tuple(loss["pixel_std"])) == (tuple(MEAN), tuple(STD))


def test_fedprox_loss_adds_the_proximal_term():
    torch.manual_seed(0)
    net = SimpleCNN(1, 28, 10)
    module = MultiClassClassifier(net, OptimizerConfig(), prox_mu=0.5)
    x, y, _, _ = _batch()
    with torch.no_grad():
        for p in module.network.parameters():
            p.add_(0.01)
    moved = sum(p.numel() for p in module.network.parameters()) * 0.01 ** 2
    ce = F.cross_entropy(module.network(x), y)
    torch.testing.assert_close(module.training_step((x, y), 0), ce + 0.25 * moved, rtol=1e-4, atol=1e-6)


def test_distillation_moves_the_student_towards_the_teacher():
    torch.manual_seed(0)
    x = torch.randn(64, 1, 28, 28)
    teacher = torch.softmax(torch.randn(64, 10) * 3, 1)
    student = SimpleCNN(1, 28, 10)
    kl = lambda net: float(F.kl_div(F.log_softmax(net(x), 1), teacher, reduction="batchmean"))
    before = kl(student)
    student.load_state_dict(distill(student, x, teacher, DistillationConfig(epochs=20, lr=3e-3, batch_size=32), seed=0))
    assert kl(student) < 0.5 * before


def test_distillation_weight_decay_reaches_adam():
    # The teacher is the student's own prediction, so the KL gradient is (nearly) zero and only
    # the L2 term moves the weights: towards zero with weight decay, (almost) nowhere without.
    torch.manual_seed(0)
    x = torch.randn(16, 1, 28, 28)
    student = SimpleCNN(1, 28, 10)
    with torch.no_grad():
        teacher = torch.softmax(student(x), 1)
    norm = lambda state: float(sum(v.float().pow(2).sum() for k, v in state.items() if "weight" in k) ** 0.5)
    start = norm(student.state_dict())
    cfg = lambda wd: DistillationConfig(epochs=1, lr=1e-3, batch_size=16, weight_decay=wd)
    decayed = norm(distill(copy.deepcopy(student), x, teacher, cfg(0.1), seed=0))
    plain = norm(distill(copy.deepcopy(student), x, teacher, cfg(0.0), seed=0))
    assert decayed < start - 1e-3 and abs(plain - start) < abs(decayed - start) / 10


FEDOV_ARGS = ["--algorithm", "FedOV", "--model.architecture", "simple_cnn", "--partition.scheme", "num_labels",
              "--partition.num_clients", "4", "--partition.labels_per_client", "1", "--federation.rounds", "1",
              "--federation.client_fraction", "1.0", "--federation.local_epochs", "1", "--federation.batch_size", "32",
              "--federation.final_window", "1", "--optimizer.name", "adam", "--optimizer.lr", "0.001"]


def test_fedov_one_shot_run_end_to_end_and_from_its_checkpoint(tmp_path, capsys):
    summary = main(["fit", *tiny_args(tmp_path / "run", *FEDOV_ARGS)])
    last = summary["history"][-1]
    assert last["voters"] == 4 and last["train/steps"] == 4 * int(np.ceil(60 / 32))
    assert {f"test/topk_accuracy/{k}" for k in range(1, 5)} <= set(last)
    assert last["test/topk_accuracy/4"] == pytest.approx(last["test/accuracy"])
    metrics = main(["test", *tiny_args(tmp_path / "run", *FEDOV_ARGS), "--ckpt_path", str(tmp_path / "run" / "checkpoints" / "last.ckpt")])
    assert metrics["test/accuracy"] == pytest.approx(last["test/accuracy"])


def test_distilled_fedov_distils_on_the_first_half_of_the_test_set_and_evaluates_on_the_second(tmp_path, monkeypatch):
    from fl_lightning.checkpoint import load_checkpoint
    from fl_lightning.data.datasets import synthetic_dataset
    from fl_lightning.algorithms.fedov import voting

    distilled_on, evaluated_on = [], []
    real_distill, real_predict = voting.distill, FedOV.predict_logits
    monkeypatch.setattr(voting, "distill", lambda student, x, *rest: distilled_on.append(x.clone()) or
                        real_distill(student, x, *rest))
    monkeypatch.setattr(FedOV, "predict_logits", lambda self, state, x: evaluated_on.append(x.clone()) or
                        real_predict(self, state, x))
    args = tiny_args(tmp_path / "run", *FEDOV_ARGS, "--algorithm.distill", "true", "--algorithm.distill_epochs", "1")
    summary = main(["fit", *args])

    data = synthetic_dataset(600)  # the run's data: 150 test samples, 75 public, 75 held out
    public, held_out, held_out_y = data.test_x[:75], data.test_x[75:], data.test_y[75:]
    assert len(distilled_on) == 1 and torch.equal(distilled_on[0], public)
    assert torch.equal(torch.cat(evaluated_on), held_out)
    assert float(torch.cdist(public.flatten(1), held_out.flatten(1)).min()) > 0  # no held-out sample distilled on
    # the student's accuracy, recomputed from the checkpoint on the held-out half
    state = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt")["state"]
    student = SimpleCNN(1, 28, 10)
    student.load_state_dict({k[len("student."):]: v for k, v in state.items() if k.startswith("student.")})
    with torch.no_grad():
        correct = int((student(held_out).argmax(1) == held_out_y).sum())
    last = summary["history"][-1]
    assert last["test/distilled_accuracy"] == pytest.approx(correct / 75)
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved["history"][-1]["test/distilled_accuracy"] == last["test/distilled_accuracy"]


def test_fedov_defaults_are_the_papers_appendix_b1():
    strategy = FedOV()
    strategy.setup(SimpleCNN(1, 28, 11), 10, OptimizerConfig("adam"), "loop", ServerContext(num_clients=2))
    loss = strategy.loss()
    assert (loss.dummy_weight, loss.mixup_weight, loss.mixup_alpha, loss.destruction_weight, loss.adversarial_weight,
            loss.fgsm_steps, loss.fgsm_step_size) == (1.0, 0.01, 1.0, 1.0, 1.0, 5, 0.002)  # PROSER: the code reading
    # Distillation: the appendix's 100 epochs of Adam 1e-3; where it is silent, the code's test
    # loader batches of 32 and weight decay 1e-5 (utils.py distill_soft)
    assert (strategy.distill, strategy.distill_epochs, strategy.distill_lr, strategy.distill_batch_size,
            strategy.distill_weight_decay) == (False, 100, 1e-3, 32, 1e-5)
    assert FedOV(top_k=1).top_k == 1
    with pytest.raises(ValueError, match="top_k"):
        FedOV(top_k=0)


def test_fedov_votes_with_its_top_k_and_reports_every_k_by_hand():
    strategy = FedOV(top_k=1)
    torch.testing.assert_close(strategy.vote(PROBS), open_set_vote(PROBS, top_k=1))
    # One sample, three members: member 0 is sure of class 0, members 1 and 2 lean to class 1
    # but are less sure it is known (unknown 0.3 and 0.4).
    probs = torch.tensor([[[0.9, 0.0, 0.1]], [[0.0, 0.7, 0.3]], [[0.0, 0.6, 0.4]]])
    strategy.member_probabilities = lambda state, x: probs
    # top-1: member 0 alone -> class 0; top-2: (0.9, 0.7) -> 0; all three: (0.9, 1.3) -> 1
    metrics = strategy.extra_metrics({}, torch.zeros(1, 1), torch.tensor([0]), None)
    assert {k: metrics[f"topk_accuracy/{k}"] for k in (1, 2, 3)} == {1: 1.0, 2: 1.0, 3: 0.0}
    assert metrics["topk_best_k"] == 1 and metrics["topk_best_accuracy"] == 1.0 and "topk_accuracy/4" not in metrics
    metrics = strategy.extra_metrics({}, torch.zeros(1, 1), torch.tensor([1]), None)
    assert metrics["topk_best_k"] == 3 and metrics["topk_best_accuracy"] == 1.0


def test_ensemble_trains_every_client_with_data_and_defaults_to_the_papers_distillation():
    for strategy in (CloseSetVoting(), FedOV()):
        strategy.setup(SimpleCNN(1, 28, strategy.num_outputs(10)), 10, OptimizerConfig("adam"), "loop",
                       ServerContext(num_clients=3))
        state = strategy.initial_state(torch.Generator().manual_seed(0))
        assert strategy.configure_client(state, 2, np.array([7])) is not None  # one sample is enough
        assert strategy.configure_client(state, 1, np.array([], dtype=np.int64)) is None
        assert (strategy.distill_epochs, strategy.distill_lr, strategy.distill_batch_size,
                strategy.distill_weight_decay) == (100, 1e-3, 32, 1e-5)


def test_distillation_teacher_is_the_vote_normalised_to_sum_one(monkeypatch):
    from fl_lightning.algorithms.fedov import voting

    strategy = FedOV(distill=True, distill_epochs=3, distill_lr=0.5, distill_batch_size=7)
    public = torch.zeros(2, 1, 28, 28)
    strategy.setup(SimpleCNN(1, 28, 11), 10, OptimizerConfig("adam"), "loop",
                   ServerContext(num_clients=3, make_model=lambda n: SimpleCNN(1, 28, n), public_x=public, seed=4))
    state = strategy.initial_state(torch.Generator().manual_seed(0))
    strategy.member_probabilities = lambda state, x: PROBS[:1]  # one member: votes sum to 0.7 and 0.2
    seen = {}
    monkeypatch.setattr(voting, "distill", lambda student, x, teacher, cfg, seed, accelerator: seen.update(
        teacher=teacher, cfg=cfg, seed=seed) or student.state_dict())
    strategy.distilled_student(state)
    torch.testing.assert_close(seen["teacher"], torch.tensor([[0.6 / 0.7, 0.1 / 0.7], [0.5, 0.5]]))
    assert (seen["cfg"].epochs, seen["cfg"].lr, seen["cfg"].batch_size, seen["seed"]) == (3, 0.5, 7, 4)


def test_fedov_top_k_metrics_over_a_test_set_of_several_chunks():
    # 1500 samples are voted in chunks of 1000 and 500; member m puts probability on class
    # (i + m) % 2 of sample i, and member 0 is the least sure the sample is unknown.
    n = 1500
    i = torch.arange(n)
    probs = torch.zeros(3, n, 3)
    for m, unknown in enumerate((0.1, 0.2, 0.3)):
        probs[m, i, (i + m) % 2] = 1 - unknown
        probs[m, :, 2] = unknown
    strategy = FedOV()
    strategy.member_probabilities = lambda state, x: probs[:, x.long().flatten()]  # x holds sample indices
    y = i % 2  # member 0 is right everywhere; members 0 and 2 agree, member 1 disagrees
    metrics = strategy.extra_metrics({}, i.float().view(n, 1), y, None)
    # top-1: member 0 -> all right; top-2: 0.9 vs 0.8 -> member 0 wins; all: 0.9 + 0.7 vs 0.8 -> right
    assert {k: metrics[f"topk_accuracy/{k}"] for k in (1, 2, 3)} == {1: 1.0, 2: 1.0, 3: 1.0}
    metrics = strategy.extra_metrics({}, i.float().view(n, 1), 1 - y, None)
    assert {k: metrics[f"topk_accuracy/{k}"] for k in (1, 2, 3)} == {1: 0.0, 2: 0.0, 3: 0.0}


def test_fedov_defaults_are_the_authors_code_reading():
    from collections import Counter
    from fractions import Fraction

    from fl_lightning.algorithms.fedov.voting import CODE_DESTRUCTION_OPS

    strategy = FedOV()
    # PROSER as the official code weights it (the paper prints beta = 0.01, gamma = 1)
    assert (strategy.dummy_weight, strategy.mixup_weight) == (1.0, 0.01)
    # FedOV's aug_crop: 7 transforms drawn uniformly, cut and rot listed twice; cut is a
    # copy-paste in 4 of its 6 cases and a swap in the other 2
    pool = {"resized_crop": Fraction(1, 7), "blur": Fraction(1, 7), "erase": Fraction(1, 7),
            "rotate": Fraction(2, 7), "copy_paste": Fraction(2, 7) * Fraction(4, 6),
            "swap": Fraction(2, 7) * Fraction(2, 6)}
    counts = Counter(strategy.destruction_ops)
    assert strategy.destruction_ops == CODE_DESTRUCTION_OPS
    assert {op: Fraction(n, len(CODE_DESTRUCTION_OPS)) for op, n in counts.items()} == pool
    # repeats are how a tuple weights an operation; an empty pool is refused by its key
    assert FedOV(destruction_ops=("erase", "erase", "blur")).destruction_ops == ("erase", "erase", "blur")
    with pytest.raises(ValueError, match="algorithm.destruction_ops"):
        FedOV(destruction_ops=())


def test_raw_pixels_give_fedov_the_identity_standardisation(tmp_path):
    from fl_lightning.config import DataConfig
    from fl_lightning.data import load_dataset
    from tests.test_data import write_idx_gz

    images = write_idx_gz(tmp_path / "gz", n_train=12, n_test=5)
    raw = load_dataset(DataConfig(name="fashion_mnist", root=str(tmp_path / "cache"), offline_roots=[],
                                  idx_gz_dir=str(tmp_path / "gz"), standardize=False))
    # data.standardize: false is the authors' ToTensor(): pixels / 255, nothing else
    torch.testing.assert_close(raw.test_x[:, 0], torch.from_numpy(images).float() / 255)
    # ...and x = (pixel - 0) / 1, so FedOV's outliers and FGSM steps act on those pixels as given
    assert (raw.pixel_mean, raw.pixel_std) == ((0.0,), (1.0,))
    strategy = FedOV()
    strategy.setup(SimpleCNN(1, 28, 11), 10, OptimizerConfig("adam"), "loop",
                   ServerContext(num_clients=2, pixel_mean=raw.pixel_mean, pixel_std=raw.pixel_std))
    assert (strategy.loss().pixel_mean, strategy.loss().pixel_std) == ((0.0,), (1.0,))


def test_a_checkpoint_from_before_the_distillation_weight_decay_resumes_only_with_its_behaviour():
    from fl_lightning.federation import _config_differences

    before = {"algorithm": {"class_path": "fl_lightning.algorithms.FedOV",
                            "init_args": {"distill": True, "distill_batch_size": 64}}}
    old_behaviour = {"algorithm": {"class_path": "fl_lightning.algorithms.FedOV",
                                   "init_args": {"distill": True, "distill_batch_size": 64, "distill_weight_decay": 0.0}}}
    assert _config_differences(before, old_behaviour) == []
    now = {"algorithm": {"class_path": "fl_lightning.algorithms.FedOV",
                         "init_args": {"distill": True, "distill_batch_size": 32, "distill_weight_decay": 1e-5}}}
    assert [d.split(":")[0] for d in _config_differences(before, now)] == [
        "algorithm.init_args.distill_batch_size", "algorithm.init_args.distill_weight_decay"]
