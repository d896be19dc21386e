"""How to run a client's detectors on a CPU: the measurements behind StackedModel's modes.

Times 200 SGD steps (batch 15, Fashion-MNIST-sized inputs) of G one-vs-all FashionCNN
detectors, one torch thread, for: separate modules one after another (NCHW, the plain
baseline), the same in NHWC (channels_last), vmap over stacked parameters (grouped
convolutions), and fl_lightning's BinaryDetector in its CPU ('loop') mode without Lightning.

    .venv/bin/python bench/micro_detectors.py --detectors 2
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from fl_lightning.config import OptimizerConfig
from fl_lightning.models import FashionCNN
from fl_lightning.algorithms.fedova import BinaryDetector
from fl_lightning.modules import stack_models


def batches(steps=200, batch=15):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(600, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (600,), generator=g)
    return [(x[(s % 40) * batch:(s % 40 + 1) * batch], y[(s % 40) * batch:(s % 40 + 1) * batch]) for s in range(steps)]


def separate(G, data, channels_last):
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    models = [FashionCNN(num_outputs=1).to(memory_format=fmt) for _ in range(G)]
    start = time.perf_counter()
    for c, m in enumerate(models):
        opt = torch.optim.SGD(m.parameters(), lr=0.05)
        for x, y in data:
            opt.zero_grad()
            F.binary_cross_entropy_with_logits(m(x.contiguous(memory_format=fmt)).squeeze(-1), (y == c).float()).backward()
            opt.step()
    return time.perf_counter() - start


def stacked(G, data, mode):
    det = BinaryDetector(FashionCNN(num_outputs=1), list(range(G)), stack_models([FashionCNN(num_outputs=1) for _ in range(G)]),
                         OptimizerConfig(), stacking=mode)
    opt = det.configure_optimizers()
    start = time.perf_counter()
    for i, batch in enumerate(data):
        batch = det.on_after_batch_transfer(batch, 0)
        opt.zero_grad()
        det.training_step(batch, i).backward()
        opt.step()
    return time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--detectors", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="bench/results/micro_detectors.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    data = batches()
    variants = {
        "separate_nchw (plain baseline)": lambda: separate(args.detectors, data, False),
        "separate_nhwc": lambda: separate(args.detectors, data, True),
        "stacked_vmap (grouped conv)": lambda: stacked(args.detectors, data, "vmap"),
        "stacked_loop (fl_lightning CPU mode)": lambda: stacked(args.detectors, data, "loop"),
    }
    times = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, fn in variants.items():
            times[name].append(fn())
    median = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    base = median["separate_nchw (plain baseline)"]
    report = {"detectors": args.detectors, "steps": 200, "batch": 15, "threads": 1, "median_s": median,
              "ratio_to_plain": {k: v / base for k, v in median.items()}, "all_s": times}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps({k: report[k] for k in ("median_s", "ratio_to_plain")}, indent=1))


if __name__ == "__main__":
    main()
