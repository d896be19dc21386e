"""A one-shot vote's accuracy per class against how many clients hold the class, from the
runs' summary.json alone (its ``test_classes`` and its config, which rebuilds the partition).

    .venv/bin/python experiments/class_holders.py RUN_DIR [RUN_DIR ...]

A client holds a class when it has at least 1 % of the class's training samples (under
Dir(0.1) most clients have none or a handful of a class, and a handful does not teach the
class). Close-set voting sums every member's softmax, so a class that few clients hold is
outvoted by the others, which predict their own classes for it (FedOV, Section 2, Figure 1a).
Prints, per run, the classes with their holders and accuracy, and the mean class accuracy by
number of holders; used for the Dir(0.1) close-set rows of docs/reproduction.md.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

SHARE = 0.01


def class_holders(run_dir: Path) -> tuple[list[int], list[float]]:
    """(holders per class, accuracy per class) of one finished run."""
    from fl_lightning.settings import federation_from_config

    summary = json.loads((run_dir / "summary.json").read_text())
    if "test_classes" not in summary:
        raise ValueError(f"{run_dir}/summary.json has no test_classes (written since commit 3f3ecec)")
    fed = federation_from_config(summary["config"])
    fed.setup()
    counts = np.asarray(fed.partition_counts, dtype=np.float64)[:, : fed._data.num_classes]
    holders = (counts / counts.sum(0) >= SHARE).sum(0)
    return holders.tolist(), summary["test_classes"]["accuracy"]


def main(run_dirs: list[str]) -> None:
    by_holders: dict[int, list[float]] = defaultdict(list)
    for d in run_dirs:
        holders, accuracy = class_holders(Path(d))
        print(f"{d}: " + ", ".join(f"class {c} held by {h}: {100 * a:.1f}" for c, (h, a) in enumerate(zip(holders, accuracy))))
        for h, a in zip(holders, accuracy):
            by_holders[h].append(a)
    print("| clients holding the class | classes (over the runs) | mean class accuracy |")
    print("|---|---|---|")
    for h in sorted(by_holders):
        print(f"| {h} | {len(by_holders[h])} | {100 * np.mean(by_holders[h]):.1f} |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
