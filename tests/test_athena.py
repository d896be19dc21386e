"""ATHENA-FL: the label-group partition, DBSCAN clustering, the detector database,
composition, the convergence criterion, and the strategy end to end on synthetic data."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fl_lightning.cli import main
from fl_lightning.algorithms.athena.clustering import DBSCANClustering, auto_eps, label_set_ids
from fl_lightning.algorithms.athena.clustering import k_distances, relabel
from fl_lightning.algorithms.athena.composition import OneVsAllModel, choose_detectors
from fl_lightning.config import OptimizerConfig, PartitionConfig
from fl_lightning.convergence import convergence_index, has_converged, multiclass_communication
from fl_lightning.data.partition import partition_clients
from fl_lightning.data.preprocess import hold_out_validation
from fl_lightning.algorithms.athena.detector_db import DetectorDatabase, DetectorRecord
from fl_lightning.models import AthenaDetectorCNN, MobileNet, last_layer_names
from fl_lightning.strategies import AthenaFL, ServerContext
from fl_lightning.algorithms.athena.strategy import CLIENT_CLUSTER, CONVERGED_ROUND, DET, DET_CLASS, DET_CLUSTER
from fl_lightning.strategy import ClientResult
from tests.conftest import tiny_args


def athena_args(run_dir, *extra):
    return tiny_args(run_dir, "--algorithm", "AthenaFL", "--algorithm.probe_architecture", "simple_cnn",
                     "--partition.scheme", "label_groups", "--partition.validation_fraction", "0.1",
                     "--data.image_size", "32", "--model.architecture", "athena_cnn",
                     "--optimizer.name", "adam", "--optimizer.lr", "0.001", *extra)


# ---- partition and validation split -----------------------------------------------------

@pytest.mark.parametrize("l", [2, 5])
def test_label_groups_gives_each_client_exactly_its_groups_l_classes(l):
    labels = np.repeat(np.arange(10), 50)
    clients = partition_clients(labels, PartitionConfig(scheme="label_groups", num_clients=20, labels_per_client=l), 0)
    groups = 10 // l
    for k, idx in enumerate(clients):
        g = k % groups
        assert sorted(set(labels[idx].tolist())) == list(range(g * l, (g + 1) * l))
    assert sorted(np.concatenate(clients).tolist()) == list(range(len(labels)))  # every sample exactly once


def test_label_groups_rejects_l_that_does_not_divide_the_classes():
    with pytest.raises(ValueError, match="labels_per_client=3"):
        partition_clients(np.repeat(np.arange(10), 5), PartitionConfig(scheme="label_groups", num_clients=10,
                                                                       labels_per_client=3), 0)


def test_validation_split_is_disjoint_and_of_the_asked_size():
    clients = [np.arange(0, 100), np.arange(100, 130)]
    train, val = hold_out_validation(clients, 0.1, seed=3)
    for c, t, v in zip(clients, train, val):
        assert len(v) == round(0.1 * len(c)) and not set(t) & set(v) and sorted([*t, *v]) == c.tolist()


# ---- clustering --------------------------------------------------------------------------

def _three_groups(rng, per_group=5, dim=20):
    centres = rng.normal(size=(3, dim)) * 5
    vectors = np.vstack([c + 0.05 * rng.normal(size=(per_group, dim)) for c in centres])
    return vectors, np.repeat(np.arange(3), per_group)


@pytest.mark.parametrize("scaling", ["l2", "standard", "none"])
def test_dbscan_with_auto_eps_recovers_separated_groups(scaling):
    vectors, truth = _three_groups(np.random.default_rng(0))
    labels, facts = DBSCANClustering(scaling=scaling).fit(vectors)
    assert labels.tolist() == truth.tolist() and facts["noise_clients"] == 0


def test_default_l2_scaling_groups_clients_by_direction_not_by_how_far_they_moved():
    # Two groups of 4 clients that differ only in direction (30 degrees apart), each client
    # moving 1, 3, 9 or 27 times as far: clients with more data move their weights further.
    rng = np.random.default_rng(4)
    directions = np.array([[1.0, 0.0, 0.0], [np.cos(np.pi / 6), np.sin(np.pi / 6), 0.0]])
    vectors = np.vstack([d * r for d in directions for r in (1.0, 3.0, 9.0, 27.0)])
    vectors += 1e-3 * rng.normal(size=vectors.shape)
    truth = [0, 0, 0, 0, 1, 1, 1, 1]

    labels, facts = DBSCANClustering().fit(vectors)  # the default: each vector to unit norm first
    unscaled, _ = DBSCANClustering(scaling="none").fit(vectors)

    assert labels.tolist() == truth and facts["noise_clients"] == 0
    assert unscaled.tolist() != truth  # by length, 1x of one direction is nearer 1x of the other than 3x of its own


def test_noise_points_become_singletons_or_join_the_nearest_cluster():
    vectors, _ = _three_groups(np.random.default_rng(1))
    vectors = np.vstack([vectors, vectors[0] + 0.3])  # near group 0, but outside a tight eps
    single, facts = DBSCANClustering(eps=0.01, scaling="none").fit(vectors)
    assert facts["noise_clients"] >= 1 and single[-1] == single.max() and (single == single[-1]).sum() == 1
    nearest, _ = DBSCANClustering(eps=0.5, scaling="none", noise="nearest").fit(vectors)
    assert nearest[-1] == nearest[0]


def test_auto_eps_puts_clients_without_group_structure_in_one_cluster():
    vectors = np.random.default_rng(2).normal(size=(12, 50))  # IID-like: all distances alike
    labels, _ = DBSCANClustering().fit(vectors)
    assert set(labels.tolist()) == {0}
    assert auto_eps(DBSCANClustering().scale(vectors)) > 0


def test_new_client_joins_its_nearest_group_or_opens_a_new_one():
    vectors, truth = _three_groups(np.random.default_rng(3))
    clustering = DBSCANClustering(scaling="none")
    labels, _ = clustering.fit(vectors)
    assert clustering.assign(vectors, labels, vectors[7] + 0.01) == labels[7]
    assert clustering.assign(vectors, labels, vectors[0] * 0 + 1000.0) == labels.max() + 1


def test_label_set_ids_group_equal_label_sets():
    assert label_set_ids([(0, 1), (2, 3), (1, 0), (2, 3), (4,)]).tolist() == [0, 1, 0, 1, 2]


# ---- clustering, by hand (each branch of fl_lightning/algorithms/athena/clustering.py; docs/mutation.md) ---------

def test_clustering_settings_refuse_a_non_positive_eps_or_min_samples_below_one():
    for eps in (0, 0.0, -1.0):
        with pytest.raises(ValueError, match="clustering.eps"):
            DBSCANClustering(eps=eps)
    with pytest.raises(ValueError, match="clustering.min_samples"):
        DBSCANClustering(min_samples=0)
    # the smallest accepted values: any eps above 0, min_samples 1 (every client a core point)
    labels, facts = DBSCANClustering(eps=1e-9, min_samples=1, scaling="none").fit(np.array([[0.0], [1.0], [1.0]]))
    assert labels.tolist() == [0, 1, 1] and facts == {"eps": 1e-9, "noise_clients": 0}
    assert DBSCANClustering(eps=0.5).eps == 0.5 and DBSCANClustering().eps == "auto"


def test_scale_by_hand_and_by_sklearn():
    from sklearn.preprocessing import StandardScaler, normalize

    # l2: each row to unit norm (a norm below 1 too); a zero row stays zero instead of NaN
    v = np.array([[3.0, 4.0], [0.0, 0.5], [0.0, 0.0]], dtype=np.float32)
    l2 = DBSCANClustering(scaling="l2").scale(v)
    assert l2.dtype == np.float64 and l2.tolist() == [[0.6, 0.8], [0.0, 1.0], [0.0, 0.0]]
    assert np.allclose(l2, normalize(v.astype(np.float64)))
    # standard: z-score per feature (population std, as sklearn's StandardScaler); a constant
    # feature (std 0) becomes 0; a feature with std below 1 is scaled up too
    w = np.array([[0.0, 10.0, 5.0], [1.0, 30.0, 5.0]], dtype=np.float32)
    standard = DBSCANClustering(scaling="standard").scale(w)
    assert standard.dtype == np.float64 and standard.tolist() == [[-1.0, -1.0, 0.0], [1.0, 1.0, 0.0]]
    assert np.allclose(standard, StandardScaler().fit_transform(w.astype(np.float64)))
    # none: the values as they are, in float64
    none = DBSCANClustering(scaling="none").scale(w)
    assert none.dtype == np.float64 and none.tolist() == w.tolist()


def test_auto_eps_is_the_geometric_midpoint_of_the_largest_gap_by_hand():
    # 1-D clients 0, 1, 10, 11: distances {1, 9, 10, 11}; ratios 9, 10/9, 11/10: the gap is
    # between 1 and 9, eps = sqrt(1 * 9) = 3
    assert auto_eps(np.array([[0.0], [1.0], [10.0], [11.0]])) == pytest.approx(3.0, rel=1e-12)
    # two distinct distances {1, 2}: ratio 2 >= 1.5, eps = sqrt(2); a ratio equal to
    # min_gap_ratio is a gap
    line = np.array([[0.0], [1.0], [2.0]])
    assert auto_eps(line) == pytest.approx(np.sqrt(2.0), rel=1e-12)
    assert auto_eps(line, min_gap_ratio=2.0) == pytest.approx(np.sqrt(2.0), rel=1e-12)
    # the metric is the one asked for: cityblock distances {2, 10, 12}, eps = sqrt(2 * 10)
    # (euclidean would give {sqrt 2, sqrt 82, 10, sqrt 122}, eps = (2 * 82) ** 0.25)
    square = np.array([[0.0, 0.0], [1.0, 1.0], [10.0, 0.0], [11.0, 1.0]])
    assert auto_eps(square, "cityblock") == pytest.approx(np.sqrt(20.0), rel=1e-12)
    assert auto_eps(square) == pytest.approx(164.0 ** 0.25, rel=1e-12)


def test_auto_eps_without_a_gap_covers_every_distance_and_handles_fewer_than_two_distances():
    # no ratio reaches min_gap_ratio: eps = 1.01 x the largest distance (one cluster)
    assert auto_eps(np.array([[0.0], [1.0], [3.0]]), min_gap_ratio=3.0) == pytest.approx(3.03, rel=1e-12)
    assert auto_eps(np.array([[0.0], [1.0], [2.0]]), min_gap_ratio=3.0) == pytest.approx(2.02, rel=1e-12)
    # one distinct non-zero distance (zero distances skipped): 1.5 x it
    assert auto_eps(np.array([[0.0], [2.0]])) == pytest.approx(3.0, rel=1e-12)
    assert auto_eps(np.array([[0.0], [2.0], [0.0]])) == pytest.approx(3.0, rel=1e-12)
    assert auto_eps(np.array([[0.0, 0.25], [0.25, 0.0]]), "cityblock") == pytest.approx(0.75, rel=1e-12)
    # no non-zero distance (identical clients, or one client): 1.0
    assert auto_eps(np.array([[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]])) == 1.0
    assert auto_eps(np.array([[0.5, 0.5]])) == 1.0


def test_k_distances_by_hand_and_by_nearest_neighbours():
    from sklearn.neighbors import NearestNeighbors

    # 1-D clients 0, 1, 3, 7: rows of sorted distances [0 1 3 7], [0 1 2 6], [0 2 3 4], [0 4 6 7]
    line = np.array([[0.0], [1.0], [3.0], [7.0]])
    assert k_distances(line, 1).tolist() == [1.0, 1.0, 2.0, 4.0]
    assert k_distances(line, 2).tolist() == [2.0, 3.0, 3.0, 6.0]
    assert k_distances(line, 10).tolist() == [4.0, 6.0, 7.0, 7.0]  # k capped at the farthest other client
    for k in (1, 2, 3):
        nn = NearestNeighbors(n_neighbors=k + 1).fit(line).kneighbors(line)[0][:, k]
        assert np.allclose(k_distances(line, k), np.sort(nn))
    # the metric is the one asked for: cityblock (0,0)-(1,1) = 2, (0,0)-(3,0) = 3, (1,1)-(3,0) = 3
    triangle = np.array([[0.0, 0.0], [1.0, 1.0], [3.0, 0.0]])
    assert k_distances(triangle, 1, "cityblock").tolist() == [2.0, 2.0, 3.0]


def test_fit_with_an_explicit_eps_and_metric_makes_noise_clients_singletons_by_hand():
    from sklearn.cluster import DBSCAN

    # cityblock, eps 1.5: (0,0)-(1,1) is 2 (noise both; euclidean sqrt 2 would pair them),
    # (10,0)-(11,0) is 1 (a cluster)
    v = np.array([[0.0, 0.0], [1.0, 1.0], [10.0, 0.0], [11.0, 0.0]])
    clustering = DBSCANClustering(eps=1.5, metric="cityblock", scaling="none")
    assert DBSCAN(eps=1.5, min_samples=2, metric="cityblock").fit_predict(v).tolist() == [-1, -1, 0, 0]
    labels, facts = clustering.fit(v)
    assert labels.tolist() == [0, 1, 2, 2] and facts == {"eps": 1.5, "noise_clients": 2}


def test_fit_with_auto_eps_uses_the_metric():
    square = np.array([[0.0, 0.0], [1.0, 1.0], [10.0, 0.0], [11.0, 1.0]])
    labels, facts = DBSCANClustering(metric="cityblock", scaling="none").fit(square)
    assert labels.tolist() == [0, 0, 1, 1] and facts["noise_clients"] == 0
    assert facts["eps"] == pytest.approx(np.sqrt(20.0), rel=1e-12)  # cityblock {2, 10, 12}, not euclidean


def test_nearest_noise_rule_joins_each_noise_client_to_its_nearest_clustered_client_by_hand():
    # cityblock, eps 1.5: clusters B = {(10,0), (11,0)} and A = {(8,3), (8,4)}; two noise clients:
    # (5,0) is 5 from B's (10,0) and 6 from A's (8,3) (euclidean: 5 and 4.24, it would join A);
    # (8,7) is 3 from A's (8,4) and 9 from B
    v = np.array([[10.0, 0.0], [11.0, 0.0], [5.0, 0.0], [8.0, 3.0], [8.0, 4.0], [8.0, 7.0]])
    labels, facts = DBSCANClustering(eps=1.5, metric="cityblock", scaling="none", noise="nearest").fit(v)
    assert labels.tolist() == [0, 0, 0, 1, 1, 1] and facts == {"eps": 1.5, "noise_clients": 2}
    # every client noise: there is no cluster to join, each becomes its own
    labels, facts = DBSCANClustering(eps=1.0, scaling="none", noise="nearest").fit(np.array([[0.0], [10.0], [20.0]]))
    assert labels.tolist() == [0, 1, 2] and facts == {"eps": 1.0, "noise_clients": 3}


def test_relabel_numbers_clusters_by_first_appearance_as_integers():
    assert relabel(np.array([5, -1, 5, 3, -1])).tolist() == [0, 1, 0, 2, 1]
    empty = relabel(np.array([]))
    assert empty.dtype == np.int64 and empty.size == 0  # usable as an index array


def test_assign_by_hand_with_auto_eps_an_explicit_eps_and_a_metric():
    from sklearn.cluster import DBSCAN

    # known 1-D clients 0, 1, 10, 12 in clusters 0, 0, 1, 1: distances {1, 2, 9, 10, 11, 12},
    # largest ratio 9 / 2, eps = sqrt(18) = 4.24 (from all four known clients)
    known, known_labels = np.array([[0.0], [1.0], [10.0], [12.0]]), np.array([0, 0, 1, 1])
    assert auto_eps(known) == pytest.approx(np.sqrt(18.0), rel=1e-12)
    auto = DBSCANClustering(scaling="none")
    assert auto.assign(known, known_labels, np.array([15.5])) == 1  # 3.5 from the last known client
    assert auto.assign(known, known_labels, np.array([17.0])) == 2  # 5 > 4.24: a new cluster
    # an explicit eps, inclusive like DBSCAN's neighbourhood: 3.5 joins at eps 3.5, not at 3
    assert DBSCANClustering(eps=3.0, scaling="none").assign(known, known_labels, np.array([15.5])) == 2
    assert DBSCANClustering(eps=3.5, scaling="none").assign(known, known_labels, np.array([15.5])) == 1
    assert DBSCAN(eps=3.5, min_samples=2).fit_predict(np.array([[12.0], [15.5]])).tolist() == [0, 0]
    # cityblock, auto eps sqrt(20) = 4.47 (euclidean's would be 3.58): (11,5) is 4 from (11,1)
    # and joins; (14,4) is 6 from (11,1) (euclidean 4.24) and opens a new cluster
    square = np.array([[0.0, 0.0], [1.0, 1.0], [10.0, 0.0], [11.0, 1.0]])
    city = DBSCANClustering(metric="cityblock", scaling="none")
    assert city.assign(square, known_labels, np.array([11.0, 5.0])) == 1
    assert city.assign(square, known_labels, np.array([14.0, 4.0])) == 2


# ---- convergence -------------------------------------------------------------------------

def test_convergence_is_the_first_evaluation_within_tol_of_the_previous():
    assert not has_converged(None, 0.5)
    assert has_converged(0.5, 0.5) and not has_converged(0.5, 0.5001)
    assert convergence_index([0.1, 0.5, 0.6, 0.6, 0.7]) == 3
    assert convergence_index([0.1, 0.2, 0.3]) is None
    history = [{"round": r, "bytes/down": 10, "bytes/up": 5, "test/accuracy": a}
               for r, a in zip((1, 2, 3, 4), (0.2, 0.4, 0.4, 0.5))]
    report = multiclass_communication(100, history)
    assert report["rounds_to_convergence"] == 3 and report["bytes_per_client_eq"] == 300
    assert report["bytes_measured_to_convergence"] == 45


# ---- detector database and composition ----------------------------------------------------

def _record(cluster, label, value, classes=(0, 1), acc=0.9, run="r"):
    return DetectorRecord(run=run, cluster=cluster, class_label=label, round=3, converged=True, val_accuracy=acc,
                          val_samples=10, cluster_classes=classes, architecture="logistic", in_channels=1,
                          image_size=4, params={"head.weight": torch.full((1, 16), float(value)),
                                                "head.bias": torch.tensor([float(value)])})


def test_database_round_trip_upsert_and_atomic_batches(tmp_path):
    db = DetectorDatabase(f"sqlite:///{tmp_path / 'd.sqlite'}")
    db.put([_record(0, 0, 1.0), _record(0, 1, 2.0)])
    db.put([_record(0, 1, 3.0)])  # a newer version replaces the old one
    loaded = db.load()
    assert [(r.cluster, r.class_label) for r in loaded] == [(0, 0), (0, 1)]
    torch.testing.assert_close(loaded[1].params["head.weight"], torch.full((1, 16), 3.0))
    assert loaded[0].byte_size == 17 * 4 and loaded[0].cluster_classes == (0, 1)
    broken = _record(1, 2, 5.0)
    broken.class_label = None  # violates NOT NULL: the whole batch must roll back
    with pytest.raises(Exception):
        db.put([_record(1, 3, 4.0), broken])
    assert [(r.cluster, r.class_label) for r in db.load()] == [(0, 0), (0, 1)]


def test_database_url_that_cannot_be_opened_names_the_url(tmp_path):
    with pytest.raises(ValueError, match="nowhere/at/all"):
        DetectorDatabase(f"sqlite:///{tmp_path}/nowhere/at/all/d.sqlite")
    with pytest.raises(ValueError, match="cannot be opened"):
        DetectorDatabase("nosuchdialect://host/db")


def test_composition_criteria_pick_the_documented_detectors():
    c = [SimpleNamespace(class_label=0, cluster=0, cluster_classes=(0, 1), val_accuracy=0.99),
         SimpleNamespace(class_label=0, cluster=1, cluster_classes=(0, 1, 2, 3, 4), val_accuracy=0.90),
         SimpleNamespace(class_label=1, cluster=0, cluster_classes=(0, 1), val_accuracy=0.80),
         SimpleNamespace(class_label=1, cluster=2, cluster_classes=(1, 5), val_accuracy=0.85)]
    assert choose_detectors(c, "most_classes") == [1, 3]  # class 1: tie on size, better accuracy
    assert choose_detectors(c, "val_accuracy") == [0, 3]
    assert choose_detectors(c, "ensemble") == [0, 1, 2, 3]


def test_one_vs_all_model_averages_probabilities_per_class_and_skips_missing_classes():
    template = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(2, 1))
    stacked = {"1.weight": torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]], [[1.0, 1.0]]]),
               "1.bias": torch.zeros(3, 1)}
    model = OneVsAllModel(template, stacked, [0, 0, 2], num_classes=3)
    x = torch.tensor([[[2.0, -1.0]]])
    expected = torch.tensor([[(torch.sigmoid(torch.tensor(2.0)) + torch.sigmoid(torch.tensor(-1.0))) / 2, -1.0,
                              torch.sigmoid(torch.tensor(1.0))]])
    torch.testing.assert_close(model(x), expected)


# ---- networks ------------------------------------------------------------------------------

def test_athena_networks_sizes_and_last_layer():
    detector = AthenaDetectorCNN(1, 32, 1)
    assert sum(p.numel() for p in detector.parameters()) == 130945  # 524 kB in float32
    mobilenet = MobileNet(1, 32, 10)
    assert last_layer_names(mobilenet) == ["head.weight", "head.bias"]
    assert sum(mobilenet.state_dict()[n].numel() for n in last_layer_names(mobilenet)) * 4 == 41000
    assert mobilenet(torch.zeros(2, 1, 32, 32)).shape == (2, 10)
    with pytest.raises(ValueError, match="data.image_size"):
        AthenaDetectorCNN(1, 28, 1)


# ---- the strategy --------------------------------------------------------------------------

def _strategy_with_two_clusters(tmp_path, **options):
    from fl_lightning.models import build_architecture

    template = build_architecture("logistic", 1, 4, 1)
    context = ServerContext(num_clients=4, make_model=lambda n, a=None: build_architecture("logistic", 1, 4, n),
                            client_validation=lambda ids: (torch.zeros(0, 1, 4, 4), torch.zeros(0, dtype=torch.long)),
                            run_dir=str(tmp_path), input_shape=(1, 4, 4))
    strategy = AthenaFL(probe_architecture="simple_cnn", **options)
    strategy.setup(template, 4, OptimizerConfig(), "loop", context)
    state = strategy.initial_state(torch.Generator().manual_seed(0))
    state[CLIENT_CLUSTER] = torch.tensor([0, 0, 1, 1])
    state[DET_CLUSTER], state[DET_CLASS] = torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 2, 3])
    for name, p in template.named_parameters():
        state[DET + name] = torch.zeros((4, *p.shape))
    for key in ("athena.val_accuracy", "athena.prev_val_accuracy"):
        state[key] = torch.full((4,), float("nan"), dtype=torch.float64)
    for key in (CONVERGED_ROUND, "athena.val_samples", "athena.stable_rounds"):
        state[key] = torch.zeros(4, dtype=torch.long)
    return strategy, state


def test_detectors_are_averaged_within_their_cluster_weighted_by_samples(tmp_path):
    strategy, state = _strategy_with_two_clusters(tmp_path)
    task = strategy.configure_client(state, 1, np.array([0, 1, 1]))
    assert task.kind == "detectors" and task.classes == (0, 1)
    w = lambda v: {"head.weight": torch.full((2, 1, 16), v), "head.bias": torch.full((2, 1), v)}
    results = [ClientResult(0, w(1.0), 10, (0, 1)), ClientResult(1, w(4.0), 30, (0, 1))]
    new, facts = strategy.aggregate(state, results)
    torch.testing.assert_close(new[DET + "head.weight"][:2], torch.full((2, 1, 16), (10 * 1 + 30 * 4) / 40))
    torch.testing.assert_close(new[DET + "head.weight"][2:], torch.zeros(2, 1, 16))  # other cluster untouched
    assert facts["detectors/trained"] == 2


def test_kept_optimizer_state_is_asked_of_the_detectors_and_not_of_the_one_off_probe(tmp_path):
    from fl_lightning.models import build_architecture

    strategy, clustered = _strategy_with_two_clusters(tmp_path)
    strategy.setup(build_architecture("logistic", 1, 4, 1), 4, OptimizerConfig("adam", keep_state=True), "loop",
                   strategy.context)
    probe = strategy.configure_client(strategy.initial_state(torch.Generator().manual_seed(0)), 1, np.array([0, 1]))
    detectors = strategy.configure_client(clustered, 1, np.array([0, 1]))
    assert probe.kind == "classifier" and not probe.optimizer.keep_state
    assert detectors.kind == "detectors" and detectors.optimizer.keep_state


def test_sampling_takes_a_fraction_of_every_active_cluster(tmp_path):
    strategy, state = _strategy_with_two_clusters(tmp_path, stop_converged=True)  # freezing (not the default)
    chosen = strategy.select_clients(state, torch.Generator().manual_seed(0), 4, 0.2)
    assert len(chosen) == 2 and {c // 2 for c in chosen} == {0, 1}  # one client of each cluster
    state[CONVERGED_ROUND] = torch.tensor([2, 2, 0, 0])  # cluster 0 is done
    chosen = strategy.select_clients(state, torch.Generator().manual_seed(0), 4, 1.0)
    assert chosen == [2, 3]
    state[CONVERGED_ROUND] = torch.tensor([2, 2, 3, 3])
    assert strategy.is_finished(state)


def test_iid_clients_form_one_cluster_that_trains_every_classes_detector(tmp_path):
    """Section 5.2.1's setting (cells.yaml lists its commands): every client holds every class,
    so the probe's last layers put all of them in one cluster, whose ten detectors train."""
    summary = main(["fit", *athena_args(tmp_path, "--federation.rounds", "2", "--partition.scheme", "iid")])
    probe, detectors = summary["history"]
    assert probe["clustering/clusters"] == 1 and probe["clustering/ari"] == 1.0
    assert summary["communication"]["detectors"] == 10 and detectors["detectors/total"] == 10
    assert sorted(k for k in detectors if k.startswith("test/detector_acc/")) == [
        f"test/detector_acc/g0_c{c}" for c in range(10)]


def test_athena_run_clusters_trains_stores_and_composes_from_the_database_alone(tmp_path):
    run = tmp_path / "run"
    summary = main(["fit", *athena_args(run, "--federation.rounds", "3")])
    probe = summary["history"][0]
    assert probe["clustering/ari"] == 1.0 and probe["clustering/clusters"] == 5
    assert probe["bytes/up"] == 10 * probe["clustering/bytes_per_client"]  # only the last layers travel up
    assert probe["clustering/bytes_per_client"] == (84 * 10 + 10) * 4
    comm = summary["communication"]
    assert comm["detectors"] == 10 and comm["detector_bytes"] == 130945 * 4
    db = DetectorDatabase(f"sqlite:///{run / 'detectors.sqlite'}")
    assert len(db.load()) == 10
    # Step 6 from the database alone (`fl_lightning compose` reads nothing else) ...
    out = tmp_path / "pred.pt"
    done = main(["compose", "--db_url", f"sqlite:///{run / 'detectors.sqlite'}", "--data.name", "synthetic",
                 "--data.synthetic_size", "600", "--data.image_size", "32", "--output", str(out)])
    separate = torch.load(out, weights_only=True)["predictions"]
    # ... equals the run's own composed model, rebuilt from its checkpoint in this process.
    from fl_lightning.checkpoint import load_checkpoint
    from fl_lightning.config import DataConfig
    from fl_lightning.data import load_dataset
    from fl_lightning.data.preprocess import resize_images
    from fl_lightning.models import build_architecture

    data = resize_images(load_dataset(DataConfig(name="synthetic", synthetic_size=600)), 32)
    strategy = AthenaFL(probe_architecture="simple_cnn")
    context = ServerContext(10, lambda n, a=None: build_architecture(a or "athena_cnn", 1, 32, n),
                            client_validation=lambda ids: None, run_dir=str(tmp_path / "elsewhere"),
                            input_shape=(1, 32, 32))
    strategy.setup(build_architecture("athena_cnn", 1, 32, 1), 10, OptimizerConfig(), "loop", context)
    state = load_checkpoint(run / "checkpoints" / "last.ckpt")["state"]
    with torch.inference_mode():
        own = strategy.predict_logits(state, data.test_x).argmax(1)
    assert torch.equal(own, separate)
    assert abs(done["accuracy"] - summary["last_accuracy"]) < 1e-6 and done["test_samples"] == len(own)


def test_athena_resumed_run_equals_an_uninterrupted_one(tmp_path):
    whole = main(["fit", *athena_args(tmp_path / "a", "--federation.rounds", "3", "--run.checkpoint_every", "1")])
    main(["fit", *athena_args(tmp_path / "b", "--federation.rounds", "2", "--run.checkpoint_every", "1")])
    resumed = main(["fit", *athena_args(tmp_path / "b", "--federation.rounds", "3"), "--ckpt_path",
                    str(tmp_path / "b" / "checkpoints" / "last.ckpt")])
    assert [m.get("test/accuracy") for m in whole["history"]] == [m.get("test/accuracy") for m in resumed["history"]]
    assert whole["communication"] == {**resumed["communication"]}


def test_athena_needs_a_validation_split(tmp_path):
    with pytest.raises(ValueError, match="validation_fraction"):
        main(["fit", *athena_args(tmp_path, "--partition.validation_fraction", "0")])


def test_cluster_on_all_uploads_every_probe_parameter(tmp_path):
    from fl_lightning.models import build_architecture

    context = ServerContext(num_clients=2, make_model=lambda n, a=None: build_architecture(a or "logistic", 1, 32, n),
                            client_validation=lambda ids: None, run_dir=str(tmp_path), input_shape=(1, 32, 32))
    for on, expected in (("last_layer", ("head.2.weight", "head.2.bias")), ("all", None)):
        strategy = AthenaFL(probe_architecture="simple_cnn", cluster_on=on)
        strategy.setup(build_architecture("athena_cnn", 1, 32, 1), 10, OptimizerConfig(), "loop", context)
        names = tuple(n for n, _ in strategy.probe.named_parameters())
        assert strategy.upload_names == (expected or names)
        task = strategy.configure_client(strategy.initial_state(torch.Generator().manual_seed(0)), 0, np.array([1, 2]))
        assert task.upload == strategy.upload_names and task.kind == "classifier" and task.epochs == 1


def test_batch_norm_networks_skip_a_lone_sample_batch_instead_of_failing():
    from fl_lightning.algorithms.baselines import MultiClassClassifier

    net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.AdaptiveAvgPool2d(1),
                              torch.nn.Flatten(), torch.nn.Linear(4, 3))
    module = MultiClassClassifier(net, OptimizerConfig())
    assert module.training_step((torch.randn(1, 1, 8, 8), torch.tensor([0])), 0) is None
    assert torch.isfinite(module.training_step((torch.randn(2, 1, 8, 8), torch.tensor([0, 1])), 0))
    plain = MultiClassClassifier(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 3)), OptimizerConfig())
    assert plain.training_step((torch.randn(1, 1, 8, 8), torch.tensor([0])), 0) is not None  # nothing skipped without BN


def test_athena_fl_run_prints_no_openblas_warning(tmp_path):
    # The real command line with the shipped config's threads (no thread settings in the
    # environment): scikit-learn's clustering called BLAS inside its own OpenMP loops and
    # OpenBLAS warned "Detect OpenMP Loop and this application may hang" once per client
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    done = subprocess.run(
        [sys.executable, "-m", "fl_lightning", "fit", "--config", "configs/athena_fmnist.yaml", "--data.name", "synthetic",
         "--data.synthetic_size", "600", "--partition.num_clients", "10", "--federation.rounds", "1",
         "--trainer.workers", "2", "--run.dir", str(tmp_path / "run"), "--run.logger", "none", "--run.progress", "off"],
        cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "OpenBLAS" not in done.stderr + done.stdout
