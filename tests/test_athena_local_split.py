"""ATHENA-FL's client data and client accuracy as the authors' code builds them
(``federation.local_split: athena_code``; fl_lightning/data/athena_local_split.py)."""

import math

import numpy as np
import pytest
import torch

from fl_lightning.data.athena_local_split import (authors_shuffle, augment_class, build_local_split, flip_up_down,
                                                  rotate, slice_bounds, to_uint8_as_numpy)
from fl_lightning.data.datasets import FederatedDataset, _standardise
from fl_lightning.per_client_eval import local_split_metrics
from fl_lightning.settings import build_federation
from tests.conftest import tiny_args


def grid(n: int) -> torch.Tensor:
    """One (1, 1, n, n) uint8 image holding 1..n² row by row."""
    return torch.arange(1, n * n + 1, dtype=torch.uint8).reshape(1, 1, n, n)


# ---- the three operations (augment_data.py) ------------------------------------------------------

def test_flip_reverses_the_rows():
    assert flip_up_down(grid(3))[0, 0].tolist() == [[7, 8, 9], [4, 5, 6], [1, 2, 3]]


def test_rotation_by_a_quarter_turn_is_counterclockwise_as_tfa_rotates():
    # tfa.image.rotate(img, pi/2): output (x, y) reads input (x0 - y, x): numpy's rot90
    assert rotate(grid(3), math.pi / 2)[0, 0].tolist() == [[3, 6, 9], [2, 5, 8], [1, 4, 7]]


def test_rotation_by_five_thirds_pi_by_hand():
    # about the centre (2, 2) of a 5x5 image: output (x, y) reads the input at
    # (2 + 0.5 (x-2) + 0.866 (y-2), 2 - 0.866 (x-2) + 0.5 (y-2)), rounded; outside: 0
    out = rotate(grid(5))[0, 0]
    image = grid(5)[0, 0]
    assert out[2, 2] == image[2, 2]  # the centre stays
    assert out[0, 2] == image[1, 0]  # (x=2, y=0) reads (0.27, 1)
    assert out[2, 4] == image[0, 3]  # (x=4, y=2) reads (3, 0.27)
    assert out[4, 2] == image[3, 4]  # (x=2, y=4) reads (3.73, 3)
    assert out[0, 0] == 0 and out[4, 0] == 0 and out[4, 4] == 0  # read from outside: the fill value


def test_noise_is_cast_back_as_numpy_casts_floats_to_uint8():
    values = torch.tensor([-0.4, -1.2, -2.9, 0.0, 3.9, 255.7, 256.3])
    assert to_uint8_as_numpy(values).tolist() == [0, 255, 254, 0, 3, 255, 0]
    assert to_uint8_as_numpy(values).tolist() == np.asarray(values.numpy(), dtype=np.uint8).tolist()


def test_augmentation_quadruples_each_class_in_the_authors_order():
    images = torch.stack([grid(3)[0], 2 * grid(3)[0]])  # two images of one class

    out = augment_class(images, torch.Generator().manual_seed(5))

    noise = torch.randn((2, 1, 3, 3), generator=torch.Generator().manual_seed(5))  # N(0, 1), the generator's draw
    noisy = to_uint8_as_numpy(images.float() + noise)
    expected = [flip_up_down(images[:1]), rotate(images[:1]), noisy[:1],
                flip_up_down(images[1:]), rotate(images[1:]), noisy[1:], images]
    assert len(out) == 4 * len(images)
    assert torch.equal(out, torch.cat(expected))
    with pytest.raises(ValueError, match="uint8"):
        augment_class(images.float(), torch.Generator())


# ---- the clients' slices and their 80/20 split (load_federated_data.py) -------------------------

@pytest.mark.parametrize("length,parts", [(40, 3), (23996, 10), (4, 4), (7, 2)])
def test_equal_shares_give_the_codes_slices(length, parts):
    # load_federated_data.py:36-37: int(len / parts * (j - 1)) : int(len / parts * j)
    code = [(int(length / parts * (j - 1)), int(length / parts * j)) for j in range(1, parts + 1)]
    assert slice_bounds(length, np.ones(parts)) == code


def test_the_shuffle_is_sklearns_with_the_authors_state():
    from sklearn.utils import shuffle

    assert authors_shuffle(57).tolist() == shuffle(np.arange(57), random_state=47527).tolist()


def tiny_split(seed: int):
    """Two classes of 10 training and 5 test images; client 0 holds class 0 (6 samples) and
    class 1 (5), client 1 class 0 (4), client 2 class 1 (5)."""
    g = torch.Generator().manual_seed(123)
    train_y, test_y = torch.tensor([0, 1] * 10), torch.tensor([0, 1] * 5)
    train_x = torch.randint(0, 256, (20, 1, 4, 4), generator=g, dtype=torch.uint8)
    test_x = torch.randint(0, 256, (10, 1, 4, 4), generator=g, dtype=torch.uint8)
    counts = np.array([[6, 5], [4, 0], [0, 5]])
    return (train_x, train_y, test_x, test_y), build_local_split(train_x, train_y, test_x, test_y, counts, seed)


def test_each_client_pools_its_slices_and_cuts_them_80_20_reproducibly():
    (train_x, train_y, test_x, test_y), split = tiny_split(seed=0)

    # pool order: class 0 train (40 augmented), class 0 test (20), class 1 train (40), class 1 test (20)
    assert len(split.images) == 4 * 30 and split.labels.tolist() == [0] * 60 + [1] * 60
    assert torch.equal(split.images[30:40], train_x[train_y == 0])  # the originals close each block
    pools = [np.r_[0:24, 40:52, 60:80, 100:110], np.r_[24:40, 52:60], np.r_[80:100, 110:120]]
    for k, pool in enumerate(pools):
        n = len(pool)
        assert len(split.train[k]) == int(0.8 * n) and len(split.test[k]) == n - int(0.8 * n)
        assert np.array_equal(np.concatenate([split.train[k], split.test[k]]), pool[authors_shuffle(n)])
    again = tiny_split(seed=0)[1]
    other = tiny_split(seed=1)[1]
    assert torch.equal(again.images, split.images)
    assert all(np.array_equal(a, b) for a, b in zip(again.train + again.test, split.train + split.test))
    assert not torch.equal(other.images, split.images)  # the noise follows the seed; the cut is the authors' own
    assert all(np.array_equal(a, b) for a, b in zip(other.train + other.test, split.train + split.test))


# ---- the client accuracy (client.py's evaluate, figure.py's mean and interval) ------------------

def test_the_client_accuracy_is_the_plain_mean_over_clients_with_the_authors_interval():
    correct = [1, 0, 1, 1, 1, 0]
    owners = [0, 0, 0, 1, 1, 2]  # accuracies 2/3, 1, 0; client 3 has no local test split

    m = local_split_metrics(correct, owners, num_clients=4)

    accuracies = np.array([2 / 3, 1.0, 0.0])
    std = math.sqrt(((accuracies - 5 / 9) ** 2).mean())  # numpy's std, ddof 0
    assert m["client_accuracy_local"] == pytest.approx(5 / 9)
    assert m["client_accuracy_local_std"] == pytest.approx(std)
    assert m["client_accuracy_local_ci95"] == pytest.approx(1.96 * std / math.sqrt(10))  # figure.py's sqrt(10)
    assert m["clients_evaluated_local"] == 3


# ---- the setting ---------------------------------------------------------------------------------

def image_set(_cfg) -> FederatedDataset:
    """A tiny 'mnist': 10 classes of 28x28 uint8 images, 120 training and 40 test samples."""
    g = torch.Generator().manual_seed(7)
    mean, std = (0.1307,), (0.3081,)

    def draw(n):
        y = torch.arange(n) % 10
        x = (torch.rand(n, 1, 28, 28, generator=g) * 60 + y.view(-1, 1, 1, 1) * 19).to(torch.uint8)
        return _standardise(x, mean, std), y

    (train_x, train_y), (test_x, test_y) = draw(120), draw(40)
    return FederatedDataset("mnist", train_x, train_y, test_x, test_y, 10, mean, std)


def test_a_run_logs_the_local_split_accuracy_beside_the_test_accuracy(tmp_path, monkeypatch):
    monkeypatch.setattr("fl_lightning.federation.load_dataset", image_set)
    args = tiny_args(tmp_path / "run", "--data.name", "mnist", "--federation.rounds", "1",
                     "--federation.local_split", "athena_code", "--federation.per_client_eval", "true")
    federation = build_federation(["fit", *args], callbacks=[])[2]

    last = federation.fit()["history"][-1]

    data = federation._data
    assert len(data.train_x) == 4 * (120 + 40)  # every class of both sets quadrupled
    with torch.inference_mode():
        test_pred = federation.strategy.predict_logits(federation.state, data.test_x).argmax(1)
        pool_pred = federation.strategy.predict_logits(federation.state, data.train_x).argmax(1)
    assert last["test/accuracy"] == pytest.approx(float((test_pred == data.test_y).float().mean()))  # as before
    accuracies = [np.mean((pool_pred[t] == data.train_y[t]).numpy()) for t in federation.local_test_indices]
    assert last["test/client_accuracy_local"] == pytest.approx(np.mean(accuracies), abs=1e-12)
    assert last["test/clients_evaluated_local"] == 10
    assert "test/client_accuracy" in last  # the text's reading, logged beside it
    for k in range(10):  # a client trains on its 80 % only, never on its own 20 %
        assert not set(federation.client_indices[k]) & set(federation.local_test_indices[k])


def test_the_setting_is_refused_with_its_key(tmp_path, capsys):
    with pytest.raises(SystemExit):
        build_federation(["fit", *tiny_args(tmp_path / "a", "--federation.local_split", "code")])
    assert "federation.local_split" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"federation.local_split=athena_code .* data.name=synthetic"):
        build_federation(["fit", *tiny_args(tmp_path / "b", "--federation.local_split", "athena_code")])
