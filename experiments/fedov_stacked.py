"""FedOV's Table 1 cells (FedOV and close-set voting) over seeds, stacked: the runs of a data
set and partition trained together on one GPU (``sweep --stack``'s engine, fl_lightning/stacking.py), into
the folders experiments/reproduction.sh uses (reports/reproduction/runs/<data>_<part>_<method>
<reading tag><E tag>/seed<S>), so the reproduction table reads them as it reads the runs made
one at a time. Finished runs are skipped; a run stopped with a checkpoint resumes; a run's
folder keeps only its summary.json once it is done. One stack per cell, a data set and partition
(a call that a deadline stops loses only the stack it was training; on an H200 a run at E = 200
takes 110 s, two seeds stacked 143 s, docs/performance.md), or with --stack-by data one per data
set: fewer, larger stacks that save only a step's fixed cost (a member-step costs the same at
any stack size, and a cohort runs its largest client's steps) and lose more to a deadline.

    python experiments/fedov_stacked.py --epochs 200 --seeds 0 1 2 --extra "--trainer.accelerator gpu"
    python experiments/fedov_stacked.py --data cifar --parts C2 --cifar-pack .gpucifar/cifar10_q75.npz ...

Called by experiments/reproduction_gpu.sh (TASKS=fedov). Without the cohort engine (a CPU,
unless --extra names --trainer.engine cohort) the runs train one after another.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PARTITIONS = {  # experiments/reproduction.sh's C1, C2, C3, D05, D01 (Table 1's five columns)
    "C1": ["--partition.scheme", "num_labels", "--partition.labels_per_client", "1"],
    "C2": ["--partition.scheme", "num_labels", "--partition.labels_per_client", "2"],
    "C3": ["--partition.scheme", "num_labels", "--partition.labels_per_client", "3"],
    "D05": ["--partition.scheme", "dirichlet", "--partition.dirichlet_beta", "0.5"],
    "D01": ["--partition.scheme", "dirichlet", "--partition.dirichlet_beta", "0.1"],
}
METHODS = {"fedov": [], "closeset": ["--algorithm", "CloseSetVoting"]}


def configurations(data: str, parts, methods, seeds, epochs: int, reading_tag: str, runs_root: Path, extra,
                   cifar_pack: Optional[Path] = None):
    """The runs of one data set; ``cifar_pack``: CIFAR-10's images as a data.image_pack file (a
    machine without shared/data's copy: the GPU machine), for the cifar runs."""
    from fl_lightning.sweep import Configuration

    e_tag = "" if epochs == 20 else f"_e{epochs}"
    configs = []
    for part in parts:
        for method in methods:
            for seed in seeds:
                name = f"{data}_{part}_{method}{reading_tag}{e_tag}"
                run_dir = runs_root / name / f"seed{seed}"
                args = ["--config", str(ROOT / "configs" / f"fedov_{data}.yaml"), *PARTITIONS[part], *METHODS[method],
                        "--federation.local_epochs", str(epochs), "--run.checkpoint_clients", "true",
                        "--seed", str(seed), "--run.logger", "none", "--federation.on_divergence", "stop",
                        *(["--data.image_pack", str(cifar_pack)] if data == "cifar" and cifar_pack else []),
                        *extra, "--run.dir", str(run_dir)]
                configs.append(Configuration(values={"cell": name, "seed": seed}, name=f"{name}/seed{seed}",
                                             run_dir=run_dir, args=args))
    return configs


def stack_groups(data_sets, parts, stack_by: str) -> list[tuple[str, list[str]]]:
    """The (data set, partitions) of each stack, in the order they train."""
    if stack_by == "cell":
        return [(data, [part]) for data in data_sets for part in parts]
    return [(data, list(parts)) for data in data_sets]


def keep_summaries_only(configs) -> None:
    for config in configs:
        if config.status in ("done", "resumed") and (config.run_dir / "summary.json").is_file():
            for path in config.run_dir.iterdir():
                if path.name != "summary.json":
                    shutil.rmtree(path) if path.is_dir() else path.unlink()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=200, help="local epochs E (paper: 200)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--data", nargs="+", default=["fmnist", "mnist"], choices=("fmnist", "mnist", "cifar"))
    parser.add_argument("--cifar-pack", type=Path, default=None,
                        help="CIFAR-10 as a data.image_pack file, for the cifar runs (python -m fl_lightning.data.image_pack)")
    parser.add_argument("--parts", nargs="+", default=["C1", "C2", "D05"], choices=list(PARTITIONS))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--reading-tag", default="_code", help="as experiments/reproduction.sh's READING_TAG")
    parser.add_argument("--runs-root", type=Path, default=ROOT / "reports" / "reproduction" / "runs")
    parser.add_argument("--stack-by", choices=("cell", "data"), default="cell",
                        help="one stack per cell (data set and partition) or per data set (fewer, larger stacks)")
    parser.add_argument("--extra", default="", help="settings added to every run (e.g. --trainer.accelerator gpu)")
    args = parser.parse_args(argv)

    from fl_lightning.interrupts import RunInterrupted, stop_on_signals, stopped_line
    from fl_lightning.sweep import run_configurations, target_rounds

    failed = []
    try:
        with stop_on_signals():  # Ctrl-C and SIGTERM stop the stack as they stop a fit (and a shell's & cannot mute them)
            for data, parts in stack_groups(args.data, args.parts, args.stack_by):  # a stack's runs share the data
                configs = configurations(data, parts, args.methods, args.seeds, args.epochs, args.reading_tag,
                                         args.runs_root, shlex.split(args.extra), args.cifar_pack)
                run_configurations(configs, [target_rounds(c.args) for c in configs], stack="grouped")
                keep_summaries_only(configs)
                failed += [c.name for c in configs if c.status == "failed"]
    except RunInterrupted as stop:
        command = shlex.join(["python", "experiments/fedov_stacked.py", *(sys.argv[1:] if argv is None else argv)])
        print(f"fedov_stacked: {stopped_line(stop, [])}; finished runs are kept: run the same command to go on: "
              f"{command}", file=sys.stderr, flush=True)
        return stop.exit_status
    if failed:
        print(f"{len(failed)} runs failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
