"""Whole-federation checkpoints, written atomically and loaded with weights_only=True."""

from __future__ import annotations

import os
import pickle
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch

from fl_lightning.interrupts import interrupt_behind

REQUIRED_KEYS = frozenset({"round", "state", "sampler_state", "history", "config"})


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: truncated, corrupt, unsafe or not fl_lightning's."""


def save_atomic(obj: Any, path: Path) -> None:
    """Write to a temporary file in the same folder, fsync, then rename (and fsync the
    folder): a crash at any moment leaves either the previous checkpoint or the new one,
    never half of one, under ``path``. Temporary files of earlier crashed writes are removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as error:
        tmp.unlink(missing_ok=True)
        interrupt = interrupt_behind(error)
        if interrupt is not None and interrupt is not error:
            raise interrupt from None  # Ctrl-C, not torch's error about the write it cut short
        raise
    _fsync_folder(path.parent)
    for stale in path.parent.glob(f".{path.name}.tmp-*"):  # left by a killed writer
        stale.unlink(missing_ok=True)


def _fsync_folder(folder: Path) -> None:
    """Makes the rename itself durable (power loss); not every platform can open a folder."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def load_checkpoint(path: str | Path) -> dict:
    """The checkpoint at ``path``, read with ``weights_only=True`` (tensors and plain
    containers only: a pickle that would run code is refused, never executed)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"ckpt_path={str(path)!r} does not exist")
    where = f"ckpt_path={str(path)!r}"
    try:
        with warnings.catch_warnings():  # foreign pickles' protocol warning: the error below says more
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise CheckpointError(
            f"{where} holds objects that a safe load (torch.load weights_only=True) refuses, so it was not "
            f"loaded and nothing in it was run: it was not written by fl_lightning, or was tampered with "
            f"({_reason(err)})"
        ) from err
    except (RuntimeError, EOFError, zipfile.BadZipFile, KeyError, ValueError, OSError) as err:
        raise CheckpointError(
            f"{where} is truncated or corrupt ({path.stat().st_size} bytes; {_reason(err)}); "
            f"resume from an earlier checkpoint"
        ) from err
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"{where} is not an fl_lightning checkpoint (it holds a {type(ckpt).__name__})")
    missing = REQUIRED_KEYS - set(ckpt)
    if missing:
        raise CheckpointError(f"{where} is not an fl_lightning checkpoint (missing {sorted(missing)})")
    return ckpt


def _reason(err: Exception) -> str:
    """The informative line of torch.load's error (its first sentence; for a refused pickle,
    the global it refused), without torch's boilerplate."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    lines = [line for line in lines
             if not line.startswith(("Weights only load failed", "Check the documentation", "Please file an issue"))]
    if not lines:
        return type(err).__name__ + (": unexpected end of file" if isinstance(err, EOFError) else "")
    return f"{type(err).__name__}: {lines[0].split('. ')[0].rstrip('.')}"
