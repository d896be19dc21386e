"""Table of experiments/fimlbfgs.sh: final accuracy (mean of the last 10 rounds), best, and the
first round reaching a common target (97 % of FedAvg-SGD's final accuracy), bytes per round.

    .venv/bin/python experiments/collect_fimlbfgs.py [runs/fimlbfgs]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(root: str = "runs/fimlbfgs") -> None:
    runs = {p.parent.name: json.loads(p.read_text()) for p in sorted(Path(root).glob("*/summary.json"))}

    def curve(s):
        return [(m["round"], 100 * m["test/accuracy"]) for m in s["history"] if "test/accuracy" in m]

    def final(s, window=10):
        c = curve(s)[-window:]
        return sum(a for _, a in c) / len(c)

    for reference, members in (("fedavg_sgd_iid", ("fedavg_sgd_iid", "fedavg_adam_iid", "feddane_iid", "fimlbfgs_iid")),
                               ("logreg_fedavg_sgd_iid", ("logreg_fedavg_sgd_iid", "logreg_fimlbfgs_iid")),
                               ("fedova_sgd_noniid2", ("fedova_sgd_noniid2", "fedova_fimlbfgs_noniid2"))):
        if reference not in runs:
            continue
        target = 0.97 * final(runs[reference])
        print(f"\n| run | rounds | final (last 10) | best | first round >= {target:.1f} % | MB per round |")
        print("|---|---|---|---|---|---|")
        for name in members:
            if name not in runs:
                continue
            s = runs[name]
            c = curve(s)
            reach = next((r for r, a in c if a >= target), None)
            print(f"| {name} | {s['rounds']} | {final(s):.1f} | {max(a for _, a in c):.1f} | "
                  f"{reach if reach else 'not reached'} | {s['bytes_total'] / s['rounds'] / 1e6:.2f} |")
        print("per round:", {name: [round(a, 1) for _, a in curve(runs[name])] for name in members if name in runs})


if __name__ == "__main__":
    main(*sys.argv[1:])
