"""experiments/diagnose_feddf.py measures the run it trains: its student is the run's result and
its averaged model is one-round FedAvg's (FedDF distils from FedAvg's average), scored on the
whole test set as FedAvg's run scores it."""

import json

import torch

from fl_lightning.checkpoint import load_checkpoint
from fl_lightning.cli import main
from tests.conftest import experiment_script, tiny_args


def test_feddf_diagnosis_measures_the_run_and_fedavgs_average(tmp_path):
    one_round = ("--federation.rounds", "1")
    measures, averaged, _ = experiment_script("diagnose_feddf").diagnose(
        tiny_args(tmp_path / "feddf", *one_round, "--algorithm", "FedDF", "--algorithm.distill_epochs", "2"))
    main(["fit", *tiny_args(tmp_path / "fedavg", *one_round, "--algorithm", "FedAvg")])

    summary = json.loads((tmp_path / "feddf" / "summary.json").read_text())
    assert abs(measures["distilled student (the run)"] - 100 * summary["last_accuracy"]) < 1e-4
    fedavg_summary = json.loads((tmp_path / "fedavg" / "summary.json").read_text())
    whole = measures["averaged model on the whole test set (FedAvg's cell)"]
    assert abs(whole - 100 * fedavg_summary["last_accuracy"]) < 1e-4
    fedavg_state = load_checkpoint(tmp_path / "fedavg" / "checkpoints" / "last.ckpt")["state"]
    assert set(averaged) == set(fedavg_state)
    assert all(torch.equal(averaged[k], fedavg_state[k]) for k in averaged)
    assert 0 <= measures["student = teacher on the public half"] <= 100
