"""Cohort vs per-client engine on one machine (synthetic data, 2 rounds): for every cohort
plug-in (FedOVA's detectors, the FedAvg family's classifier, FedOV's open-set client) the
difference of the final parameters relative to the update, in fp32 and bf16-mixed, both
engines' per-round metrics, as JSON; exits 1 naming every case past its tolerance.

TF32 is off and the network is the smoothed simple CNN (tests/conftest.py's ``smoothed``: softplus
and average pooling), so that rounding differences of differently ordered sums stay at rounding
level instead of flipping ReLU kinks: a difference past the tolerance is then a bug, not noise.

    python bench/cohort_equivalence.py --accelerator gpu --out equivalence.json

--cohort-extra adds overrides to the cohort engine's runs only, e.g. "--trainer.compile true"
(the compiled step against the per-client reference).
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
    "fedov_one_shot": ["--algorithm", "FedOV", "--federation.rounds", "1", "--partition.scheme", "dirichlet"],
    # FIM-L-BFGS's client optimizer and the curvature probes (damping 1: at 1e-3 a detector whose
    # Fisher is near 0 lets L-BFGS amplify rounding by itself, tests/test_cohort_fimlbfgs.py)
    "fedavg_fim_lbfgs": ["--algorithm", "FedAvg", "--optimizer.name", "fim_lbfgs", "--optimizer.lr", "0.1",
                         "--optimizer.max_step_norm", "1.0", "--optimizer.damping", "1.0", "--partition.scheme", "dirichlet"],
    "fedova_fim_lbfgs": ["--algorithm", "FedOVA", "--optimizer.name", "fim_lbfgs", "--optimizer.lr", "0.1",
                         "--optimizer.max_step_norm", "1.0", "--optimizer.damping", "1.0", "--partition.scheme", "dirichlet"],
    "fimlbfgs_probes": ["--algorithm", "FIMLBFGS", "--algorithm.step_size", "0.05", "--algorithm.damping", "1.0",
                        "--algorithm.max_step_norm", "1.0", "--partition.scheme", "dirichlet"],
    "feddane_probes": ["--algorithm", "FedDANE", "--algorithm.mu", "0.1", "--partition.scheme", "dirichlet"],
    "fedkt_one_shot": ["--algorithm", "FedKT", "--algorithm.student_epochs", "2", "--algorithm.final_epochs", "1",
                       "--federation.rounds", "1", "--federation.client_fraction", "1.0", "--partition.scheme", "dirichlet"],
}
# |cohort - per client| / |update|: fp32 is rounding (CPU: below 1e-5); bf16-mixed differs by bf16
# rounding of differently ordered sums (CPU: 0.35-1.3 %, tests/test_cohort.py)
TOLERANCE = {"32-true": 1e-4, "bf16-mixed": 0.03}
# Adam divides by sqrt(v): the rounding noise of gradient entries near zero becomes steps of ~lr
# (CPU: 1.8e-5 in fp32, 4.4 % in bf16-mixed)
ADAM_FACTOR = 4


def tiny(run_dir: str, *extra: str) -> list[str]:
    return ["fit", "--data.name", "synthetic", "--data.synthetic_size", "600", "--partition.num_clients", "10",
            "--federation.client_fraction", "0.3", "--federation.local_epochs", "2", "--federation.batch_size", "10",
            "--federation.rounds", "2", "--federation.final_window", "2", "--model.architecture", "simple_cnn",
            "--run.logger", "none", "--run.progress", "false", "--run.dir", run_dir, *extra]


def main() -> None:
    import torch

    from fl_lightning.models.architectures import ARCHITECTURES, SimpleCNN
    from fl_lightning.settings import build_federation
    from tests.conftest import smoothed

    ap = argparse.ArgumentParser()
    ap.add_argument("--accelerator", default="cpu")
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="", help="run the cases whose name contains this")
    ap.add_argument("--cohort-extra", default="", help="more overrides for the cohort engine's runs")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    ARCHITECTURES["simple_cnn"] = lambda **kwargs: smoothed(SimpleCNN(**kwargs))
    bf16 = args.accelerator == "cpu" or torch.cuda.is_bf16_supported()
    report = {"device": torch.cuda.get_device_name(0) if args.accelerator == "gpu" else "cpu", "tolerance": TOLERANCE,
              "cohort_extra": args.cohort_extra, "cases": {}}
    failed = []
    for name, extra in CASES.items():
        for precision in ("32-true", "bf16-mixed") if bf16 else ("32-true",):
            if args.only not in f"{name} {precision}":
                continue
            runs = {}
            for engine in ("per_client", "cohort"):
                run_dir = tempfile.mkdtemp(prefix=f"eq_{name}_{engine}_")
                fed = build_federation(tiny(run_dir, *extra, "--trainer.accelerator", args.accelerator,
                                            "--trainer.precision", precision, "--trainer.engine", engine,
                                            *(args.cohort_extra.split() if engine == "cohort" else [])),
                                       callbacks=[])[2]
                fed.setup()
                start = {k: v.float().cpu() for k, v in fed.state.items()}
                summary = fed.fit()
                runs[engine] = ({k: v.float().cpu() for k, v in fed.state.items()},
                                [{k: m[k] for k in ("train/loss", "train/steps", "test/accuracy", "bytes/up")}
                                 for m in summary["history"]])
            a, b = runs["per_client"][0], runs["cohort"][0]
            update = torch.cat([(a[k] - start[k]).flatten() for k in a]).norm()
            error = torch.cat([(b[k] - a[k]).flatten() for k in a]).norm()
            relative = float(error / update)
            tolerance = TOLERANCE[precision] * (ADAM_FACTOR if "adam" in name else 1)
            ok = relative < tolerance and [m["train/steps"] for m in runs["per_client"][1]] == [
                m["train/steps"] for m in runs["cohort"][1]]
            report["cases"][f"{name}/{precision}"] = {
                "relative_difference": relative, "tolerance": tolerance, "max_param_diff": max((a[k] - b[k]).abs().max().item() for k in a),
                "within_tolerance": ok, "per_client": runs["per_client"][1], "cohort": runs["cohort"][1]}
            print(f"{name} {precision}: |cohort - per client| / |update| = {relative:.2e} ({'ok' if ok else 'FAILED'})",
                  flush=True)
            if not ok:
                failed.append(f"{name}/{precision}")
    Path(args.out).write_text(json.dumps(report, indent=1))
    if failed:
        print(f"engines disagree past the tolerance: {', '.join(failed)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
