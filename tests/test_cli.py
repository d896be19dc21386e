import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fl_lightning.cli import main
from tests.conftest import tiny_args


def accuracies(summary):
    return [m.get("test/accuracy") for m in summary["history"]]


def test_fit_through_the_cli_writes_summary_and_checkpoint(tmp_path):
    summary = main(["fit", *tiny_args(tmp_path / "run", "--federation.rounds", "2")])

    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert written["rounds"] == 2 and len(written["history"]) == 2
    assert written["final_accuracy"] == pytest.approx(sum(accuracies(summary)) / 2)
    assert written["config"]["federation"]["rounds"] == 2
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()
    assert (tmp_path / "run" / "partition.csv").is_file()
    h = written["history"][0]
    assert h["clients"] == 3 and h["bytes/up"] > 0 and "test/detector_acc/0" in h


def test_resumed_run_equals_uninterrupted_run(tmp_path):
    straight = main(["fit", *tiny_args(tmp_path / "a", "--federation.rounds", "4")])
    main(["fit", *tiny_args(tmp_path / "b", "--federation.rounds", "2")])
    resumed = main(["fit", *tiny_args(tmp_path / "b", "--federation.rounds", "4",
                                      "--ckpt_path", str(tmp_path / "b" / "checkpoints" / "last.ckpt"))])

    assert accuracies(resumed) == accuracies(straight)
    assert accuracies(straight)[-1] > 0.2  # it learned something, so the equality means something
    assert [m["train/loss"] for m in resumed["history"]] == [m["train/loss"] for m in straight["history"]]


def test_worker_processes_give_the_same_federation(tmp_path):
    one = main(["fit", *tiny_args(tmp_path / "one", "--federation.rounds", "2")])
    two = main(["fit", *tiny_args(tmp_path / "two", "--federation.rounds", "2", "--trainer.workers", "2")])
    assert accuracies(one) == accuracies(two)
    assert [m["train/loss"] for m in one["history"]] == [m["train/loss"] for m in two["history"]]


def test_fedavg_and_test_from_checkpoint(tmp_path, capsys):
    args = tiny_args(tmp_path / "avg", "--federation.rounds", "2", "--algorithm", "FedAvg")
    summary = main(["fit", *args])
    metrics = main(["test", *args, "--ckpt_path", str(tmp_path / "avg" / "checkpoints" / "last.ckpt")])
    assert metrics["test/accuracy"] == pytest.approx(summary["last_accuracy"])


@pytest.mark.parametrize(
    "override, message",
    [
        (["--federation.roundz", "3"], "roundz"),
        (["--federation.rounds", "three"], "federation.rounds"),
        (["--partition.scheme", "noniid"], "partition.scheme"),
    ],
)
def test_bad_settings_are_rejected_by_name(tmp_path, capsys, override, message):
    with pytest.raises(SystemExit):
        main(["fit", *tiny_args(tmp_path / "bad"), *override])
    assert message in capsys.readouterr().err


def test_bad_values_fail_with_the_setting_named(tmp_path):
    with pytest.raises(ValueError, match="federation.client_fraction"):
        main(["fit", *tiny_args(tmp_path / "bad", "--federation.client_fraction", "1.5")])
    with pytest.raises(ValueError, match="labels_per_client=2 x partition.num_clients=7"):
        main(["fit", *tiny_args(tmp_path / "bad", "--partition.num_clients", "7")])


def test_resuming_with_other_settings_is_refused(tmp_path):
    main(["fit", *tiny_args(tmp_path / "c", "--federation.rounds", "1")])
    with pytest.raises(ValueError, match="optimizer.lr"):
        main(["fit", *tiny_args(tmp_path / "c", "--federation.rounds", "2", "--optimizer.lr", "0.5",
                                "--ckpt_path", str(tmp_path / "c" / "checkpoints" / "last.ckpt"))])


def test_diverging_training_stops_with_the_learning_rate_named(tmp_path):
    with pytest.raises(FloatingPointError, match="optimizer.lr"):
        main(["fit", *tiny_args(tmp_path / "nan", "--federation.rounds", "2", "--optimizer.lr", "1e6")])


def test_a_run_told_to_stop_at_divergence_ends_there_and_keeps_its_summary(tmp_path):
    summary = main(["fit", *tiny_args(tmp_path / "nan", "--federation.rounds", "3", "--optimizer.lr", "1e6",
                                      "--federation.on_divergence", "stop")])

    saved = json.loads((tmp_path / "nan" / "summary.json").read_text())
    assert saved["diverged"]["round"] == 1 and "non-finite" in saved["diverged"]["reason"]
    assert saved["rounds"] == 0 and saved["history"] == [] and saved["final_accuracy"] is None
    assert summary["diverged"] == saved["diverged"]


# ---- validate/test take the checkpoint's settings (issue 40) -----------------------------------

REPO = Path(__file__).resolve().parents[1]


def cli_process(*argv, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "fl_lightning", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})


def test_test_of_a_checkpoint_needs_no_settings_and_writes_its_metrics(tmp_path):
    # settings far from the defaults: an algorithm setting, data set, clients, epochs, learning rate
    summary = main(["fit", *tiny_args(tmp_path / "avg", "--federation.rounds", "2", "--algorithm", "FedOVA",
                                      "--algorithm.weighted", "true", "--federation.local_epochs", "1",
                                      "--optimizer.lr", "0.1")])
    ckpt = tmp_path / "avg" / "checkpoints" / "last.ckpt"

    proc = cli_process("test", "--ckpt_path", str(ckpt), cwd=tmp_path)

    assert proc.returncode == 0, proc.stderr[-3000:]
    written = json.loads((tmp_path / "avg" / "test_metrics.json").read_text())
    last = summary["history"][-1]
    shared = [k for k in written if k.startswith("test/") and k in last]
    assert len(shared) == 11 and written["round"] == 2  # the accuracy and the ten detectors' accuracies
    assert {k: written[k] for k in shared} == pytest.approx({k: last[k] for k in shared})  # the same model
    assert written["ckpt_path"] == str(ckpt)
    assert f"metrics: {tmp_path / 'avg' / 'test_metrics.json'}" in proc.stdout


def test_a_flag_given_to_test_overrides_only_what_it_names(tmp_path):
    main(["fit", *tiny_args(tmp_path / "run", "--federation.rounds", "1", "--algorithm", "FedAvg")])
    ckpt = str(tmp_path / "run" / "checkpoints" / "last.ckpt")
    (tmp_path / "per_client.yaml").write_text("federation:\n  per_client_eval: true\n")

    whole = main(["test", "--ckpt_path", ckpt])
    flag = main(["test", "--ckpt_path", ckpt, "--federation.per_client_eval", "true"])
    config_file = main(["test", "--ckpt_path", ckpt, "--config", str(tmp_path / "per_client.yaml")])
    trained = main(["validate", "--ckpt_path", ckpt])

    assert "test/client_accuracy" not in whole and "test/client_accuracy" in flag and flag == config_file
    assert flag["test/accuracy"] == whole["test/accuracy"]  # everything else the checkpoint's
    saved = json.loads((tmp_path / "run" / "validate_metrics.json").read_text())
    assert saved["round"] == 1 and saved["train/accuracy"] == trained["train/accuracy"]
    with pytest.raises(ValueError, match="other settings.*partition.num_clients"):
        main(["test", "--ckpt_path", ckpt, "--partition.num_clients", "20"])


# ---- a typo: the error and a suggestion first --------------------------------------------------

@pytest.mark.parametrize("argv, error, suggestion", [
    (["fit", "--federation.roundz", "3"], "unrecognized arguments: --federation.roundz 3",
     "did you mean --federation.rounds?"),
    (["fitt"], "invalid choice: 'fitt'", "did you mean fit?"),
    (["test", "--algorithm", "FedAvgg"], 'Parser key "algorithm"', "did you mean FedAvg?"),
])
def test_a_typo_shows_the_error_and_a_suggestion_not_the_usage(argv, error, suggestion):
    proc = cli_process(*argv)

    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2
    assert lines[0].startswith("error:") and error in lines[0] and suggestion in lines
    assert "usage:" not in proc.stderr and lines[-1].startswith("tip: `fl_lightning")


def test_a_typo_in_a_config_file_is_answered_with_the_key_it_meant(tmp_path, capsys):
    (tmp_path / "bad.yaml").write_text("optimiser:\n  lr: 0.1\n")
    with pytest.raises(SystemExit) as stop:
        main(["fit", *tiny_args(tmp_path / "run"), "--config", str(tmp_path / "bad.yaml")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "did you mean --optimizer.lr?" in err


# ---- one public name per algorithm -------------------------------------------------------------

def test_print_config_and_help_name_the_algorithms_by_one_module(tmp_path, capsys):
    (tmp_path / "old.yaml").write_text("algorithm:\n  class_path: fl_lightning.strategies.FedProx\n")
    printed = []
    for extra in (["--config", str(tmp_path / "old.yaml")], ["--algorithm", "fl_lightning.strategies.FedProx"],
                  ["--algorithm", "FedProx"]):
        with pytest.raises(SystemExit):
            main(["fit", *extra, "--print_config"])
        printed.append(capsys.readouterr().out)
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    help_text = capsys.readouterr().out

    assert all("class_path: fl_lightning.algorithms.FedProx" in out for out in printed)
    assert "fl_lightning.algorithms.FedProx" in help_text and "fl_lightning.strategies" not in help_text
    summary = main(["fit", *tiny_args(tmp_path / "run", "--federation.rounds", "1"), "--config", str(tmp_path / "old.yaml")])
    assert summary["config"]["algorithm"]["class_path"] == "fl_lightning.algorithms.FedProx"
