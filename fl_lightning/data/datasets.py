"""Whole data sets as in-memory tensors (loaded once; clients are index views).

The loading goes through torchvision's dataset classes, so online users get
``download=True`` and everyone gets torchvision's folder layout; where the files are looked
for is fl_lightning.data.sources' (docs/data.md). The speech corpora (speech_commands, fsdd)
are MFCC tensors built by ``fl_lightning.data.speech``.
"""

from __future__ import annotations

import gzip
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from fl_lightning.atomic_file import write_atomic
from fl_lightning.config import DataConfig
from fl_lightning.data.sources import (DataNotFoundError, data_root, download_note, explicit_folder, machine_idx_gz,
                                       search_roots, with_mirror)

# Per-channel statistics of the training sets, for standardisation.
_NORMALISATION = {
    "fashion_mnist": ((0.2860,), (0.3530,)),
    "mnist": ((0.1307,), (0.3081,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "svhn": ((0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970)),
}
_IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
# One sample's (C, H, W) as stored in the files.
_SAMPLE_SHAPES = {"fashion_mnist": (1, 28, 28), "mnist": (1, 28, 28), "cifar10": (3, 32, 32), "svhn": (3, 32, 32)}


@dataclass
class FederatedDataset:
    """Standardised float images (N, C, H, W) and int64 labels, train and test."""

    name: str
    train_x: Tensor
    train_y: Tensor
    test_x: Tensor
    test_y: Tensor
    num_classes: int
    #: the standardisation x = (pixel - mean) / std per channel of images read as [0, 1]
    #: pixels; empty for data that are not such images (MFCC features, synthetic tensors)
    pixel_mean: tuple[float, ...] = ()
    pixel_std: tuple[float, ...] = ()

    @property
    def in_channels(self) -> int:
        return self.train_x.shape[1]

    @property
    def image_size(self) -> int:
        return self.train_x.shape[-1]

    @property
    def input_size(self) -> tuple[int, int]:
        """(H, W) of one sample; (50, 16) frames x MFCCs for the speech corpora."""
        return tuple(self.train_x.shape[-2:])


class DataFormatError(ValueError):
    """Data files that exist but do not hold the data set's shapes or labels."""


def _root_note(root: Path) -> str:
    """Why data.root cannot hold the files, when that is the reason."""
    if not root.exists():
        return f"data.root={str(root)!r} does not exist. "
    if not root.is_dir():
        return f"data.root={str(root)!r} is not a folder. "
    if not any(root.iterdir()):
        return f"data.root={str(root)!r} is empty. "
    return ""


def _checked(name: str, source: Path, train, test, num_classes: int = 10):
    """The (images, labels) splits read from ``source``, refused with the file's folder
    named when they are not the data set's: sample shape, one label per image, labels in range."""
    expected = _SAMPLE_SHAPES[name]
    for split, (images, labels) in (("training", train), ("test", test)):
        if images.dim() != 4 or tuple(images.shape[1:]) != expected:
            raise DataFormatError(f"{name}: the {split} images in {source} have shape {tuple(images.shape)}; "
                                  f"expected (N, {', '.join(map(str, expected))})")
        if len(images) == 0:
            raise DataFormatError(f"{name}: {source} holds no {split} images")
        if labels.dim() != 1 or len(labels) != len(images):
            raise DataFormatError(f"{name}: {source} holds {len(images)} {split} images but labels of shape "
                                  f"{tuple(labels.shape)}; expected ({len(images)},)")
        low, high = int(labels.min()), int(labels.max())
        if low < 0 or high >= num_classes:
            raise DataFormatError(f"{name}: the {split} labels in {source} span {low}..{high}; "
                                  f"expected 0..{num_classes - 1}")
    return train, test


def load_dataset(cfg: DataConfig) -> FederatedDataset:
    if cfg.test_subset < 0:
        raise ValueError(f"data.test_subset={cfg.test_subset} must be >= 0")
    data = _load_whole(cfg)
    if cfg.test_subset:
        data.test_x, data.test_y = data.test_x[: cfg.test_subset], data.test_y[: cfg.test_subset]
    return data


def _load_whole(cfg: DataConfig) -> FederatedDataset:
    if cfg.name == "synthetic":
        return synthetic_dataset(cfg.synthetic_size)
    if cfg.name in ("speech_commands", "fsdd"):
        from fl_lightning.data.speech import load_speech  # MFCC features, cached (docs/kws.md)

        return load_speech(cfg, data_root(cfg))
    train, test = load_uint8_splits(cfg)
    mean, std = _NORMALISATION[cfg.name]
    if not cfg.standardize:  # raw [0, 1] pixels: the identity map, so pixel_mean/std stay exact for FedOV
        mean, std = (0.0,) * len(mean), (1.0,) * len(std)
    return FederatedDataset(
        cfg.name,
        _standardise(train[0], mean, std),
        train[1],
        _standardise(test[0], mean, std),
        test[1],
        num_classes=10,
        pixel_mean=mean,
        pixel_std=std,
    )


def load_uint8_splits(cfg: DataConfig) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """The image set's (uint8 (N, C, H, W) images, int64 labels), training and test, from
    ``data.image_pack`` when set, else from torchvision's files."""
    if cfg.name not in _SAMPLE_SHAPES:
        raise ValueError(f"data.name={cfg.name!r} is not an image set of files ({sorted(_SAMPLE_SHAPES)})")
    if cfg.image_pack:
        from fl_lightning.data import image_pack

        try:
            train, test = image_pack.read(cfg.image_pack, cfg.name)
        except FileNotFoundError as err:
            raise DataNotFoundError(str(err)) from err
        except image_pack.ImagePackError as err:
            raise DataFormatError(str(err)) from err
        return _checked(cfg.name, Path(cfg.image_pack), train, test)
    root = data_root(cfg)
    if cfg.name in ("fashion_mnist", "mnist"):
        return _load_mnist_like(cfg, root)
    if cfg.name == "cifar10":
        return _load_cifar10(cfg, root)
    return _load_svhn(cfg, root)


def _standardise(images_uint8: Tensor, mean, std) -> Tensor:
    x = images_uint8.float().div_(255.0)
    mean_t = torch.tensor(mean).view(1, -1, 1, 1)
    std_t = torch.tensor(std).view(1, -1, 1, 1)
    return x.sub_(mean_t).div_(std_t).contiguous()


def _load_mnist_like(cfg: DataConfig, root: Path):
    from torchvision.datasets import MNIST, FashionMNIST

    cls = FashionMNIST if cfg.name == "fashion_mnist" else MNIST
    folder = cls.__name__  # torchvision reads <root>/<ClassName>/raw/
    if cfg.idx_gz_dir:  # named by the user: it wins over any copy, and must hold the files
        source = explicit_folder("idx_gz_dir", cfg.idx_gz_dir)
        _refuse_the_other_mnist(cfg.name, source, _gz_train_images(source))  # before anything is written
        _unpack_idx_gz(source, root / folder / "raw")
        return _mnist_tensors(cfg.name, cls, root, download=False)
    roots = search_roots(cfg)
    for candidate in roots:
        if _has_idx_files(candidate / folder / "raw"):
            return _mnist_tensors(cfg.name, cls, candidate, download=False)
    for gz_dir in machine_idx_gz(cfg.name):
        if not _missing_gz(gz_dir):
            _unpack_idx_gz(gz_dir, root / folder / "raw")
            return _mnist_tensors(cfg.name, cls, root, download=False)
    if cfg.download:
        return _download(cfg, lambda: _mnist_tensors(cfg.name, with_mirror(cls, cfg.mirror), root, download=True), root)
    raise DataNotFoundError(
        f"{cfg.name}: {_root_note(root)}No idx files under {[str(c / folder / 'raw') for c in roots]}. "
        f"Online: set data.download=true (into data.root). Offline: put torchvision's layout under data.root "
        f"(or $FL_LIGHTNING_DATA), list a copy in data.offline_roots, or point data.idx_gz_dir at a folder of the "
        f"original *-ubyte.gz files (Fashion-MNIST on Debian/Ubuntu: `apt-get install dataset-fashion-mnist`, "
        f"found in /usr/share/datasets/fashion-mnist without a setting)."
    )


def _download(cfg: DataConfig, load, root: Path):
    """``load()`` downloading into ``root``; a failed download names where it came from."""
    try:
        return load()
    except (RuntimeError, OSError) as err:  # torchvision: RuntimeError after all mirrors failed; URLError, md5
        raise DataNotFoundError(f"{cfg.name}: data.download=true could not fetch the files from "
                                f"{download_note(cfg)} into data.root={str(root)!r}: {' '.join(str(err).split())}"
                                ) from err


def _mnist_tensors(name: str, cls, root: Path, download: bool):
    source = root / cls.__name__ / "raw"
    try:
        train = cls(str(root), train=True, download=download)
        test = cls(str(root), train=False, download=download)
    except (RuntimeError, AssertionError, ValueError) as err:  # torchvision's idx reader on a malformed file
        if download:
            raise
        raise DataFormatError(f"{name}: the idx files in {source} cannot be read ({type(err).__name__}: "
                              f"{err}); a file is truncated or not an idx file of images/labels") from err
    splits = [(ds.data.unsqueeze(1) if ds.data.dim() == 3 else ds.data, ds.targets.long()) for ds in (train, test)]
    _refuse_the_other_mnist(name, source, splits[0][0])
    return _checked(name, source, *splits)


# MNIST and Fashion-MNIST ship under the same file names, so a Fashion-MNIST data.idx_gz_dir (or
# folder) given to an MNIST run would train on the wrong set without a word. Their mean training
# pixels differ (0.131 vs 0.286): a set whose mean is the other set's, within this, is refused.
_OTHER_SET_TOLERANCE = 0.01


def _refuse_the_other_mnist(name: str, source: Path, train_images: Tensor) -> None:
    other = {"mnist": "fashion_mnist", "fashion_mnist": "mnist"}[name]
    if not train_images.numel():
        return
    mean = float(train_images.sum(dtype=torch.float64)) / (255.0 * train_images.numel())
    own, others = _NORMALISATION[name][0][0], _NORMALISATION[other][0][0]
    if abs(mean - others) < _OTHER_SET_TOLERANCE:
        raise DataFormatError(f"{name}: the training images in {source} have mean pixel {mean:.3f}, which is "
                              f"{other}'s ({others}), not {name}'s ({own}): the files are {other}'s (same file "
                              f"names; check data.idx_gz_dir and the folder)")


def _gz_train_images(source: Path) -> Tensor:
    """The training images of ``source``'s ``train-images-idx3-ubyte.gz`` as uint8 (empty when it
    is missing: ``_unpack_idx_gz`` names what is missing)."""
    archive = source / "train-images-idx3-ubyte.gz"
    if not archive.is_file():
        return torch.zeros(0, dtype=torch.uint8)
    with gzip.open(archive, "rb") as f:
        return torch.frombuffer(bytearray(f.read()[16:]), dtype=torch.uint8)  # after the idx header


def _has_idx_files(folder: Path) -> bool:
    return all((folder / name).exists() for name in _IDX_FILES)


# Beside unpacked idx files: the folder of *-ubyte.gz they came from, so that another
# data.idx_gz_dir (another copy of the set, of the same sizes) is unpacked, not shadowed.
_UNPACKED_FROM = "unpacked_from.txt"


def _missing_gz(source: Path) -> list[str]:
    return [f"{n}.gz" for n in _IDX_FILES if not (source / f"{n}.gz").is_file()]


def _unpack_idx_gz(source: Path, target: Path) -> None:
    """The idx files of ``source``'s ``*-ubyte.gz`` in ``target``, unpacked again when those there
    came from another folder or are not the size the archive unpacks to."""
    missing = _missing_gz(source)
    if missing:
        raise DataNotFoundError(f"data.idx_gz_dir={str(source)!r} lacks {missing}")
    origin = target / _UNPACKED_FROM
    if _has_idx_files(target) and not origin.is_file():  # someone else's copy: never overwritten
        if all((target / n).read_bytes() == gzip.decompress((source / f"{n}.gz").read_bytes()) for n in _IDX_FILES):
            try:  # the archive's own files (e.g. gunzipped by hand): known as such from now on
                _write_origin(origin, source)
            except OSError:  # a read-only copy: compared again next time
                pass
            return
        raise DataFormatError(f"data.idx_gz_dir={str(source)!r}: {target} holds other idx files, not unpacked from a "
                              f"data.idx_gz_dir (no {_UNPACKED_FROM}); they are left as they are: drop "
                              f"data.idx_gz_dir to read them, or point data.root at another folder")
    target.mkdir(parents=True, exist_ok=True)
    same_source = origin.is_file() and origin.read_text() == str(source.resolve())
    origin.unlink(missing_ok=True)  # written again once every file is in place
    for name in _IDX_FILES:
        archive, unpacked = source / f"{name}.gz", target / name
        if same_source and unpacked.is_file() and unpacked.stat().st_size == _gz_size(archive):
            continue
        with gzip.open(archive, "rb") as src:
            write_atomic(unpacked, lambda dst: shutil.copyfileobj(src, dst))
    _write_origin(origin, source)


def _write_origin(origin: Path, source: Path) -> None:
    text = str(source.resolve()).encode()
    write_atomic(origin, lambda f: f.write(text))


def _gz_size(archive: Path) -> int:
    """The unpacked size gzip records in its last four bytes (modulo 2**32; idx files are smaller)."""
    with open(archive, "rb") as f:
        f.seek(-4, 2)
        return int.from_bytes(f.read(4), "little")


def _load_cifar10(cfg: DataConfig, root: Path):
    from torchvision.datasets import CIFAR10

    class UncheckedCIFAR10(CIFAR10):
        def _check_integrity(self) -> bool:  # rebuilt copies have other md5 sums
            return (Path(self.root) / self.base_folder / "data_batch_1").exists()

        def _load_meta(self) -> None:  # torchvision md5-checks batches.meta here too
            import pickle

            with open(Path(self.root) / self.base_folder / self.meta["filename"], "rb") as f:
                self.classes = pickle.load(f, encoding="latin1")[self.meta["key"]]
            self.class_to_idx = {name: i for i, name in enumerate(self.classes)}

    cls = CIFAR10 if cfg.check_integrity else UncheckedCIFAR10
    roots = search_roots(cfg)
    for candidate in roots:
        if (candidate / "cifar-10-batches-py" / "data_batch_1").exists():
            try:
                return _cifar_tensors(cls, candidate, download=False)
            except RuntimeError as err:
                raise DataNotFoundError(
                    f"cifar10 under {candidate} failed torchvision's integrity check ({err}). A rebuilt copy "
                    f"(such as shared/data's JPEG rebuild) needs data.check_integrity=false."
                ) from err
    if cfg.download:
        return _download(cfg, lambda: _cifar_tensors(with_mirror(cls, cfg.mirror), root, download=True), root)
    raise DataNotFoundError(
        f"cifar10: {_root_note(root)}No cifar-10-batches-py/ under {[str(c) for c in roots]}. "
        f"Online: set data.download=true. Offline: list a folder holding cifar-10-batches-py/ in data.offline_roots."
    )


def _cifar_tensors(cls, root: Path, download: bool):
    train = cls(str(root), train=True, download=download)
    test = cls(str(root), train=False, download=download)

    def to_tensor(ds):
        images = torch.from_numpy(ds.data)
        images = images.permute(0, 3, 1, 2).contiguous() if images.dim() == 4 else images
        return images, torch.tensor(ds.targets, dtype=torch.long)

    return _checked("cifar10", root / "cifar-10-batches-py", to_tensor(train), to_tensor(test))


def _load_svhn(cfg: DataConfig, root: Path):
    """SVHN's cropped digits (73,257 train / 26,032 test; the 'extra' split is not used),
    from torchvision's ``train_32x32.mat`` / ``test_32x32.mat`` in an ``SVHN/`` folder."""
    from torchvision.datasets import SVHN

    class UncheckedSVHN(SVHN):
        def _check_integrity(self) -> bool:
            return (Path(self.root) / self.filename).exists()

    cls = SVHN if cfg.check_integrity else UncheckedSVHN
    files = ("train_32x32.mat", "test_32x32.mat")
    roots = search_roots(cfg)
    for candidate in roots:
        folder = candidate / "SVHN"
        if all((folder / f).exists() for f in files):
            try:
                return _svhn_tensors(cls, folder, download=False)
            except RuntimeError as err:
                raise DataNotFoundError(f"svhn under {folder} failed torchvision's integrity check ({err}); "
                                        f"a re-encoded copy needs data.check_integrity=false") from err
    if cfg.download:
        return _download(cfg, lambda: _svhn_tensors(with_mirror(cls, cfg.mirror), root / "SVHN", download=True), root)
    raise DataNotFoundError(
        f"svhn: {_root_note(root)}No {' and '.join(files)} under {[str(c / 'SVHN') for c in roots]}. "
        f"Online: set data.download=true. Offline: put torchvision's SVHN files in an SVHN/ folder of data.root "
        f"or of one of data.offline_roots."
    )


def _svhn_tensors(cls, folder: Path, download: bool):
    def split(name: str):
        ds = cls(str(folder), split=name, download=download)  # labels already 0-9 (torchvision maps 10 -> 0)
        return torch.from_numpy(ds.data).contiguous(), torch.from_numpy(ds.labels).long()

    return _checked("svhn", folder, split("train"), split("test"))


def synthetic_dataset(train_size: int, num_classes: int = 10, image_size: int = 28, seed: int = 0) -> FederatedDataset:
    """Learnable generated images: a fixed random prototype per class plus noise."""
    g = torch.Generator().manual_seed(seed)
    prototypes = torch.randn(num_classes, 1, image_size, image_size, generator=g)

    def draw(n: int):
        y = torch.arange(n) % num_classes
        y = y[torch.randperm(n, generator=g)]
        x = prototypes[y] + 1.5 * torch.randn(n, 1, image_size, image_size, generator=g)
        return x, y

    train_x, train_y = draw(train_size)
    test_x, test_y = draw(max(num_classes, train_size // 4))
    return FederatedDataset("synthetic", train_x, train_y, test_x, test_y, num_classes)
