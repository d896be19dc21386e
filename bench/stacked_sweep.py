"""A stacked sweep against the same runs one after another (issue: stacked sweeps), in one
process, side by side: a 3 x 3 grid of FedOVA runs over local epochs E and batch size B in
the W1 setting (Fashion-MNIST, non-IID-2, K = 100, C = 0.2, SGD 0.05), each 20 rounds, first
as ``sweep --stack`` (the runs' clients in shared cohorts: a cohort per (E, B), then all of them
in one, padded and masked), then with the cohort engine one run at a time. The JSON records both wall times, their ratio, every run's final accuracy both
ways, the peak GPU memory of each way and the device:

    python bench/stacked_sweep.py --rounds 20 --extra "--data.idx_gz_dir DIR" --out stacked.json

``--smoke``: synthetic data, 1 round, on any machine (checks the script, measures nothing).
Target (GPU): stacked >= 5x faster, the same accuracies.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GRID = """\
method: grid
parameters:
  federation.local_epochs: {values: [1, 2, 5]}
  federation.batch_size: {values: [10, 15, 50]}
"""
W1 = ["--config", "configs/fedova_fmnist.yaml", "--optimizer.lr", "0.05", "--trainer.engine", "cohort",
      "--run.logger", "none", "--run.checkpoint_every", "0"]
STACK_MODES = ("grouped", "padded")  # sweep --stack's two ways with runs of different B and E
SMOKE = ["--data.name", "synthetic", "--data.synthetic_size", "2000", "--partition.num_clients", "20"]


def timed_sweep(file: Path, runs_dir: Path, extra: list[str], stack) -> dict:
    import torch

    from fl_lightning import sweep

    gpu = torch.cuda.is_available()
    if gpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    configs = sweep.run_sweep(file, runs_dir, extra, stack=stack)
    if gpu:
        torch.cuda.synchronize()
    failed = [c.name for c in configs if c.status not in ("done", "resumed")]
    if failed:
        raise SystemExit(f"runs failed ({stack or 'one by one'}): {failed}")
    return {"seconds": time.perf_counter() - started,
            "peak_gpu_memory_mb": torch.cuda.max_memory_allocated() / 2**20 if gpu else None,
            "final_accuracy": {c.name: c.summary["final_accuracy"] for c in configs}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--extra", default="", help="more fit settings, e.g. --data.idx_gz_dir DIR")
    parser.add_argument("--smoke", action="store_true", help="synthetic data, 1 round: checks the script")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    import torch

    rounds = 1 if args.smoke else args.rounds
    extra = [*W1, "--federation.rounds", str(rounds), *(SMOKE if args.smoke else []), *shlex.split(args.extra)]
    work = Path(tempfile.mkdtemp(prefix="stacked_sweep_"))
    try:
        file = work / "grid.yaml"
        file.write_text(GRID)
        ways = {mode: timed_sweep(file, work / mode, extra, stack=mode) for mode in STACK_MODES}
        alone = timed_sweep(file, work / "alone", extra, stack=None)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    gpu = torch.cuda.is_available()
    result = {
        "bench": "stacked_sweep", "grid": "E in {1, 2, 5} x B in {10, 15, 50}, FedOVA W1 setting",
        "rounds": rounds, "smoke": args.smoke, "settings": extra,
        "device": torch.cuda.get_device_name(0) if gpu else platform.processor() or platform.machine(),
        "one_by_one": alone, "torch": torch.__version__,
    }
    for mode, stacked in ways.items():
        gaps = [abs(stacked["final_accuracy"][name] - acc) for name, acc in alone["final_accuracy"].items()]
        result[f"stacked_{mode}"] = {**stacked, "speedup": alone["seconds"] / stacked["seconds"],
                                     "max_accuracy_gap": max(gaps), "mean_accuracy_gap": sum(gaps) / len(gaps)}
        print(f"--stack {mode}: {stacked['seconds']:.1f} s against {alone['seconds']:.1f} s one by one: "
              f"{alone['seconds'] / stacked['seconds']:.2f}x; accuracy gaps max {max(gaps):.4f}, mean "
              f"{sum(gaps) / len(gaps):.4f}; peak GPU memory {stacked['peak_gpu_memory_mb']} MB (one by one "
              f"{alone['peak_gpu_memory_mb']} MB) on {result['device']}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
