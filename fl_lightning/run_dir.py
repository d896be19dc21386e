"""What a run directory already holds, so that a fresh ``fit`` neither trains over a finished
run nor silently mixes with a stopped one (summary.json overwritten, a stale checkpoint
resumed later by mistake).

A fit into a run.dir that holds a run is refused unless it resumes (``--ckpt_path last``) or
``run.overwrite`` is set, which deletes the results a run writes there first (never other
files: run.dir may be a folder the user keeps other things in).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Optional

# What a fit writes into run.dir (summary, checkpoints, saved client results, CSV metrics,
# W&B's offline files, the partition table, ATHENA-FL's detector database).
RESULTS = ("summary.json", "checkpoints", "metrics", "wandb", "partition.csv", "detectors.sqlite")


def held_run(run_dir: str | Path) -> Optional[str]:
    """What in ``run_dir`` a fresh fit would lose ("a finished run (summary.json)", ...), or
    None: a finished run's summary, a checkpoint, saved client results. A folder with only a
    partition table or metrics of a run stopped before any of them holds nothing to resume."""
    run_dir = Path(run_dir)
    if (run_dir / "summary.json").is_file():
        return f"a finished run ({run_dir / 'summary.json'})"
    checkpoints = run_dir / "checkpoints"
    found = sorted(checkpoints.glob("*.ckpt")) if checkpoints.is_dir() else []
    if found:
        return f"a started run's checkpoint ({found[-1]})"
    if checkpoints.is_dir() and any(checkpoints.glob("clients/round-*/client-*.pt")):
        return f"a started run's saved client results ({checkpoints / 'clients'})"
    return None


def refuse_or_clear(run_dir: str | Path, overwrite: bool) -> None:
    """Before a fresh fit: raises ``RunDirHoldsRunError`` when ``run_dir`` holds a run, or with
    ``overwrite`` deletes that run's results."""
    held = held_run(run_dir)
    if held is None:
        return
    if not overwrite:
        raise RunDirHoldsRunError(
            f"run.dir={str(run_dir)!r} already holds {held}: resume it with --ckpt_path last, replace it "
            f"with --run.overwrite true, or choose another run.dir")
    for name in RESULTS:
        path = Path(run_dir) / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


class RunDirHoldsRunError(ValueError):
    """A fresh fit into a run.dir that holds a run (a user error: one line, status 1)."""
