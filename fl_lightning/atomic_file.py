"""Files written whole or not at all, also when several processes write the same one."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import BinaryIO, Callable


def write_atomic(path: str | Path, write: Callable[[BinaryIO], None]) -> None:
    """``write`` fills a temporary file beside ``path``, which is then renamed over ``path``.

    A crash never leaves a truncated file under the real name. The temporary name is this
    process's own, so two runs filling one data cache at once (e.g. two lanes started together
    on a fresh machine) each rename a whole copy instead of one taking the other's half-written
    file away from under it."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.partial")
    try:
        with open(partial, "wb") as f:
            write(f)
        os.replace(partial, path)  # atomic within one file system
    finally:
        partial.unlink(missing_ok=True)
