"""experiments/diagnose_feddf.py measures the run it trains: its student is the run's result and
its averaged model is one-round FedAvg's (FedDF distils from FedAvg's average), scored on the
whole test set as FedAvg's run scores it; FedNova's server step on the same clients scores as
one-round FedNova's own run (its clients train as FedAvg's)."""

import json

import torch

from fl_lightning.checkpoint import load_checkpoint
from fl_lightning.cli import main
from tests.conftest import experiment_script, tiny_args


def test_feddf_diagnosis_measures_the_run_and_fedavgs_and_fednovas_servers(tmp_path):
    # SGD with momentum, the code reading's optimizer: FedNova's a_i then differs from its step count
    one_round = ("--federation.rounds", "1", "--optimizer.name", "sgd", "--optimizer.momentum", "0.9")
    measures, models, _ = experiment_script("diagnose_feddf").diagnose(
        tiny_args(tmp_path / "feddf", *one_round, "--algorithm", "FedDF", "--algorithm.distill_epochs", "2"))
    main(["fit", *tiny_args(tmp_path / "fedavg", *one_round, "--algorithm", "FedAvg")])
    main(["fit", *tiny_args(tmp_path / "fednova", *one_round, "--algorithm", "FedNova")])

    summary = json.loads((tmp_path / "feddf" / "summary.json").read_text())
    assert abs(measures["distilled student (the run)"] - 100 * summary["last_accuracy"]) < 1e-4
    fedavg_summary = json.loads((tmp_path / "fedavg" / "summary.json").read_text())
    whole = measures["averaged model on the whole test set (FedAvg's cell)"]
    assert abs(whole - 100 * fedavg_summary["last_accuracy"]) < 1e-4
    for name in ("fedavg", "fednova"):
        run_state = load_checkpoint(tmp_path / name / "checkpoints" / "last.ckpt")["state"]
        assert set(models[name]) == set(run_state)
        assert all(torch.equal(models[name][k], run_state[k]) for k in run_state), name
    # the two servers differ here (unequal step counts, momentum), so the check above tells them apart
    assert any(not torch.equal(models["fedavg"][k], models["fednova"][k]) for k in models["fedavg"])
    assert 0 <= measures["student = teacher on the public half"] <= 100
    fednova_summary = json.loads((tmp_path / "fednova" / "summary.json").read_text())
    nova = measures["FedNova's server on the same clients, whole test set (FedNova's cell)"]
    assert abs(nova - 100 * fednova_summary["last_accuracy"]) < 1e-4
