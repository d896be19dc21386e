"""Engines side by side on one machine (issue: cohort engine): the cohort engine (CUDA graph,
bf16 / fp32, eager), the per-client engine and the hand-written plain loop, on real
Fashion-MNIST in the FedOVA paper's setting. One variant per call (its own process, so its
peak memory is its own); the JSON records seconds per round, accuracy per round, peak GPU
memory and the device:

    python bench/cohort_bench.py --workload W1 --variant cohort --rounds 20 --out W1_cohort.json

Workloads: W1 FedOVA non-IID-2, K=100, C=0.2, E=5, B=15, SGD 0.05; W2 the same with K=1000;
W3 FedAvg in W1's setting (lr 0.1); MAIN the README's main job (configs/fedova_fmnist.yaml as
shipped, 100 rounds); FEDOV FedOV one-shot, 10 clients, #C=1 (200 local epochs as shipped),
CLOSESET close-set voting in the same setting;
CIFAR_FEDOVA / CIFAR_FEDAVG FedOVA's Table I on CIFAR-10 with VGG-11 (lr 0.01: speed only);
ATHENA ATHENA-FL on FMNIST (round 1 the MobileNet probe, then detector rounds); FEDAVG_MOBILENET
its FedAvg-MobileNet baseline; FEDKT FedKT's one shot (#C=2).
Variant cohort_cudnn_benchmark: the cohort engine with cuDNN's algorithm search
(trainer.cudnn_benchmark), against variant cohort on the same workload; cohort_no_compaction
(or --no-compaction): cohorts keep their finished members to the end, against variant cohort;
cohort_compiled: the cohort's step compiled by torch.compile (trainer.compile), against variant
cohort (its compile time is in its first round: compare E = 3 minus E = 1 for a step's cost).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WORKLOADS = {
    "W1": ["--config", "configs/fedova_fmnist.yaml", "--optimizer.lr", "0.05"],
    "W2": ["--config", "configs/fedova_fmnist.yaml", "--optimizer.lr", "0.05", "--partition.num_clients", "1000"],
    "W3": ["--config", "configs/fedavg_fmnist.yaml", "--optimizer.lr", "0.1"],
    "MAIN": ["--config", "configs/fedova_fmnist.yaml"],
    "FEDOV": ["--config", "configs/fedov_fmnist.yaml", "--partition.labels_per_client", "1"],
    # close-set voting in FEDOV's setting: its local objective is cross-entropy alone (a step's
    # arithmetic against FedOV's PROSER, destruction and FGSM passes)
    "CLOSESET": ["--config", "configs/fedov_fmnist.yaml", "--partition.labels_per_client", "1",
                 "--algorithm", "CloseSetVoting"],
    # FedOVA Table I on CIFAR-10 (VGG-11; images from --extra "--data.image_pack FILE" on a machine without them)
    "CIFAR_FEDOVA": ["--config", "configs/fedova_cifar.yaml", "--optimizer.lr", "0.01"],
    "CIFAR_FEDAVG": ["--config", "configs/fedavg_cifar.yaml", "--optimizer.lr", "0.01"],
    # ATHENA-FL on FMNIST (round 1: the MobileNet probe of all 50 clients; then the detector
    # rounds) and its FedAvg-MobileNet baseline (batch norm in the cohort)
    "ATHENA": ["--config", "configs/athena_fmnist.yaml"],
    "FEDAVG_MOBILENET": ["--config", "configs/fedavg_mobilenet_fmnist.yaml"],
    # FedKT's one shot, FedOV's Table 1 setting (#C=2): every party's s x t teachers, then its s
    # students, then the server's final model; local_epochs sets the teachers' epochs
    "FEDKT": ["--config", "configs/fedkt_oneshot_fmnist.yaml", "--partition.labels_per_client", "2"],
}
VARIANTS = {
    "cohort": ["--trainer.engine", "cohort"],
    "cohort_fp32": ["--trainer.engine", "cohort", "--trainer.precision", "32-true"],
    "cohort_eager": ["--trainer.engine", "cohort", "--trainer.cuda_graph", "false"],
    "cohort_cudnn_benchmark": ["--trainer.engine", "cohort", "--trainer.cudnn_benchmark", "true"],
    "cohort_no_compaction": ["--trainer.engine", "cohort"],  # and --no-compaction (main)
    "cohort_compiled": ["--trainer.engine", "cohort", "--trainer.compile", "true"],
    "per_client": ["--trainer.engine", "per_client"],
    "per_client_fp32": ["--trainer.engine", "per_client", "--trainer.precision", "32-true"],
    "plain": ["--trainer.engine", "per_client", "--trainer.precision", "32-true"],
}


def build_federation(args: list[str]):
    from fl_lightning.settings import build_federation as from_settings

    return from_settings(args, callbacks=[])[2]


def profile_hooks(fed, totals: dict) -> None:
    """Time (CUDA-synchronised) the parts of a round: where the seconds go."""
    import lightning.pytorch as pl
    import torch

    from fl_lightning.cohort import engine
    from fl_lightning.federation import Federation

    def timed(owner, name, label):
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            start = time.perf_counter()
            out = original(*args, **kwargs)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            totals[label] = totals.get(label, 0.0) + time.perf_counter() - start
            return out

        setattr(owner, name, wrapper)

    timed(engine, "build_plan", "plan")
    timed(engine.CohortRunner, "run", "steps (graph replays or eager)")
    timed(engine.CohortRunner, "_capture", "graph capture (in steps)")
    timed(engine.CohortTrainer, "train", "cohort train (all)")
    timed(pl.Trainer, "fit", "Trainer.fit (in cohort train)")
    timed(Federation, "evaluate", "evaluate")
    timed(fed.strategy, "aggregate", "aggregate")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="W1")
    ap.add_argument("--variant", choices=sorted(VARIANTS), default="cohort")
    ap.add_argument("--rounds", type=int, default=None, help="default: the config's")
    ap.add_argument("--extra", default="", help="more CLI overrides, e.g. '--trainer.cohort_size 100'")
    ap.add_argument("--out", required=True)
    ap.add_argument("--profile", action="store_true", help="time the parts of each round (synchronised)")
    ap.add_argument("--save-state", default=None, help="torch.save the final global state here (to compare variants)")
    ap.add_argument("--no-compaction", action="store_true",
                    help="cohorts keep their finished members to the end (the engine before compaction)")
    args = ap.parse_args()
    import torch

    args.no_compaction = args.no_compaction or args.variant == "cohort_no_compaction"
    if args.no_compaction:
        from fl_lightning.cohort import engine

        engine.COMPACT_SHARE = 0.0  # no cohort is ever left with at most none of its members

    run_dir = f"/tmp/cohort_bench/{args.workload}_{args.variant}_{os.getpid()}"
    cli = ["fit", *WORKLOADS[args.workload], *VARIANTS[args.variant], *args.extra.split(),
           "--run.logger", "none", "--run.progress", "false", "--run.checkpoint_every", "0", "--run.dir", run_dir]
    if args.rounds is not None:
        cli += ["--federation.rounds", str(args.rounds), "--federation.final_window", str(min(args.rounds, 20))]
    fed = build_federation(cli)
    fed.setup()  # data loading, partitioning and the transfer to the GPU are not timed
    gpu = torch.cuda.is_available()
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    totals: dict = {}
    if args.profile:
        profile_hooks(fed, totals)
    start = time.perf_counter()
    if args.variant == "plain":
        from bench.plain_loop import plain_federation

        rounds = args.rounds or fed.federation.rounds
        accuracies = plain_federation(fed, rounds)
        wall = time.perf_counter() - start
        per_round, first, train = [wall / rounds], None, None
        result = {"seconds_per_round": wall / rounds}
    else:
        summary = fed.fit()
        wall = time.perf_counter() - start
        history = summary["history"]
        accuracies = [m.get("test/accuracy") for m in history]
        per_round = [m["time/round_s"] for m in history]
        train = [m["time/train_s"] for m in history]
        first = per_round[0]
        later = per_round[1:] or per_round
        result = {"seconds_per_round": sum(later) / len(later),
                  "train_seconds_per_round": sum(train[1:] or train) / len(train[1:] or train),
                  "first_round_s": first, "final_accuracy": summary["final_accuracy"],
                  "train_loss_per_round": [m["train/loss"] for m in history],
                  "steps_per_round": [m["train/steps"] for m in history]}
    result.update({
        "workload": args.workload, "variant": args.variant, "command": " ".join(cli), "compaction": not args.no_compaction,
        "rounds": len(accuracies), "wall_s": wall, "accuracy_per_round": accuracies,
        "device": torch.cuda.get_device_name(0) if gpu else platform.processor() or platform.machine(),
        "peak_gpu_memory_mb": torch.cuda.max_memory_allocated() / 2**20 if gpu else None,
        "torch": torch.__version__,
    })
    if args.profile:
        result["profile_seconds_per_round"] = {k: v / len(accuracies) for k, v in totals.items()}
    if args.save_state:
        torch.save(dict(fed.state), args.save_state)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"{args.workload} {args.variant}: {result['seconds_per_round']:.3f} s/round, "
          f"accuracy {accuracies[-1]}, wall {wall:.1f} s, peak GPU {result['peak_gpu_memory_mb']}", flush=True)


if __name__ == "__main__":
    main()
