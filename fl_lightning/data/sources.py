"""Where a data set's files are looked for (docs/data.md), in this order:

1. a path the settings name (``data.idx_gz_dir``, ``data.offline_roots``, ``data.image_pack``,
   ``data.speech_commands_dir``, ``data.fsdd_dir``) must hold the files, or the run stops
   with an error naming the key, even when another copy exists elsewhere;
2. the data root, the one folder written to (downloads, unpacked copies, feature caches):
   ``data.root``, else ``$FL_LIGHTNING_DATA``, else ``~/.cache/fl_lightning/data``;
3. the copies a machine already has, read-only and found without a setting (``MACHINE_COPIES``,
   ``MACHINE_IDX_GZ``); ``FL_LIGHTNING_DATA_FALLBACKS=off`` skips them (a clean machine);
4. with ``data.download=true``, a download into the data root from torchvision's mirrors, or
   from ``data.mirror`` (same file names, same md5 sums).
"""

from __future__ import annotations

import os
from pathlib import Path

from fl_lightning.config import DataConfig, default_data_root

FALLBACKS_ENV = "FL_LIGHTNING_DATA_FALLBACKS"
_CHECKOUT = Path(__file__).resolve().parents[2]
# Folders in torchvision's layout: the lab's shared copy beside the checkout, or inside it on a
# machine that received the checkout with its shared/ folder.
MACHINE_COPIES = (_CHECKOUT.parent / "shared" / "data", _CHECKOUT / "shared" / "data")
# Original *-ubyte.gz files of one data set (the two MNISTs share their file names, so a folder
# belongs to one set): Debian's and Ubuntu's `apt-get install dataset-fashion-mnist`.
MACHINE_IDX_GZ = {"fashion_mnist": (Path("/usr/share/datasets/fashion-mnist"),)}
# data.offline_roots' default before the machine copies were built in; checkpoints and configs
# written then still name it, and it must not fail where that folder does not exist.
_FORMER_DEFAULT = "../shared/data"


class DataNotFoundError(FileNotFoundError):
    """No copy of a data set where it was looked for, or a named path that does not hold it."""


def data_root(cfg: DataConfig) -> Path:
    return Path(cfg.root or default_data_root()).expanduser()


def _fallbacks_on() -> bool:
    return os.environ.get(FALLBACKS_ENV, "").strip().lower() not in ("off", "0", "false", "no")


def machine_copies() -> list[Path]:
    if not _fallbacks_on():
        return []
    return _unique([p for p in MACHINE_COPIES if p.is_dir()])


def machine_idx_gz(name: str) -> list[Path]:
    return [p for p in MACHINE_IDX_GZ.get(name, ()) if p.is_dir()] if _fallbacks_on() else []


def offline_roots(cfg: DataConfig) -> list[Path]:
    """``data.offline_roots``, each checked to be a folder."""
    roots = []
    for i, entry in enumerate(cfg.offline_roots):
        path = Path(entry).expanduser()
        if path.is_dir():
            roots.append(path)
        elif entry != _FORMER_DEFAULT:
            raise DataNotFoundError(f"data.offline_roots[{i}]={entry!r} is not a folder"
                                    f"{'' if path.exists() else ' (it does not exist)'}")
    return roots


def search_roots(cfg: DataConfig) -> list[Path]:
    """Folders in torchvision's layout, in the order they are searched: data root, data.offline_roots,
    the machine's copies."""
    return _unique([data_root(cfg), *offline_roots(cfg), *machine_copies()])


def explicit_folder(key: str, value: str) -> Path:
    """The folder a setting names, or an error naming the setting."""
    path = Path(value).expanduser()
    if not path.is_dir():
        raise DataNotFoundError(f"data.{key}={value!r} is not a folder{'' if path.exists() else ' (it does not exist)'}")
    return path


def with_mirror(cls, mirror: str | None):
    """torchvision's dataset class ``cls``, downloading from ``mirror`` (a base URL) instead of its
    own mirrors when given. Same class name, so the same folder layout."""
    if not mirror:
        return cls
    base = mirror.rstrip("/")
    if hasattr(cls, "mirrors"):  # MNIST, FashionMNIST: <mirror><file name from resources>
        attrs = {"mirrors": [base + "/"]}
    elif hasattr(cls, "split_list"):  # SVHN: (url, file name, md5) per split
        attrs = {"split_list": {k: (f"{base}/{v[1]}", v[1], v[2]) for k, v in cls.split_list.items()}}
    else:  # CIFAR10: one archive
        attrs = {"url": f"{base}/{cls.filename}"}
    return type(cls.__name__, (cls,), {**attrs, "__module__": cls.__module__})


def download_note(cfg: DataConfig) -> str:
    return f"data.mirror={cfg.mirror!r}" if cfg.mirror else "torchvision's mirrors (data.mirror: another one)"


def _unique(paths: list[Path]) -> list[Path]:
    seen, kept = set(), []
    for path in paths:
        key = os.path.abspath(path)
        if key not in seen:
            seen.add(key)
            kept.append(path)
    return kept
