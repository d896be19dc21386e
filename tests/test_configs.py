"""Every shipped config still runs: each one, shrunk (synthetic data, 5 clients, 1 round of 1
local epoch), through the real CLI, ends with a summary and a finite training loss."""

import math
from pathlib import Path

import pytest

from fl_lightning.cli import main

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))

SHRINK = ["--data.name", "synthetic", "--data.synthetic_size", "300", "--partition.num_clients", "5",
          "--federation.rounds", "1", "--federation.local_epochs", "1", "--federation.client_fraction", "1.0",
          "--federation.final_window", "1", "--federation.eval_every", "1", "--run.logger", "none",
          "--run.progress", "false", "--trainer.workers", "1", "--trainer.threads", "1"]
# what the shrinking needs on top, per config: VGG-11 and ATHENA-FL's CNN pool five times
# (32x32; the synthetic images are 28x28), FedKT's and FedDF's server-side passes kept short
EXTRA = {
    "fedova_cifar": ["--data.image_size", "32"], "fedavg_cifar": ["--data.image_size", "32"],
    "athena_cifar": ["--data.image_size", "32"],
    "fedkt_oneshot_fmnist": ["--algorithm.student_epochs", "1", "--algorithm.final_epochs", "1"],
    "feddf_oneshot_fmnist": ["--algorithm.distill_epochs", "1"],
}
# ATHENA-FL's code reading augments image pixels, which synthetic data have none of: shrunk to
# the text's client data here; tests/test_athena_local_split.py runs the local split itself
EXTRA.update({f"{method}_{data}_code": ["--federation.local_split", "none"]
              for method in ("athena", "fedavg_mobilenet") for data in ("mnist", "fmnist", "cifar")})
EXTRA["athena_cifar_code"] += EXTRA["athena_cifar"]


def test_every_config_is_covered():
    assert len(CONFIGS) >= 30 and {c.stem for c in CONFIGS} >= set(EXTRA)


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_config_runs_shrunk(tmp_path, config):
    summary = main(["fit", "--config", str(config), *SHRINK, *EXTRA.get(config.stem, []), "--run.dir", str(tmp_path)])

    assert summary["rounds"] == 1 and (tmp_path / "summary.json").exists()
    losses = [m["train/loss"] for m in summary["history"]]
    assert losses and all(math.isfinite(x) for x in losses), losses
