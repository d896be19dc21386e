import gzip
import pickle
import shutil
import struct

import numpy as np
import pytest
import torch

from fl_lightning.config import DataConfig
from fl_lightning.data import DataFormatError, DataNotFoundError, load_dataset


def write_idx_gz(folder, n_train=12, n_test=5, pixel=None):
    """Random images, or every pixel ``pixel`` (to give a set the mean of MNIST or Fashion-MNIST)."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8) if pixel is None else \
            np.full((n, 28, 28), pixel, dtype=np.uint8)
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
    (tmp_path / "copy").mkdir()
    cfg = DataConfig(name="mnist", root=str(tmp_path / "empty"), offline_roots=[str(tmp_path / "copy")])
    with pytest.raises(DataNotFoundError, match="data.download=true"):
        load_dataset(cfg)


def test_an_offline_root_that_is_not_a_folder_is_named(tmp_path):
    cfg = DataConfig(name="mnist", root=str(tmp_path / "cache"), offline_roots=[str(tmp_path), str(tmp_path / "nowhere")])
    with pytest.raises(DataNotFoundError, match=r"data.offline_roots\[1\]=.*nowhere' is not a folder \(it does not exist\)"):
        load_dataset(cfg)
    # the default of old configs and checkpoints, where no such folder exists: skipped
    write_idx_gz(tmp_path / "gz")
    data = load_dataset(DataConfig(name="mnist", root=str(tmp_path / "cache"), offline_roots=["../shared/data"],
                                   idx_gz_dir=str(tmp_path / "gz")))
    assert data.train_x.shape == (12, 1, 28, 28)


def test_a_wrong_idx_gz_dir_is_an_error_even_when_data_root_holds_a_copy(tmp_path):
    write_idx_gz(tmp_path / "gz")
    cfg = DataConfig(name="fashion_mnist", root=str(tmp_path / "cache"), idx_gz_dir=str(tmp_path / "gz"))
    load_dataset(cfg)  # data.root now holds a copy
    assert (tmp_path / "cache" / "FashionMNIST" / "raw" / "train-images-idx3-ubyte").is_file()

    cfg.idx_gz_dir = str(tmp_path / "typo")
    with pytest.raises(DataNotFoundError, match="data.idx_gz_dir=.*typo' is not a folder"):
        load_dataset(cfg)
    (tmp_path / "empty").mkdir()
    cfg.idx_gz_dir = str(tmp_path / "empty")
    with pytest.raises(DataNotFoundError, match=r"data.idx_gz_dir=.*empty' lacks \['train-images-idx3-ubyte.gz'"):
        load_dataset(cfg)


def test_another_idx_gz_dir_replaces_the_copy_unpacked_from_the_first(tmp_path):
    write_idx_gz(tmp_path / "a", pixel=90)
    write_idx_gz(tmp_path / "b", pixel=110)  # same sizes, other pixels
    cfg = DataConfig(name="fashion_mnist", root=str(tmp_path / "cache"), idx_gz_dir=str(tmp_path / "a"))
    first = load_dataset(cfg).train_x
    cfg.idx_gz_dir = str(tmp_path / "b")
    second = load_dataset(cfg).train_x
    assert float(second.mean()) == pytest.approx((110 / 255 - 0.2860) / 0.3530, abs=1e-5)
    assert float(first.mean()) == pytest.approx((90 / 255 - 0.2860) / 0.3530, abs=1e-5)


def test_the_machine_s_copies_are_found_without_a_setting_unless_switched_off(tmp_path, monkeypatch):
    from fl_lightning.data import sources

    write_idx_gz(tmp_path / "debian")
    write_idx_gz(tmp_path / "shared" / "MNIST" / "raw")
    for gz in (tmp_path / "shared" / "MNIST" / "raw").iterdir():  # torchvision's layout: unpacked idx files
        gz.with_suffix("").write_bytes(gzip.decompress(gz.read_bytes()))
    monkeypatch.setattr(sources, "MACHINE_IDX_GZ", {"fashion_mnist": (tmp_path / "debian",)})
    monkeypatch.setattr(sources, "MACHINE_COPIES", (tmp_path / "shared",))
    monkeypatch.setenv(sources.FALLBACKS_ENV, "on")

    fashion = load_dataset(DataConfig(name="fashion_mnist", root=str(tmp_path / "cache")))
    digits = load_dataset(DataConfig(name="mnist", root=str(tmp_path / "cache")))

    assert fashion.train_x.shape == digits.train_x.shape == (12, 1, 28, 28)
    assert (tmp_path / "cache" / "FashionMNIST" / "raw" / "t10k-labels-idx1-ubyte").is_file()  # unpacked into root
    assert not (tmp_path / "cache" / "MNIST").exists()  # read where it is
    monkeypatch.setenv(sources.FALLBACKS_ENV, "off")
    with pytest.raises(DataNotFoundError, match="data.download=true"):
        load_dataset(DataConfig(name="mnist", root=str(tmp_path / "cache")))


def test_fashion_mnist_files_given_to_an_mnist_run_are_refused_not_read_as_mnist(tmp_path):
    write_idx_gz(tmp_path / "fashion", pixel=73)  # 73 / 255 = 0.286: Fashion-MNIST's mean pixel
    cfg = DataConfig(name="mnist", root=str(tmp_path / "cache"), offline_roots=[], idx_gz_dir=str(tmp_path / "fashion"))
    with pytest.raises(DataFormatError, match=r"mnist: the training images in .*fashion have mean pixel 0\.286, "
                                              r"which is fashion_mnist's"):
        load_dataset(cfg)
    assert not (tmp_path / "cache" / "MNIST").exists()  # refused before anything was unpacked
    write_idx_gz(tmp_path / "digits", pixel=33)  # 0.129: MNIST's
    assert load_dataset(DataConfig(name="mnist", root=str(tmp_path / "c2"), offline_roots=[],
                                   idx_gz_dir=str(tmp_path / "digits"))).train_x.shape == (12, 1, 28, 28)
    with pytest.raises(DataFormatError, match="the files are mnist's"):
        load_dataset(DataConfig(name="fashion_mnist", root=str(tmp_path / "c3"), offline_roots=[],
                                idx_gz_dir=str(tmp_path / "digits")))


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


def test_svhn_from_torchvision_mat_files(tmp_path):
    from scipy.io import savemat

    folder = tmp_path / "SVHN"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name, n in (("train", 6), ("test", 4)):
        images = rng.integers(0, 256, size=(32, 32, 3, n), dtype=np.uint8)  # SVHN's (H, W, C, N)
        labels = np.array([[10], [1], [2], [3], [9], [10]][:n], dtype=np.uint8)  # 10 is the digit 0
        savemat(folder / f"{name}_32x32.mat", {"X": images, "y": labels})
    checked = DataConfig(name="svhn", root=str(tmp_path / "x"), offline_roots=[str(tmp_path)])
    with pytest.raises(DataNotFoundError, match="check_integrity=false"):
        load_dataset(checked)  # not the original files: md5 differs

    data = load_dataset(DataConfig(name="svhn", root=str(tmp_path / "x"), offline_roots=[str(tmp_path)],
                                   check_integrity=False))
    assert data.train_x.shape == (6, 3, 32, 32) and data.num_classes == 10
    assert data.train_y.tolist() == [0, 1, 2, 3, 9, 0] and data.test_y.tolist() == [0, 1, 2, 3]
    raw = torch.from_numpy(np.transpose(images, (3, 2, 0, 1)).copy()).float() / 255  # last written: test
    mean = torch.tensor((0.4377, 0.4438, 0.4728)).view(1, 3, 1, 1)
    std = torch.tensor((0.1980, 0.2010, 0.1970)).view(1, 3, 1, 1)
    torch.testing.assert_close(data.test_x, (raw - mean) / std)


def test_missing_svhn_names_the_folder(tmp_path):
    with pytest.raises(DataNotFoundError, match="SVHN"):
        load_dataset(DataConfig(name="svhn", root=str(tmp_path), offline_roots=[]))


def smooth_images(n, channels, seed):
    """Images JPEG codes closely (smooth gradients plus a per-image offset), uint8 NCHW."""
    ramp = torch.linspace(0, 200, 32)
    base = (ramp.view(1, 32) + ramp.view(32, 1)) / 2
    offsets = torch.randint(0, 50, (n, channels, 1, 1), generator=torch.Generator().manual_seed(seed))
    return (base.expand(n, channels, 32, 32) + offsets).round().to(torch.uint8)


def test_image_pack_round_trip_keeps_labels_order_and_pixels_close(tmp_path):
    from fl_lightning.data import image_pack

    train = (smooth_images(7, 3, 0), torch.tensor([3, 1, 4, 1, 5, 9, 2]))
    test = (smooth_images(3, 3, 1), torch.tensor([6, 5, 3]))
    header = image_pack.write(tmp_path / "c.npz", "cifar10", train, test, quality=90)

    (tx, ty), (vx, vy) = image_pack.read(tmp_path / "c.npz", "cifar10")

    assert tx.dtype == torch.uint8 and tx.shape == (7, 3, 32, 32) and vx.shape == (3, 3, 32, 32)
    assert ty.tolist() == [3, 1, 4, 1, 5, 9, 2] and vy.tolist() == [6, 5, 3]
    change = float((tx.int() - train[0].int()).abs().float().mean())
    assert change < 2.0  # JPEG is lossy, but image i is still image i
    assert header["mean_abs_change"]["train"] == pytest.approx(change)
    # each decoded image is nearest to its own original, so no image moved to another position
    distances = torch.cdist(tx.flatten(1).float(), train[0].flatten(1).float())
    assert distances.argmin(dim=1).tolist() == list(range(7))


def test_load_dataset_reads_an_image_pack_instead_of_files(tmp_path):
    from fl_lightning.data import image_pack

    train = (smooth_images(6, 3, 2), torch.arange(6) % 10)
    test = (smooth_images(4, 3, 3), torch.arange(4))
    image_pack.write(tmp_path / "pack.npz", "cifar10", train, test)
    cfg = DataConfig(name="cifar10", root=str(tmp_path / "none"), offline_roots=[], image_pack=str(tmp_path / "pack.npz"))

    data = load_dataset(cfg)

    assert data.train_x.shape == (6, 3, 32, 32) and data.test_y.tolist() == [0, 1, 2, 3]
    assert data.pixel_mean == (0.4914, 0.4822, 0.4465)


def test_image_pack_of_another_data_set_or_missing_file_is_refused_by_name(tmp_path):
    from fl_lightning.data import DataFormatError, image_pack

    image_pack.write(tmp_path / "m.npz", "mnist", (smooth_images(2, 1, 0), torch.tensor([0, 1])),
                     (smooth_images(1, 1, 1), torch.tensor([2])))
    assert image_pack.read(tmp_path / "m.npz", "mnist")[0][0].shape == (2, 1, 32, 32)
    with pytest.raises(DataFormatError, match="holds 'mnist', but data.name is 'cifar10'"):
        load_dataset(DataConfig(name="cifar10", offline_roots=[], image_pack=str(tmp_path / "m.npz")))
    with pytest.raises(DataNotFoundError, match="data.image_pack=.*missing.npz"):
        load_dataset(DataConfig(name="cifar10", offline_roots=[], image_pack=str(tmp_path / "missing.npz")))
    (tmp_path / "junk.npz").write_bytes(b"not a pack")
    with pytest.raises(DataFormatError, match="is not an image pack"):
        load_dataset(DataConfig(name="cifar10", offline_roots=[], image_pack=str(tmp_path / "junk.npz")))


def test_image_pack_with_corrupt_jpeg_bytes_is_refused_with_its_split_named(tmp_path):
    from fl_lightning.data import DataFormatError, image_pack

    image_pack.write(tmp_path / "c.npz", "cifar10", (smooth_images(2, 3, 0), torch.tensor([0, 1])),
                     (smooth_images(1, 3, 1), torch.tensor([2])))
    with np.load(tmp_path / "c.npz") as pack:
        arrays = {key: pack[key] for key in pack.files}
    arrays["test_jpeg"] = np.zeros_like(arrays["test_jpeg"])  # right length, not JPEG
    with open(tmp_path / "c.npz", "wb") as f:
        np.savez(f, **arrays)
    with pytest.raises(DataFormatError, match="its test split cannot be read"):
        load_dataset(DataConfig(name="cifar10", offline_roots=[], image_pack=str(tmp_path / "c.npz")))


def test_an_idx_gz_dir_never_overwrites_a_copy_it_did_not_unpack(tmp_path):
    # data.root holds the user's own MNIST files (not unpacked by fl_lightning): another
    # data.idx_gz_dir is refused, and the files stay as they were
    write_idx_gz(tmp_path / "own", pixel=33)
    raw = tmp_path / "data" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for archive in (tmp_path / "own").iterdir():
        (raw / archive.name[:-3]).write_bytes(gzip.decompress(archive.read_bytes()))
    before = {f.name: f.read_bytes() for f in raw.iterdir()}
    write_idx_gz(tmp_path / "other", pixel=34)

    with pytest.raises(DataFormatError, match=r"holds other idx files, not unpacked from a data.idx_gz_dir"):
        load_dataset(DataConfig(name="mnist", root=str(tmp_path / "data"), offline_roots=[],
                                idx_gz_dir=str(tmp_path / "other")))
    assert {f.name: f.read_bytes() for f in raw.iterdir()} == before
    assert load_dataset(DataConfig(name="mnist", root=str(tmp_path / "data"), offline_roots=[])).train_x.shape == \
        (12, 1, 28, 28)  # read where they are without the setting
    # the same files as the archive (gunzipped by hand): read, and nothing rewritten
    cfg = DataConfig(name="mnist", root=str(tmp_path / "data"), offline_roots=[], idx_gz_dir=str(tmp_path / "own"))
    assert load_dataset(cfg).train_x.shape == (12, 1, 28, 28)
    assert {f.name: f.read_bytes() for f in raw.iterdir() if f.name in before} == before


def test_two_runs_unpacking_one_cache_at_once_both_read_whole_files(tmp_path, monkeypatch):
    # A second run unpacks the same cache while the first is half-way through a file, as two
    # runs started together on a fresh machine do. Before, both used one temporary name, the
    # second renamed the first's half-written file away and the first failed.
    write_idx_gz(tmp_path / "gz")
    cfg = DataConfig(name="fashion_mnist", root=str(tmp_path / "cache"), offline_roots=[],
                     idx_gz_dir=str(tmp_path / "gz"))
    copy, second_run = shutil.copyfileobj, {}

    def copy_with_a_second_run_in_the_middle(src, dst, *args):
        if "started" not in second_run:
            second_run["started"] = True
            dst.write(src.read(8))
            second_run["data"] = load_dataset(cfg)
        copy(src, dst, *args)

    monkeypatch.setattr(shutil, "copyfileobj", copy_with_a_second_run_in_the_middle)
    first = load_dataset(cfg)

    assert torch.equal(first.train_x, second_run["data"].train_x) and first.train_x.shape == (12, 1, 28, 28)
    raw = tmp_path / "cache" / "FashionMNIST" / "raw"
    for gz in (tmp_path / "gz").glob("*.gz"):
        assert (raw / gz.stem).read_bytes() == gzip.decompress(gz.read_bytes())
    assert not list(raw.glob("*.partial")) and not list(raw.glob(".*.partial"))
