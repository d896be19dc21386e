"""How far is a round from pure compute? (issue: performance, the Flower comparison)

Measures, in one run: the time of one bare optimizer step of the workload's model (no
framework: a tight loop over pre-made batches, NHWC, one torch thread, the best layout
this CPU has), then W3 through fl_lightning and through Flower's simulation. The compute
floor of a round is steps x step time / cores: no engine that does the same steps on
these cores can be faster.

    PYTHONPATH=. .venv/bin/python bench/compute_floor.py --rounds 3

Writes bench/results/compute_floor_W3.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def bare_step_seconds(batch: int = 15, steps: int = 600) -> float:
    import torch
    import torch.nn.functional as F

    from fl_lightning.models import FashionCNN

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = FashionCNN(1, 28, 10).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xs = [torch.randn(batch, 1, 28, 28).contiguous(memory_format=torch.channels_last) for _ in range(steps)]
    ys = torch.randint(0, 10, (steps, batch))

    def run(n):
        for i in range(n):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(xs[i]), ys[i]).backward()
            opt.step()

    run(50)  # warm-up: oneDNN primitive caches
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        run(steps)
        best = min(best, (time.perf_counter() - start) / steps)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-flower", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "compute_floor_W3.json"))
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cores = len(os.sched_getaffinity(0))

    step_s = bare_step_seconds()
    print(f"bare step (B=15, 1 thread, NHWC): {step_s * 1e3:.2f} ms", file=sys.stderr, flush=True)
    fl = subprocess.run([sys.executable, str(ROOT / "bench" / "round_bench.py"), "--workload", "W3", "--rounds",
                         str(args.rounds), "--_child", "fl_lightning"], cwd=ROOT, env=env, capture_output=True,
                        text=True, check=True)
    fl_result = json.loads(fl.stdout.strip().splitlines()[-1])
    steps_per_round = fl_result["steps"] / args.rounds
    floor_round_s = steps_per_round * step_s / cores
    out = {
        "workload": "W3: FedAvg, Fashion-MNIST non-IID-2, K=100, C=0.2, E=5, B=15 (FashionCNN, SGD)",
        "command": " ".join(sys.argv),
        "cores": cores,
        "bare_step_ms": step_s * 1e3,
        "steps_per_round": steps_per_round,
        "compute_floor_round_s": floor_round_s,
        "fl_lightning_round_s": fl_result["wall_s"] / args.rounds,
        "fl_lightning_over_floor": fl_result["wall_s"] / args.rounds / floor_round_s,
    }
    if not args.skip_flower:
        flower_json = Path("/tmp") / f"flower_floor_{os.getpid()}.json"
        subprocess.run([sys.executable, str(ROOT / "bench" / "flower_bench.py"), "--rounds", str(args.rounds),
                        "--out", str(flower_json)], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
        flower = json.loads(flower_json.read_text())
        out["flower_round_s"] = flower["wall_s"] / args.rounds
        out["flower_over_floor"] = out["flower_round_s"] / floor_round_s
        out["flower_over_fl_lightning"] = out["flower_round_s"] / out["fl_lightning_round_s"]
        out["fastest_possible_speedup_over_flower"] = out["flower_round_s"] / floor_round_s
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
