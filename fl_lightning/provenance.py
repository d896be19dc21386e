"""What, besides the resolved config and seed, a run needs to be reproduced: the software
versions, the code's git commit and the processors. ``Federation.summary`` records it in
summary.json."""

from __future__ import annotations

import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Optional

PACKAGES = ("torchmetrics", "torchvision", "numpy", "jsonargparse")
_REPO = Path(__file__).resolve().parents[1]


def _version(package: str) -> Optional[str]:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _git(*args: str) -> Optional[str]:
    try:
        out = subprocess.run(["git", *args], cwd=_REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_state() -> dict[str, Any]:
    """The commit of the checkout fl_lightning runs from, and whether tracked files differ
    from it (then the commit alone does not pin the code); None outside a git checkout."""
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def cpu_model() -> Optional[str]:
    """The CPU's model name (Linux's /proc/cpuinfo, else what ``platform`` knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def reproducibility_info() -> dict[str, Any]:
    """Versions of Python, torch, Lightning and fl_lightning (plus the libraries whose
    numerics or parsing the results depend on), the platform, the command line, and the git
    commit when fl_lightning runs from a checkout. Runs of one seed and one set of versions
    on two kinds of processor may differ in the last bits, which training can amplify (torch
    picks its kernels by the instruction set, ``cpu_capability``), so the processors are
    recorded too."""
    import lightning
    import torch

    import fl_lightning

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "fl_lightning": fl_lightning.__version__,
        **{name: _version(name) for name in PACKAGES},
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "argv": list(sys.argv),
        "git": git_state(),
    }
