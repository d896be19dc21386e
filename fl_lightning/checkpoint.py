"""Whole-federation checkpoints, written atomically and loaded with weights_only=True."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch


def save_atomic(obj: Any, path: Path) -> None:
    """Write to a temporary file in the same folder, fsync, then rename: a crash leaves
    either the previous checkpoint or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"ckpt_path={str(path)!r} does not exist")
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    missing = {"round", "state", "sampler_state", "history", "config"} - set(ckpt)
    if missing:
        raise ValueError(f"ckpt_path={str(path)!r} is not an fl_lightning checkpoint (missing {sorted(missing)})")
    return ckpt
