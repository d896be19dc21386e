import json

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
