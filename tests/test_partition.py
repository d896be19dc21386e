import numpy as np
import pytest

from fl_lightning.config import PartitionConfig
from fl_lightning.data.partition import dirichlet, non_iid_l, num_labels, partition_clients, partition_table


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
