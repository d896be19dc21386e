"""Side-by-side round benchmarks on real Fashion-MNIST (issue: performance).

Each variant runs in its own subprocess (so peak RSS is its own), variants alternate, and
the JSON records wall time, steps, samples/s, peak RSS, accuracy, threads and device:

    .venv/bin/python bench/round_bench.py --workload W1 --rounds 1 --repeats 2

Workloads: W1 FedOVA, non-IID-2, K=100, C=0.2, E=5, B=15; W2 the same with K=1000;
W3 FedAvg in W1's setting; W4 one FedOV local epoch (10 clients, #C=2, data destruction
and FGSM) and the voting evaluation. Variants: fl_lightning (its CLI entry point, configured as
shipped: 2 worker processes), plain (bench/plain_loop.py, torch's default threads).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = {
    "W1": ["--config", "configs/fedova_fmnist.yaml"],
    "W2": ["--config", "configs/fedova_fmnist.yaml", "--partition.num_clients", "1000"],
    "W3": ["--config", "configs/fedavg_fmnist.yaml"],
    # FedOV, one local epoch of all 10 clients (#C=2) with data destruction and FGSM, then voting
    "W4": ["--config", "configs/fedov_fmnist.yaml", "--partition.labels_per_client", "2",
           "--federation.local_epochs", "1"],
}


def cli_args(workload: str, rounds: int, run_dir: str, extra: list[str] = ()) -> list[str]:
    return ["fit", *WORKLOADS[workload], *extra, "--federation.rounds", str(rounds), "--federation.eval_every", "1",
            "--federation.final_window", str(rounds), "--run.logger", "none", "--run.progress", "false",
            "--run.checkpoint_every", "0", "--run.dir", run_dir]


def run_variant(variant: str, workload: str, rounds: int, run_dir: str, extra: list[str] = ()) -> dict:
    """Executed inside the subprocess."""
    import torch

    from fl_lightning.settings import build_federation

    _, _, fed = build_federation(cli_args(workload, rounds, run_dir, extra if variant == "fl_lightning" else ()),
                                 callbacks=[])
    fed.setup()  # data loading and partitioning are not part of the timed work
    start = time.perf_counter()
    if variant == "fl_lightning":
        summary = fed.fit()
        accuracies = [m["test/accuracy"] for m in summary["history"]]
        steps = sum(m["train/steps"] for m in summary["history"])
        threads = {"parent": torch.get_num_threads(), "workers": fed.trainer_cfg.workers}
    else:
        from bench.plain_loop import plain_federation

        accuracies = plain_federation(fed, rounds)
        steps = None
        threads = {"parent": torch.get_num_threads(), "workers": 0}
    wall = time.perf_counter() - start
    peak_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    peak_child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"variant": variant, "workload": workload, "rounds": rounds, "wall_s": wall, "steps": steps,
            "accuracy_per_round": accuracies, "final_accuracy": accuracies[-1], "threads": threads,
            "peak_rss_mb": {"main": peak_self, "largest_worker": peak_child}, "device": "cpu"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="W1")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--variants", default="fl_lightning,plain")
    ap.add_argument("--out", default=None)
    ap.add_argument("--extra", default="", help="CLI overrides for the fl_lightning variant, e.g. "
                    "'--trainer.precision bf16-mixed' (the plain loop stays in float32)")
    ap.add_argument("--_child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._child:
        print(json.dumps(run_variant(args._child, args.workload, args.rounds, f"/tmp/flbench_{os.getpid()}",
                                     args.extra.split())))
        return
    results = []
    for rep in range(args.repeats):
        for variant in args.variants.split(","):
            out = subprocess.run([sys.executable, __file__, "--workload", args.workload, "--rounds", str(args.rounds),
                                  "--_child", variant, "--extra", args.extra], cwd=ROOT, capture_output=True, text=True, check=True,
                                 env={**os.environ, "PYTHONPATH": str(ROOT)})
            result = json.loads(out.stdout.strip().splitlines()[-1])
            result["repeat"] = rep
            results.append(result)
            print(f"{args.workload} {variant:>12} rep {rep}: {result['wall_s']:.1f} s, acc {result['final_accuracy']:.4f}",
                  file=sys.stderr, flush=True)
    by_variant = {}
    for r in results:
        by_variant.setdefault(r["variant"], []).append(r["wall_s"])
    summary = {
        "workload": args.workload,
        "command": " ".join(sys.argv),
        "fl_lightning_overrides": args.extra,
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "median_wall_s": {v: sorted(t)[len(t) // 2] for v, t in by_variant.items()},
        "results": results,
    }
    if "plain" in by_variant and "fl_lightning" in by_variant:
        summary["ratio_fl_lightning_over_plain"] = summary["median_wall_s"]["fl_lightning"] / summary["median_wall_s"]["plain"]
    out = Path(args.out or ROOT / "bench" / "results" / f"{args.workload}_r{args.rounds}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "results"}, indent=1))


if __name__ == "__main__":
    main()
