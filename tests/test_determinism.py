"""Determinism: the same config and seed give identical metrics on a CPU, and summary.json
records what reproducing a run needs (resolved config with the seed; versions and git
commit from fl_lightning.provenance)."""

import json
import platform
import shutil
import subprocess
from pathlib import Path

import lightning
import pytest
import torch

import fl_lightning
from fl_lightning import cli
from fl_lightning.checkpoint import load_checkpoint
from fl_lightning.provenance import reproducibility_info
from tests.conftest import outcome, tiny_args

REPO = Path(__file__).resolve().parents[1]


def fit(run_dir, *extra):
    return cli.main(["fit", *tiny_args(run_dir, "--federation.rounds", "2", *extra)])


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    run = tmp_path_factory.mktemp("first")
    return run, fit(run)


def test_same_config_and_seed_give_identical_metrics_and_parameters(first, tmp_path):
    run, summary = first
    again = fit(tmp_path / "again")

    assert outcome(again) == outcome(summary)
    assert again["final_accuracy"] == summary["final_accuracy"] and summary["last_accuracy"] > 0.2
    a, b = load_checkpoint(run / "checkpoints" / "last.ckpt"), load_checkpoint(tmp_path / "again" / "checkpoints" / "last.ckpt")
    assert a["state"].keys() == b["state"].keys()
    assert all(torch.equal(a["state"][k], b["state"][k]) for k in a["state"])
    assert torch.equal(a["sampler_state"], b["sampler_state"])

    other_seed = fit(tmp_path / "seed1", "--seed", "1")  # so that the equality above means something
    assert outcome(other_seed) != outcome(summary)


def test_summary_config_alone_reproduces_the_run(first, tmp_path):
    run, summary = first
    written = json.loads((run / "summary.json").read_text())
    config = dict(written["config"])
    assert config["seed"] == 0
    config.pop("config", None)  # the --config files it was read from: everything is inlined
    config["run"] = {**config["run"], "dir": str(tmp_path / "replay")}
    (tmp_path / "replay.yaml").write_text(json.dumps(config))  # JSON is YAML

    replay = cli.main(["fit", "--config", str(tmp_path / "replay.yaml")])

    assert outcome(replay) == outcome(written)


def test_reproducibility_info_names_versions_and_commit():
    info = reproducibility_info()

    assert info["python"] == platform.python_version()
    assert info["torch"] == torch.__version__ and info["lightning"] == lightning.__version__
    assert info["fl_lightning"] == fl_lightning.__version__
    assert all(info[name] for name in ("numpy", "torchmetrics", "jsonargparse"))
    assert info["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert info["gpu"] is None or info["gpu"] == torch.cuda.get_device_name()
    json.dumps(info)  # it goes into summary.json
    head = None
    if shutil.which("git"):
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
        head = out.stdout.strip() if out.returncode == 0 else None
    assert info["git"]["commit"] == head
    assert info["git"]["dirty"] in ((True, False) if head else (None,))


def test_summary_json_records_versions_and_commit(first):
    run, _ = first
    written = json.loads((run / "summary.json").read_text())
    assert written["reproducibility"]["torch"] == torch.__version__
    assert written["reproducibility"]["git"]["commit"] == reproducibility_info()["git"]["commit"]
