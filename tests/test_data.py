import gzip
import pickle
import struct

import numpy as np
import pytest
import torch

from fl_lightning.config import DataConfig
from fl_lightning.data import DataNotFoundError, load_dataset


def write_idx_gz(folder, n_train=12, n_test=5):
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = (np.arange(n) % 10).astype(np.uint8)
        with gzip.open(folder / f"{prefix}-images-idx3-ubyte.gz", "wb") as f:
            f.write(struct.pack(">IIII", 2051, n, 28, 28) + images.tobytes())
        with gzip.open(folder / f"{prefix}-labels-idx1-ubyte.gz", "wb") as f:
            f.write(struct.pack(">II", 2049, n) + labels.tobytes())
    return images


def test_fashion_mnist_from_original_gz_files_is_unpacked_and_standardised(tmp_path):
    write_idx_gz(tmp_path / "debian")
    cfg = DataConfig(name="fashion_mnist", root=str(tmp_path / "cache"), offline_roots=[],
                     idx_gz_dir=str(tmp_path / "debian"))

    data = load_dataset(cfg)

    assert data.train_x.shape == (12, 1, 28, 28) and data.test_x.shape == (5, 1, 28, 28)
    assert data.train_y.tolist() == [i % 10 for i in range(12)] and data.train_y.dtype == torch.long
    assert (tmp_path / "cache" / "FashionMNIST" / "raw" / "train-images-idx3-ubyte").is_file()
    assert abs(float(data.train_x.mean()) - (127.5 / 255 - 0.2860) / 0.3530) < 0.1


def test_missing_data_offline_says_what_to_do(tmp_path):
    cfg = DataConfig(name="mnist", root=str(tmp_path / "empty"), offline_roots=[str(tmp_path / "nowhere")])
    with pytest.raises(DataNotFoundError, match="data.download=true"):
        load_dataset(cfg)


def test_incomplete_gz_folder_is_named(tmp_path):
    (tmp_path / "gz").mkdir()
    cfg = DataConfig(name="fashion_mnist", root=str(tmp_path / "c"), offline_roots=[], idx_gz_dir=str(tmp_path / "gz"))
    with pytest.raises(DataNotFoundError, match="idx_gz_dir"):
        load_dataset(cfg)


def write_fake_cifar(root):
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {"data": rng.integers(0, 256, size=(4, 3072), dtype=np.uint8), "labels": [0, 1, 2, 3]}
        (folder / name).write_bytes(pickle.dumps(batch))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [str(i) for i in range(10)]}))


def test_rebuilt_cifar_needs_integrity_check_off(tmp_path):
    write_fake_cifar(tmp_path)
    checked = DataConfig(name="cifar10", root=str(tmp_path / "x"), offline_roots=[str(tmp_path)])
    with pytest.raises(DataNotFoundError, match="check_integrity=false"):
        load_dataset(checked)

    data = load_dataset(DataConfig(name="cifar10", root=str(tmp_path / "x"), offline_roots=[str(tmp_path)],
                                   check_integrity=False))
    assert data.train_x.shape == (20, 3, 32, 32) and data.test_y.tolist() == [0, 1, 2, 3]
