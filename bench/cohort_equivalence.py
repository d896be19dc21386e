"""Cohort vs per-client engine on one machine (synthetic data, 2 rounds, fp32): the largest
parameter difference after the run and both engines' per-round metrics, as JSON.

    python bench/cohort_equivalence.py --accelerator gpu --out equivalence.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CASES = {
    "fedova_sgd": [],
    "fedova_adam": ["--optimizer.name", "adam", "--optimizer.lr", "0.001"],
    "fedavg_dirichlet_momentum": ["--algorithm", "FedAvg", "--partition.scheme", "dirichlet", "--optimizer.momentum", "0.9"],
    "fedprox_dirichlet": ["--algorithm", "FedProx", "--algorithm.mu", "0.1", "--partition.scheme", "dirichlet"],
    "scaffold_dirichlet": ["--algorithm", "SCAFFOLD", "--partition.scheme", "dirichlet"],
    "fedavg_whole_set": ["--algorithm", "FedAvg", "--federation.batch_size", "0", "--partition.scheme", "dirichlet"],
}


def tiny(run_dir: str, *extra: str) -> list[str]:
    return ["fit", "--data.name", "synthetic", "--data.synthetic_size", "600", "--partition.num_clients", "10",
            "--federation.client_fraction", "0.3", "--federation.local_epochs", "2", "--federation.batch_size", "10",
            "--federation.rounds", "2", "--federation.final_window", "2", "--trainer.precision", "32-true",
            "--run.logger", "none", "--run.progress", "false", "--run.dir", run_dir, *extra]


def main() -> None:
    import torch

    from fl_lightning.checkpoint import load_checkpoint
    from fl_lightning.settings import build_federation

    ap = argparse.ArgumentParser()
    ap.add_argument("--accelerator", default="cpu")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    report = {"device": torch.cuda.get_device_name(0) if args.accelerator == "gpu" else "cpu", "cases": {}}
    for name, extra in CASES.items():
        runs = {}
        for engine in ("per_client", "cohort"):
            run_dir = tempfile.mkdtemp(prefix=f"eq_{name}_{engine}_")
            fed = build_federation(tiny(run_dir, *extra, "--trainer.accelerator", args.accelerator,
                                        "--trainer.engine", engine), callbacks=[])[2]
            summary = fed.fit()
            runs[engine] = ({k: v.float() for k, v in fed.state.items()},
                            [{k: m[k] for k in ("train/loss", "train/steps", "test/accuracy", "bytes/up")} for m in summary["history"]])
        a, b = runs["per_client"][0], runs["cohort"][0]
        diff = max((a[k] - b[k]).abs().max().item() for k in a)
        report["cases"][name] = {"max_param_diff": diff, "per_client": runs["per_client"][1], "cohort": runs["cohort"][1]}
        print(name, diff, runs["per_client"][1][-1], runs["cohort"][1][-1], flush=True)
    Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
