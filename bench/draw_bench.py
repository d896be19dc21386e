"""The host's share of a FedOV step: drawing each member's outliers and mixup pairs.

FedOV's cohort step on the GPU replays a captured graph, but its random draws (the destruction
operation and parameters of every image, PROSER's pairs and lambda) are drawn on the host, a
window of steps at a time (fl_lightning/cohort/members.py: StepDraws.window). Times that window
for 10 members x 256 steps of 64 images (FMNIST, B = 64, the authors' code's loss: their
destruction pool, PROSER's weights 1 / 0.01), one torch thread, and one member's draws step by
step (the per-client engine's way). Run it on two checkouts side by side to compare them:

    for repo in /tmp/before .; do PYTHONPATH=$repo .venv/bin/python bench/draw_bench.py --out $repo.json; done
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from fl_lightning.algorithms.fedov.draws import OpenSetDraws
from fl_lightning.algorithms.fedov.objective import OpenSetLoss
from fl_lightning.algorithms.fedov.voting import CODE_DESTRUCTION_OPS
from fl_lightning.cohort.members import StepDraws


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--members", type=int, default=10)
    ap.add_argument("--steps", type=int, default=256, help="steps in a window (the engine's DRAW_WINDOW)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    loss = OpenSetLoss(dummy_weight=1.0, mixup_weight=0.01, destruction_ops=CODE_DESTRUCTION_OPS)
    weight = torch.ones(args.steps, args.members, args.batch)
    active = torch.ones(args.steps, args.members)
    window_s, single_s = [], []
    for r in range(args.repeats):
        draws = StepDraws([OpenSetDraws(loss, 100 * r + m, (28, 28)) for m in range(args.members)])
        start = time.perf_counter()
        draws.window(0, weight, active)
        window_s.append(time.perf_counter() - start)
        one = OpenSetDraws(loss, r, (28, 28))
        start = time.perf_counter()
        for s in range(args.steps):
            one.take(s, args.batch, args.batch)
        single_s.append(time.perf_counter() - start)
    member_steps = args.members * args.steps
    result = {
        "members": args.members, "steps": args.steps, "batch": args.batch, "threads": 1,
        "window_s": min(window_s), "window_us_per_member_step": 1e6 * min(window_s) / member_steps,
        "step_by_step_us_per_step": 1e6 * min(single_s) / args.steps,
        "fmnist_epoch_draws_s": min(window_s) / member_steps * args.members * 94,  # 6000 images / 64 a member
        "torch": torch.__version__,
    }
    print(json.dumps(result, indent=1))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
