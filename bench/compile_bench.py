"""trainer.compile against the eager cohort step, side by side in one run (bench/cohort_bench.py
runs each in its own process): FedOV's one shot (FEDOV workload, FMNIST #C=1, 10 clients) at
E = 1 and E = 3, in the order eager, compiled, compiled, eager. A local epoch's cost is
(E = 3 minus E = 1) / 2, which leaves out start-up and the compiled step's compile time (paid
in both); the compile time is the compiled E = 1 run's training time minus the eager one's.
Both variants' final global states are compared (the same batches and draws: they differ by
float rounding only).

    python bench/compile_bench.py --out bench/results/compile_cpu.json [--gz DIR] [--extra "..."]

On a CPU run it with the threads set (--extra "--trainer.threads 2"); on a GPU bench/gpu_check.sh
runs the same pairs (FEDOV_E1/E3_cohort and FEDOV_E1/E3_cohort_compiled).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ORDER = [("cohort", 1), ("cohort_compiled", 1), ("cohort_compiled", 3), ("cohort", 3)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--gz", default="/usr/share/datasets/fashion-mnist", help="Fashion-MNIST's *-ubyte.gz")
    ap.add_argument("--extra", default="", help="more CLI overrides for every run")
    args = ap.parse_args()
    import torch

    runs, states = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for order, (variant, epochs) in enumerate(ORDER, 1):
            out, state = Path(tmp) / f"{order}.json", Path(tmp) / f"{variant}_{epochs}.pt"
            extra = f"--data.idx_gz_dir {args.gz} --federation.local_epochs {epochs} {args.extra}"
            subprocess.run([sys.executable, str(ROOT / "bench" / "cohort_bench.py"), "--workload", "FEDOV",
                            "--variant", variant, "--rounds", "1", "--extra", extra, "--out", str(out),
                            "--save-state", str(state)], check=True, cwd=ROOT)
            result = json.loads(out.read_text())
            runs.append({"order": order, "variant": variant, "local_epochs": epochs,
                         "train_s": round(result["train_seconds_per_round"], 2),
                         "final_accuracy": result["final_accuracy"], "steps": result["steps_per_round"][0],
                         "device": result["device"], "command": result["command"]})
            states[(variant, epochs)] = torch.load(state)
    train = {(r["variant"], r["local_epochs"]): r["train_s"] for r in runs}
    epoch = {v: (train[(v, 3)] - train[(v, 1)]) / 2 for v in ("cohort", "cohort_compiled")}
    eager, compiled = states[("cohort", 3)], states[("cohort_compiled", 3)]
    summary = {
        "what": "FedOV one shot (FEDOV workload: FMNIST #C=1, 10 clients, B = 64), the cohort engine's step eager "
                "and compiled (trainer.compile), E = 1 and E = 3, in the order eager, compiled, compiled, eager",
        "runs": runs,
        "seconds_per_local_epoch": {k: round(v, 2) for k, v in epoch.items()},
        "compiled_over_eager_per_epoch": round(epoch["cohort_compiled"] / epoch["cohort"], 3),
        "compile_seconds": round(train[("cohort_compiled", 1)] - train[("cohort", 1)] - epoch["cohort_compiled"]
                                 + epoch["cohort"], 1),
        "largest_parameter_difference_at_E3": max((compiled[k].float() - eager[k].float()).abs().max().item()
                                                  for k in eager),
        "largest_parameter_at_E3": max(eager[k].float().abs().max().item() for k in eager),
    }
    Path(args.out).write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}, indent=1))


if __name__ == "__main__":
    main()
