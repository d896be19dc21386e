"""How many member-steps a cohort spends on members whose local training has ended, with and
without compaction (fl_lightning/cohort/engine.py, ``compaction_points``), for FedOV Table 1's
cells as experiments/fedov_stacked.py stacks them (one cell's three seeds, E = 200): counted
from the real partitions, no training. A step's cost grows with its members
(docs/performance.md's step model), so these counts bound what compaction saves.

    python bench/compaction_plan.py --out bench/results/compaction_plan.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))


def member_steps(data: str, part: str, seed: int, epochs: int, extra: list[str]) -> list[int]:
    from fedov_stacked import PARTITIONS

    from fl_lightning.settings import build_federation

    fed = build_federation(["fit", "--config", str(ROOT / "configs" / f"fedov_{data}.yaml"), *PARTITIONS[part],
                            "--seed", str(seed), "--federation.local_epochs", str(epochs), "--trainer.accelerator", "cpu",
                            "--run.logger", "none", "--run.dir", "/tmp/compaction_plan", *extra], callbacks=[])[2]
    fed.setup()
    return [math.ceil(len(ix) / fed.federation.batch_size) * epochs for ix in fed.client_indices]


def counts(steps: list[int]) -> dict:
    import torch

    from fl_lightning.cohort.engine import compaction_points

    longest = max(steps)
    active = torch.zeros(longest, len(steps))
    for m, s in enumerate(steps):
        active[:s, m] = 1
    points = compaction_points(active)
    compacted, at, current = 0, 0, len(steps)
    for end, still in points:
        compacted, at, current = compacted + (end - at) * current, end, len(still)
    compacted += (longest - at) * current
    return {"members": len(steps), "steps": longest, "member_steps_trained": sum(steps),
            "member_steps_without_compaction": longest * len(steps), "member_steps_with_compaction": compacted,
            "compactions": len(points), "fewer_member_steps": round(1 - compacted / (longest * len(steps)), 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", nargs="+", default=["mnist", "fmnist"])
    ap.add_argument("--parts", nargs="+", default=["C1", "C2", "D05"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--extra", default="", help="settings for every run (e.g. --data.idx_gz_dir DIR)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    cells = {}
    for data in args.data:
        for part in args.parts:
            steps = [s for seed in args.seeds for s in member_steps(data, part, seed, args.epochs, args.extra.split())]
            cells[f"{data}_{part}"] = counts(steps)
            print(data, part, cells[f"{data}_{part}"], flush=True)
    Path(args.out).write_text(json.dumps({"epochs": args.epochs, "seeds": args.seeds, "batch_size_from": "configs",
                                          "cells": cells}, indent=1))


if __name__ == "__main__":
    main()
