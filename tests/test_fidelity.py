"""Issue 18, the papers' protocols: fashion_cnn's hidden layer (McMahan et al.'s 512 units),
per-client evaluation with its 95 % interval (ATHENA-FL), ATHENA-FL's detectors training
for the whole budget, and the FedAvg family's sample-weighted averaging (NIID-Bench)."""

import csv
import json

import numpy as np
import pytest
import torch

from fl_lightning.checkpoint import load_checkpoint, save_atomic
from fl_lightning.cli import main
from fl_lightning.models import FashionCNN, build_architecture
from fl_lightning.per_client_eval import (class_accuracy, class_report, client_accuracies, client_accuracy_summary, mean_interval,
                                          per_client_metrics)
from fl_lightning.settings import build_federation
from tests.conftest import tiny_args


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


# ---- VGG-11's initialisation (the CIFAR VGG of NIID-Bench / pytorch-vgg-cifar10) ---------------

def _conv_layers(model):
    return [m for m in model.features if isinstance(m, torch.nn.Conv2d)]


def _assert_he_normal_fan_out(model):
    for conv in _conv_layers(model):
        fan_out = conv.out_channels * conv.kernel_size[0] * conv.kernel_size[1]
        std = conv.weight.std().item()
        # thousands of samples per layer: the sample std is within a few % of sqrt(2 / fan_out)
        assert abs(std / (2.0 / fan_out) ** 0.5 - 1) < 0.05, (conv, std)
        assert torch.count_nonzero(conv.bias) == 0


def test_vgg11_convolutions_start_he_normal_over_fan_out_with_zero_bias():
    torch.manual_seed(0)
    model = build_architecture("vgg11", 3, 32, 1)

    assert len(_conv_layers(model)) == 8
    _assert_he_normal_fan_out(model)
    # torch's default (variance 1 / (3 fan_in)) is a sixth of that where channels stay equal
    last = _conv_layers(model)[-1]
    default = torch.nn.Conv2d(512, 512, 3, padding=1)
    assert last.weight.std() > 2.0 * default.weight.std()


def test_every_fresh_fedova_detector_gets_vgg11s_initialisation_not_the_layer_defaults():
    from fl_lightning.models import reinitialised

    torch.manual_seed(0)
    template = build_architecture("vgg11", 3, 32, 1)
    fresh = reinitialised(template)

    _assert_he_normal_fan_out(fresh)
    assert not torch.equal(fresh.features[0].weight, template.features[0].weight)  # drawn afresh
    with torch.no_grad():  # the signal survives the eleven layers (torch's default: logits of std ~2e-5)
        assert fresh(torch.randn(64, 3, 32, 32)).std() > 1e-3


# ---- fashion_cnn's hidden layer (item 5) -------------------------------------------------------

def test_fashion_cnn_without_hidden_units_is_the_network_of_earlier_results():
    model = build_architecture("fashion_cnn", 1, 28, 10)

    # conv 1x16x5x5 + 16, conv 16x32x5x5 + 32, output 32*7*7 x 10 + 10
    assert n_params(model) == 416 + 12832 + 15690
    assert list(model.state_dict())[-2:] == ["head.weight", "head.bias"]  # checkpoints keep their keys
    assert model(torch.zeros(3, 1, 28, 28)).shape == (3, 10)


def test_fashion_cnn_with_512_hidden_units_has_mcmahans_fully_connected_layer():
    model = build_architecture("fashion_cnn", 1, 28, 10, hidden_units=512)

    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items() if k.startswith("head.")}
    assert shapes == {"head.0.weight": (512, 1568), "head.0.bias": (512,), "head.2.weight": (10, 512),
                      "head.2.bias": (10,)}
    assert n_params(model) == 416 + 12832 + (1568 * 512 + 512) + (512 * 10 + 10)
    assert isinstance(model.head[1], torch.nn.ReLU)
    # the hidden layer is rectified: a negative pre-activation adds nothing to the output
    with torch.no_grad():
        model.head[0].weight.zero_()
        model.head[0].bias.fill_(-1.0)
    out = model(torch.randn(2, 1, 28, 28))
    torch.testing.assert_close(out, model.head[2].bias.expand(2, 10))


@pytest.mark.parametrize("extra, words", [
    (["--model.hidden_units", "-1"], ("model.hidden_units=-1", ">= 0")),
    (["--model.hidden_units", "512", "--model.architecture", "simple_cnn"],
     ("model.hidden_units=512", "fashion_cnn", "simple_cnn")),
])
def test_bad_hidden_units_are_refused_before_anything_is_written(tmp_path, extra, words):
    with pytest.raises(ValueError) as err:
        main(["fit", *tiny_args(tmp_path / "run", "--federation.rounds", "1", *extra)])
    assert all(w in str(err.value) for w in words)
    assert not (tmp_path / "run").exists()


def test_hidden_units_setting_reaches_every_detector_and_the_checkpoint(tmp_path):
    summary = main(["fit", *tiny_args(tmp_path / "run", "--federation.rounds", "1", "--model.hidden_units", "16")])

    assert summary["config"]["model"] == {"architecture": "fashion_cnn", "hidden_units": 16}
    state = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt")["state"]
    # FedOVA: 10 detectors stacked, each 1568 -> 16 -> 1
    assert tuple(state["head.0.weight"].shape) == (10, 16, 1568)
    assert tuple(state["head.2.weight"].shape) == (10, 1, 16)


def test_a_checkpoint_written_before_hidden_units_existed_resumes_at_the_default(tmp_path):
    main(["fit", *tiny_args(tmp_path / "run", "--federation.rounds", "1")])
    ckpt_path = tmp_path / "run" / "checkpoints" / "last.ckpt"
    ckpt = load_checkpoint(ckpt_path)
    del ckpt["config"]["model"]["hidden_units"]
    save_atomic(ckpt, ckpt_path)

    resumed = main(["fit", *tiny_args(tmp_path / "run", "--federation.rounds", "2"), "--ckpt_path", str(ckpt_path)])
    assert resumed["rounds"] == 2
    with pytest.raises(ValueError, match="model.hidden_units"):  # but not with another network
        main(["fit", *tiny_args(tmp_path / "run", "--federation.rounds", "3", "--model.hidden_units", "8"),
              "--ckpt_path", str(ckpt_path)])


# ---- per-client evaluation (item 2) --------------------------------------------------------------

def test_class_accuracy_by_hand():
    # class 0: samples 0, 5 -> predicted 0, 2: 1/2; class 1: samples 1-3 -> 0, 1, 1: 2/3; class 2: 1/1
    acc = class_accuracy([0, 0, 1, 1, 2, 2], [0, 1, 1, 1, 2, 0], 4)
    np.testing.assert_allclose(acc[:3], [1 / 2, 2 / 3, 1.0])
    assert np.isnan(acc[3])  # no test sample of class 3


def test_client_accuracy_weights_class_accuracies_by_the_clients_training_labels():
    per_class = np.array([0.5, 0.8, 1.0, np.nan])
    counts = np.array([[10, 0, 0, 0],   # only class 0: 0.5
                       [0, 30, 10, 0],  # 3/4 * 0.8 + 1/4 * 1.0 = 0.85
                       [0, 0, 0, 0],    # no data: left out
                       [5, 0, 0, 5],    # class 3 has no test samples: weights renormalised, 0.5
                       [0, 0, 0, 7]])   # nothing left: left out
    acc, ids = client_accuracies(per_class, counts)
    np.testing.assert_allclose(acc, [0.5, 0.85, 0.5])
    assert ids.tolist() == [0, 1, 3]


def test_mean_and_student_t_interval_by_hand():
    s = mean_interval([0.5, 0.7, 0.9])
    # mean 0.7, s = 0.2, t(0.975, 2) = 4.302652729911275, half width = 4.3027 * 0.2 / sqrt(3)
    assert s["mean"] == pytest.approx(0.7) and s["std"] == pytest.approx(0.2) and s["clients"] == 3
    assert s["half_width"] == pytest.approx(4.302652729911275 * 0.2 / 3 ** 0.5)
    assert (s["low"], s["high"]) == pytest.approx((0.7 - s["half_width"], 0.7 + s["half_width"]))
    one = mean_interval([0.4])
    assert one["mean"] == 0.4 and np.isnan(one["half_width"])  # one client: no interval


def test_per_client_metrics_by_hand():
    # per class: 0 -> 1/2, 1 -> 1/1; clients: [2, 0] -> 0.5, [1, 1] -> 0.75, [0, 4] -> 1.0
    m = per_client_metrics([0, 1, 1], [0, 0, 1], np.array([[2, 0], [1, 1], [0, 4]]))
    assert m["client_accuracy"] == pytest.approx(0.75) and m["clients_evaluated"] == 3
    assert m["client_accuracy_std"] == pytest.approx(0.25)
    assert m["client_accuracy_ci95"] == pytest.approx(4.302652729911275 * 0.25 / 3 ** 0.5)


def test_summary_reports_the_last_evaluation_and_the_final_window_mean():
    history = [{"round": 1}, *({"round": r, "test/client_accuracy": a, "test/client_accuracy_ci95": 0.1,
                                "test/client_accuracy_std": 0.2, "test/clients_evaluated": 9}
                               for r, a in ((2, 0.5), (3, 0.6), (4, 0.8)))]
    s = client_accuracy_summary(history, final_window=2)
    assert (s["round"], s["mean"], s["half_width"], s["clients"]) == (4, 0.8, 0.1, 9)
    assert (s["low"], s["high"]) == pytest.approx((0.7, 0.9))
    assert s["final"] == pytest.approx(0.7) and s["final_window"] == 2
    assert client_accuracy_summary([{"round": 1, "test/accuracy": 0.5}], 2) is None


def test_per_client_evaluation_in_a_run_equals_a_recomputation_by_loops(tmp_path):
    args = tiny_args(tmp_path / "run", "--federation.rounds", "2", "--federation.per_client_eval", "true",
                     "--partition.scheme", "dirichlet")
    federation = build_federation(["fit", *args], callbacks=[])[2]

    summary = federation.fit()

    # recompute: each client's accuracy on the test samples of its classes, weighted by its
    # training label proportions, from the final global model
    with torch.inference_mode():
        pred = federation.strategy.predict_logits(federation.state, federation._data.test_x).argmax(1).numpy()
    y = federation._data.test_y.numpy()
    accuracies = []
    for k in range(10):
        labels = federation.train_labels[federation.client_indices[k]]
        if len(labels) == 0:
            continue
        accuracies.append(sum((labels == c).sum() / len(labels) * (pred[y == c] == c).mean() for c in set(labels)))
    from scipy.stats import t

    half = t.ppf(0.975, len(accuracies) - 1) * np.std(accuracies, ddof=1) / np.sqrt(len(accuracies))
    last = summary["history"][-1]
    assert last["test/clients_evaluated"] == len(accuracies) == 10
    assert last["test/client_accuracy"] == pytest.approx(np.mean(accuracies), abs=1e-12)
    assert last["test/client_accuracy_ci95"] == pytest.approx(half, abs=1e-12)
    assert summary["client_accuracy"]["mean"] == last["test/client_accuracy"]
    assert summary["client_accuracy"]["round"] == 2 and "Student-t" in summary["client_accuracy"]["interval"]
    assert all("test/client_accuracy" in m for m in summary["history"])  # every evaluated round


def test_class_report_by_hand():
    # true 0: predicted 0, 2; true 1: 1, 1, 0; class 2: no test sample
    r = class_report(3, [[1, 0, 1], [1, 2, 0], [0, 0, 0]])
    assert r["round"] == 3 and r["accuracy"] == [0.5, 2 / 3, None]
    assert r["confusion"] == [[1, 0, 1], [1, 2, 0], [0, 0, 0]] and r["confusion_rows"] == "true class"


def test_summary_keeps_the_last_test_evaluation_per_class(tmp_path):
    args = tiny_args(tmp_path / "run", "--federation.rounds", "2", "--partition.scheme", "dirichlet")
    federation = build_federation(["fit", *args], callbacks=[])[2]

    summary = federation.fit()

    with torch.inference_mode():
        pred = federation.strategy.predict_logits(federation.state, federation._data.test_x).argmax(1).numpy()
    y = federation._data.test_y.numpy()
    expected = np.zeros((10, 10), dtype=np.int64)
    np.add.at(expected, (y, pred), 1)
    classes = summary["test_classes"]
    assert classes["round"] == 2 and classes["confusion"] == expected.tolist()
    assert np.trace(expected) / len(y) == pytest.approx(summary["last_accuracy"])
    np.testing.assert_allclose([a for a in classes["accuracy"] if a is not None],
                               [(pred[y == c] == c).mean() for c in range(10) if (y == c).any()])


def test_per_client_evaluation_is_off_by_default(tmp_path):
    summary = main(["fit", *tiny_args(tmp_path / "run", "--federation.rounds", "1")])
    assert "client_accuracy" not in summary
    assert not any(k.startswith("test/client") for k in summary["history"][0])


def test_report_shows_the_mean_over_clients_with_its_interval(tmp_path):
    main(["fit", *tiny_args(tmp_path / "a", "--federation.rounds", "2", "--federation.per_client_eval", "true")])
    main(["fit", *tiny_args(tmp_path / "b", "--federation.rounds", "2")])
    s = json.loads((tmp_path / "a" / "summary.json").read_text())["client_accuracy"]

    main(["report", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "rep")])

    rows = list(csv.DictReader(open(tmp_path / "rep.csv")))
    assert float(rows[0]["client_accuracy"]) == s["mean"] and float(rows[0]["client_accuracy_ci95"]) == s["half_width"]
    assert rows[1]["client_accuracy"] == ""  # the run without per-client evaluation
    table = (tmp_path / "rep.md").read_text()
    assert "per-client acc. (95 % CI)" in table
    assert f"{100 * s['mean']:.2f} ± {100 * s['half_width']:.2f} %" in table


# ---- ATHENA-FL: detectors train for the whole budget (item 3) ---------------------------------

def _athena_after_rounds(tmp_path, rounds, **options):
    """Two clusters of 2 clients (detectors 0, 1 in cluster 0; 2, 3 in cluster 1); clients 0
    and 1 send the same detectors every round, so their validation accuracy repeats from the
    second detector round on: converged at detector round 2 (patience 1)."""
    from fl_lightning.strategies import ClientResult
    from tests.test_athena import DET, _strategy_with_two_clusters

    strategy, state = _strategy_with_two_clusters(tmp_path, **options)
    strategy.context.client_validation = lambda ids: (torch.zeros(4, 1, 4, 4), torch.tensor([0, 1, 2, 3]))
    w = {"head.weight": torch.full((2, 1, 16), 1.0), "head.bias": torch.tensor([[1.0], [-1.0]])}
    trained = []
    for _ in range(rounds):
        tasks = [strategy.configure_client(state, k, np.array([0, 1])) for k in (0, 1)]
        trained.append([t.classes if t else None for t in tasks])
        results = [ClientResult(t.client_id, w, 10, t.classes) for t in tasks if t]
        if results:
            state, _ = strategy.aggregate(state, results)
    return strategy, state, trained


def test_athena_detectors_keep_training_after_the_criterion_by_default(tmp_path):
    from tests.test_athena import CONVERGED_ROUND

    strategy, state, trained = _athena_after_rounds(tmp_path, 3)

    assert strategy.stop_converged is False
    assert trained == [[(0, 1), (0, 1)]] * 3  # round 3: still trained after converging in round 2
    assert state[CONVERGED_ROUND].tolist() == [2, 2, 0, 0] and int(state["athena.detector_rounds"]) == 4 - 1
    assert strategy.select_clients(state, torch.Generator().manual_seed(0), 4, 1.0) == [0, 1, 2, 3]
    assert not strategy.is_finished(state)
    # the criterion estimates E[e_dec]: 2, 2, and the 3 rounds trained for the two never converged
    report = strategy.communication_report(state, [])
    assert report["expected_rounds_to_convergence"] == (2 + 2 + 3 + 3) / 4
    assert report["detectors_converged"] == 2


def test_athena_stop_converged_freezes_detectors_as_an_option(tmp_path):
    from tests.test_athena import CONVERGED_ROUND

    strategy, state, trained = _athena_after_rounds(tmp_path, 3, stop_converged=True)

    assert trained == [[(0, 1), (0, 1)], [(0, 1), (0, 1)], [None, None]]  # frozen after round 2
    assert state[CONVERGED_ROUND].tolist() == [2, 2, 0, 0]
    assert strategy.select_clients(state, torch.Generator().manual_seed(0), 4, 1.0) == [2, 3]


@pytest.mark.parametrize("data", ["fmnist", "mnist", "cifar"])
def test_athena_and_fedavg_mobilenet_configs_get_the_same_training_rounds(data):
    import yaml

    athena = yaml.safe_load(open(f"configs/athena_{data}.yaml"))
    mobilenet = yaml.safe_load(open(f"configs/fedavg_mobilenet_{data}.yaml"))

    # ATHENA-FL's round 1 is the clustering probe; then as many detector rounds as FedAvg rounds
    assert athena["federation"]["rounds"] - 1 == mobilenet["federation"]["rounds"] == 200
    assert athena["algorithm"]["init_args"].get("stop_converged", False) is False
    for group in ("partition", "optimizer"):
        assert athena[group] == mobilenet[group]
    same = ("client_fraction", "local_epochs", "batch_size")
    assert {k: athena["federation"][k] for k in same} == {k: mobilenet["federation"][k] for k in same}


def test_the_athena_experiment_script_gives_both_sides_the_same_rounds_by_default():
    script = open("experiments/athena.sh").read()
    assert "MOBILENET_ROUNDS=${MOBILENET_ROUNDS:-$DET_ROUNDS}" in script
    assert "--federation.rounds $((DET_ROUNDS + 1))" in script  # + the probe round


# ---- sample-weighted averaging for the FedAvg family (item 6) ---------------------------------

def test_the_fedavg_family_weights_by_samples_by_default_and_fedova_does_not():
    from fl_lightning.strategies import (SCAFFOLD, FedAvg, FedDANE, FedDF, FedKT, FedNova, FedOVA, FedProx)

    defaults = {cls.__name__: cls().weighted for cls in (FedAvg, FedProx, SCAFFOLD, FedNova, FedDF, FedDANE, FedKT)}
    assert defaults == dict.fromkeys(defaults, True)
    assert FedOVA().weighted is False  # Eq. 5: the plain mean over the group


def _server(strategy, template):
    from fl_lightning.config import OptimizerConfig
    from fl_lightning.strategies import ServerContext

    strategy.setup(template, 2, OptimizerConfig("sgd", lr=0.1), "loop", ServerContext(num_clients=2))
    return strategy


@pytest.mark.parametrize("name", ["FedAvg", "FedProx", "FedDANE"])  # SCAFFOLD: tests/test_baselines.py
def test_fedavg_family_averages_by_hand_weighted_by_default_plain_as_an_option(name):
    from fl_lightning import strategies
    from fl_lightning.strategies import ClientResult

    template = torch.nn.Linear(1, 1, bias=False)
    cls = getattr(strategies, name)
    results = [ClientResult(0, {"weight": torch.tensor([[1.0]])}, 3500),   # #C=2 sizes: 3,500 ...
               ClientResult(1, {"weight": torch.tensor([[4.0]])}, 9000)]   # ... to 9,000

    def averaged(strategy):
        state = strategy.initial_state(torch.Generator().manual_seed(0))
        return strategy.aggregate(state, results)[0]["weight"].item()

    assert averaged(_server(cls(), template)) == pytest.approx((3500 * 1 + 9000 * 4) / 12500)  # 3.16
    assert averaged(_server(cls(weighted=False), template)) == pytest.approx(2.5)


def test_fedova_groups_stay_a_plain_mean():
    from fl_lightning.strategies import ClientResult, FedOVA

    strategy = _server(FedOVA(), torch.nn.Linear(1, 1, bias=False))
    state = {"weight": torch.zeros(2, 1, 1)}
    results = [ClientResult(0, {"weight": torch.tensor([[[1.0]]])}, 3500, (0,)),
               ClientResult(1, {"weight": torch.tensor([[[4.0]]])}, 9000, (0,))]
    assert strategy.aggregate(state, results)[0]["weight"].flatten().tolist() == [2.5, 0.0]


@pytest.mark.parametrize("config, weighted", [
    *((f"configs/fedavg_{d}.yaml", False) for d in ("fmnist", "cifar", "kws", "fsdd")),  # FedOVA's Algorithm 1
    *((f"configs/{a}_oneshot_fmnist.yaml", True) for a in ("fedavg", "fedprox", "scaffold", "feddf", "fednova")),
])
def test_configs_average_as_their_paper(config, weighted):
    from fl_lightning.settings import settings_parser

    parser = settings_parser()
    cfg = parser.instantiate(parser.parse_args(["--config", config]))
    assert cfg["algorithm"].weighted is weighted


@pytest.mark.parametrize("extra, cls, weighted", [
    ([], "FedOVA", False),
    (["--algorithm", "FedAvg"], "FedAvg", True),
    (["--algorithm", "SCAFFOLD"], "SCAFFOLD", True),
    (["--algorithm", "FedAvg", "--algorithm.weighted", "false"], "FedAvg", False),
    (["--algorithm", "AthenaFL", "--partition.validation_fraction", "0.1"], "AthenaFL", True),  # Eq. 4's p_kn
])
def test_an_algorithm_chosen_on_the_command_line_gets_its_own_defaults(tmp_path, extra, cls, weighted):
    # jsonargparse used to carry FedOVA's weighted=False over to whatever --algorithm named
    federation = build_federation(["fit", *tiny_args(tmp_path / "run", *extra)], callbacks=[])[2]

    assert type(federation.strategy).__name__ == cls and federation.strategy.weighted is weighted
    assert federation.config["algorithm"]["init_args"]["weighted"] is weighted  # as summary.json records it
