import functools
import gzip
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from fl_lightning.config import PartitionConfig, default_data_root
from fl_lightning.data.partition import dirichlet, non_iid_l, num_labels, partition_clients, partition_table

REPO = Path(__file__).resolve().parents[1]
# Clients drawn by NIID-Bench's own partition_data (and FedOV's copy of it), recorded outside
# this repository: tests/data/niid_bench_partitions.json says how.
RECORDED = json.loads((REPO / "tests" / "data" / "niid_bench_partitions.json").read_text())
LABEL_FILES = {  # where the recorded label vectors live on a machine that has the data sets
    "mnist": [REPO.parent / "shared" / "data" / "MNIST" / "raw" / "train-labels-idx1-ubyte",
              Path(default_data_root()) / "MNIST" / "raw" / "train-labels-idx1-ubyte"],
    "fashion_mnist": [Path("/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz"),
                      Path(default_data_root()) / "FashionMNIST" / "raw" / "train-labels-idx1-ubyte"],
}


def balanced_labels(per_class=600, n=10):
    return np.repeat(np.arange(n), per_class)


@pytest.mark.parametrize("l", [1, 2, 3, 5])
def test_non_iid_l_gives_every_client_exactly_l_labels_and_each_sample_once(l):
    labels = balanced_labels()
    clients = non_iid_l(labels, num_clients=100, labels_per_client=l, rng=np.random.default_rng(0))

    table = partition_table(labels, clients, 10)
    assert ((table > 0).sum(1) == l).all()
    everything = np.concatenate(clients)
    assert len(everything) == len(labels) and len(np.unique(everything)) == len(labels)
    # every label is cut into l*K/n equal shards, one per holding client
    assert ((table > 0).sum(0) == l * 100 // 10).all()
    assert set(table[table > 0].tolist()) == {600 // (l * 10)}


def test_non_iid_2_pairs_labels_randomly():
    labels = balanced_labels()
    clients = non_iid_l(labels, 100, 2, np.random.default_rng(0))
    label_sets = {tuple(np.unique(labels[c])) for c in clients}
    # a fixed pairing (c with c+5) would give 5 sets; random pairing gives most of the 45
    assert len(label_sets) >= 25
    partners_of_0 = {c for s in label_sets if 0 in s for c in s} - {0}
    assert len(partners_of_0) >= 5


def test_non_iid_l_rejects_uneven_shards():
    with pytest.raises(ValueError, match="labels_per_client=3 x partition.num_clients=7"):
        non_iid_l(balanced_labels(), 7, 3, np.random.default_rng(0))


def test_num_labels_follows_niid_bench():
    labels = balanced_labels(100)
    clients = num_labels(labels, 10, 2, np.random.default_rng(1))
    for i, c in enumerate(clients):
        held = set(np.unique(labels[c]).tolist())
        assert len(held) == 2 and i % 10 in held


def test_dirichlet_respects_min_samples_and_assigns_everything_once():
    labels = balanced_labels(100)
    clients = dirichlet(labels, 20, beta=0.1, min_samples=10, rng=np.random.default_rng(0))
    assert min(len(c) for c in clients) >= 10
    everything = np.concatenate(clients)
    assert sorted(everything.tolist()) == list(range(len(labels)))


def test_partition_is_seeded_and_data_sharing_adds_one_common_subset():
    labels = balanced_labels()
    cfg = PartitionConfig(scheme="non_iid_l", num_clients=100, labels_per_client=2, share_fraction=0.1)
    a, b = partition_clients(labels, cfg, seed=3), partition_clients(labels, cfg, seed=3)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    shared = set(a[0][-6:].tolist())  # |D_k| = 6000 / 100 = 60, so |D_s| = 0.1 * 60
    assert len(shared) == 6 and all(shared <= set(c.tolist()) for c in a)
    assert len(a[0]) == 60 + 6


def _label_skew(labels, clients, n=10):
    """Mean over clients of the total-variation distance between a client's label
    distribution and the whole set's (0: the same mix; 1 - 1/n: one label each on balanced data)."""
    table = partition_table(labels, clients, n).astype(float)
    local = table / table.sum(1, keepdims=True)
    overall = np.bincount(labels, minlength=n) / len(labels)
    return float((0.5 * np.abs(local - overall).sum(1)).mean())


def test_iid_deals_every_sample_once_in_equal_shares_of_the_whole_mix():
    labels = balanced_labels(100)  # 1000 samples over 7 clients: shares of 142 or 143
    clients = partition_clients(labels, PartitionConfig(scheme="iid", num_clients=7), seed=0)
    assert sorted(np.concatenate(clients).tolist()) == list(range(1000))
    assert sorted(len(c) for c in clients) == [142] * 1 + [143] * 6
    assert all(np.all(np.diff(c) > 0) for c in clients)  # sorted index arrays
    assert _label_skew(labels, clients) < 0.15  # each client sees about the overall mix (unshuffled cuts: 0.77)
    assert not any(np.array_equal(c, np.arange(c[0], c[0] + len(c))) for c in clients)  # shuffled, not cut


def test_dirichlet_concentration_sets_the_label_skew():
    labels = balanced_labels(200)
    skewed, even = (partition_clients(labels, PartitionConfig(scheme="dirichlet", num_clients=10, dirichlet_beta=beta,
                                                              min_samples=10), seed=0) for beta in (0.1, 1000.0))
    # Dir(0.1) puts most of a class on one or two clients; Dir(1000) splits it almost equally.
    assert _label_skew(labels, skewed) > 0.5
    assert _label_skew(labels, even) < 0.1
    assert max(len(c) for c in even) - min(len(c) for c in even) < 0.2 * 200


@pytest.mark.parametrize("k", [1, 2, 3])
def test_num_labels_assigns_each_sample_once_and_splits_each_class_equally_over_its_holders(k):
    labels = np.repeat(np.arange(10), 101)  # 101 per class: splits differ by at most one sample
    clients = partition_clients(labels, PartitionConfig(scheme="num_labels", num_clients=20, labels_per_client=k), seed=2)
    everything = np.concatenate(clients)
    held = [c for c in range(10) if any(c in set(labels[p].tolist()) for p in clients)]
    assert len(everything) == len(np.unique(everything)) == 101 * len(held)  # no sample twice
    table = partition_table(labels, clients, 10)
    for c in held:
        shares = table[:, c][table[:, c] > 0]
        holders = sum(c in set(np.unique(labels[p]).tolist()) for p in clients)
        assert len(shares) == holders and shares.sum() == 101 and shares.max() - shares.min() <= 1


def test_partition_bounds_accept_their_edge_cases():
    labels = balanced_labels(10)  # 100 samples
    table = lambda clients: partition_table(labels, clients, 10)
    # l = n: every client holds every label; k = n likewise
    assert (table(non_iid_l(labels, 10, 10, np.random.default_rng(0))) > 0).all()
    assert (table(num_labels(labels, 3, 10, np.random.default_rng(0))) > 0).all()
    # one client, and as many clients as samples
    assert [len(c) for c in partition_clients(labels, PartitionConfig(scheme="iid", num_clients=1), 0)] == [100]
    assert all(len(c) == 1 for c in partition_clients(labels, PartitionConfig(scheme="iid", num_clients=100), 0))
    # label groups of one class each, one client per group
    groups = partition_clients(labels, PartitionConfig(scheme="label_groups", num_clients=10, labels_per_client=1), 0)
    assert [set(labels[c].tolist()) for c in groups] == [{k} for k in range(10)]
    # one group of all 10 classes
    whole = partition_clients(labels, PartitionConfig(scheme="label_groups", num_clients=2, labels_per_client=10), 0)
    assert all(set(labels[c].tolist()) == set(range(10)) for c in whole)
    # Dir(beta): min_samples x K may equal N (then every client holds exactly min_samples)
    exact = dirichlet(np.repeat(np.arange(2), 2), 2, beta=1000.0, min_samples=2, rng=np.random.default_rng(0))
    assert sorted(len(c) for c in exact) == [2, 2]
    for bad in (dict(scheme="iid", num_clients=0), dict(scheme="iid", num_clients=101),
                dict(scheme="dirichlet", num_clients=5, dirichlet_beta=0.0)):
        with pytest.raises(ValueError):
            partition_clients(labels, PartitionConfig(**bad), 0)


def test_dirichlet_gives_no_class_to_clients_already_at_the_mean_size():
    # NIID-Bench's cap: a client holding N/K samples or more gets none of the later classes, so
    # no client ends above N/K + (one class) - 1 = 40 + 10 - 1 here, however skewed Dir(0.01) is.
    labels = np.repeat(np.arange(12), 10)
    clients = dirichlet(labels, 3, beta=0.01, min_samples=0, rng=np.random.default_rng(0))
    assert sorted(np.concatenate(clients).tolist()) == list(range(120))
    assert max(len(c) for c in clients) <= 49  # uncapped, this draw gives a client 51


def test_num_labels_with_few_clients_gives_each_exactly_k_classes_whole():
    # 3 clients x 3 classes leave classes no one drew; those after them are still dealt
    labels = np.repeat(np.arange(10), 7)
    clients = num_labels(labels, 3, 3, np.random.default_rng(5))
    table = partition_table(labels, clients, 10)
    assert ((table > 0).sum(1) == 3).all()
    held = table.sum(0) > 0
    assert (~held).any() and (table.sum(0)[held] == 7).all()


def test_a_partition_that_leaves_a_client_empty_is_refused_and_sharing_draws_distinct_samples():
    # #C=1 over 4 clients: class 1's single sample cannot be split over clients 1 and 3
    with pytest.raises(ValueError, match="leaves 1 of 4 clients with no samples"):
        partition_clients(np.array([0, 0, 0, 1]), PartitionConfig(scheme="num_labels", num_clients=4,
                                                                   labels_per_client=1), 0)
    labels = balanced_labels(10)  # 100 samples, 2 clients: |D_k| = 50
    one = partition_clients(labels, PartitionConfig(scheme="iid", num_clients=2, share_fraction=0.001), 0)
    assert len(one[0]) == 50 + 1  # at least one shared sample, and no more
    many = partition_clients(labels, PartitionConfig(scheme="iid", num_clients=2, share_fraction=1.6), 0)
    shared = many[0][50:]
    assert len(shared) == 80 and len(set(shared.tolist())) == 80  # D_s: 80 distinct samples


def test_non_iid_l_draws_labels_weighted_by_the_shards_they_have_left():
    # 3 classes, K = 6 clients, l = 1: 2 shards per label. Client 0 takes some label A; then A
    # has 1 shard left and the others 2 each, so client 1 draws A with probability 1/5 (by hand:
    # 1 / (1 + 2 + 2)), not 1/3 as a uniform draw over the labels with shards left would.
    labels = np.repeat([0, 1, 2], 4)
    trials = 3000

    same = 0
    for seed in range(trials):
        clients = non_iid_l(labels, 6, 1, np.random.default_rng(seed))
        same += int(set(labels[clients[0]]) == set(labels[clients[1]]))

    assert abs(same / trials - 1 / 5) < 0.04  # 5 standard errors; uniform would give 1/3


@functools.lru_cache(maxsize=None)
def recorded_labels(dataset: str) -> np.ndarray:
    """The label vector a recording was made on, checked against its recorded hash."""
    entry = RECORDED["datasets"][dataset]
    if "labels" in entry:
        labels = np.asarray(entry["labels"], dtype=np.int64)
    else:
        path = next((f for f in LABEL_FILES[dataset] if f.is_file()), None)
        if path is None:
            pytest.skip(f"{dataset}'s training labels are not on this machine (looked for {LABEL_FILES[dataset]})")
        raw = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
        labels = np.frombuffer(raw[8:], dtype=np.uint8).astype(np.int64)  # idx1: 8 header bytes, then uint8 labels
    assert hashlib.sha256(labels.tobytes()).hexdigest() == entry["labels_sha256"], f"{dataset}: not the recorded labels"
    return labels


def index_hash(indices: np.ndarray) -> str:
    return hashlib.sha256(np.sort(indices).astype("<i8").tobytes()).hexdigest()


def niid_bench_config(case: dict) -> PartitionConfig:
    return PartitionConfig(scheme=case["scheme"], num_clients=RECORDED["num_clients"],
                           labels_per_client=case["labels_per_client"] or 2,
                           dirichlet_beta=RECORDED["dirichlet_beta"], rng="niid_bench")


RECORDED_CASES = [(name, case) for name, entry in RECORDED["datasets"].items() for case in entry["cases"]]


@pytest.mark.parametrize("dataset,case", RECORDED_CASES,
                         ids=[f"{name}-{case['partition']}-seed{case['seed']}" for name, case in RECORDED_CASES])
def test_niid_bench_stream_gives_the_clients_niid_bench_code_draws(dataset, case):
    labels = recorded_labels(dataset)

    clients = partition_clients(labels, niid_bench_config(case), seed=case["seed"])

    assert [sorted(set(labels[c].tolist())) for c in clients] == [r["labels"] for r in case["clients"]]
    assert [len(c) for c in clients] == [r["count"] for r in case["clients"]]
    assert [index_hash(c) for c in clients] == [r["sha256"] for r in case["clients"]]
    if "indices" in case["clients"][0]:  # the small synthetic case lists every index
        assert [c.tolist() for c in clients] == [r["indices"] for r in case["clients"]]


def test_the_fedov_configs_partition_fmnist_as_niid_bench_seeds_it(tmp_path):
    # The shipped path: configs/fedov_fmnist.yaml with #C=2 and --seed 1, through the command
    # line's settings, gives the clients NIID-Bench's experiments.py --init_seed 1 gives.
    from fl_lightning.settings import build_federation

    labels = recorded_labels("fashion_mnist")
    gz_dir = LABEL_FILES["fashion_mnist"][0].parent
    if not (gz_dir / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"Fashion-MNIST's images are not in {gz_dir}")
    case = next(c for c in RECORDED["datasets"]["fashion_mnist"]["cases"]
                if c["partition"] == "noniid-#label2" and c["seed"] == 1)

    _, _, federation = build_federation(["fit", "--config", str(REPO / "configs" / "fedov_fmnist.yaml"), "--seed", "1",
                                         "--partition.labels_per_client", "2", "--data.idx_gz_dir", str(gz_dir),
                                         "--data.root", str(tmp_path), "--run.dir", str(tmp_path / "run"),
                                         "--run.logger", "none"])
    federation.setup()

    assert np.array_equal(federation.train_labels, labels)
    assert [index_hash(c) for c in federation.client_indices] == [r["sha256"] for r in case["clients"]]


def test_num_labels_with_one_class_per_client_is_the_same_under_both_streams():
    # #C=1 over as many clients as classes: client i holds all of class i whatever the draws,
    # so runs of #C=1 cells made with either stream trained on the same clients.
    labels = recorded_labels("synthetic")
    for seed in range(3):
        both = [partition_clients(labels, PartitionConfig(scheme="num_labels", num_clients=10, labels_per_client=1,
                                                          rng=rng), seed) for rng in ("numpy", "niid_bench")]
        assert [c.tolist() for c in both[0]] == [c.tolist() for c in both[1]]
        assert [set(labels[c].tolist()) for c in both[0]] == [{i} for i in range(10)]


def test_the_default_stream_still_draws_the_label_sets_of_the_committed_runs():
    # #C=2's label sets depend only on the seed (the draws never look at the data); these are
    # the sets partition.rng=numpy gave the runs committed before partition.rng existed.
    committed = {0: "01 16 25 13 34 57 68 79 68 69", 1: "06 12 27 38 49 05 16 37 18 49",
                 2: "09 18 27 34 24 56 06 78 18 49"}
    labels = balanced_labels(50)
    for seed, sets in committed.items():
        clients = partition_clients(labels, PartitionConfig(scheme="num_labels", num_clients=10, labels_per_client=2), seed)
        assert " ".join("".join(map(str, np.unique(labels[c]))) for c in clients) == sets


@pytest.mark.parametrize("scheme", ["non_iid_l", "label_groups"])
def test_niid_bench_stream_refuses_schemes_niid_bench_does_not_have(scheme):
    cfg = PartitionConfig(scheme=scheme, num_clients=10, labels_per_client=2, rng="niid_bench")
    with pytest.raises(ValueError, match=f"partition.rng=niid_bench .* partition.scheme={scheme} is not one of them"):
        partition_clients(balanced_labels(10), cfg, 0)
