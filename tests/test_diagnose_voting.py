"""experiments/diagnose_voting.py reads a finished one-shot run's checkpoint back: its
per-class rows agree with what the run itself measured (summary.json's per-class accuracy and
confusion matrix), and each class's holders are the clients whose shard holds it."""

import json

import pytest

from fl_lightning.cli import main
from tests.conftest import experiment_script, tiny_args

ONE_SHOT = ["--algorithm", "FedOV", "--model.architecture", "simple_cnn", "--federation.rounds", "1",
            "--federation.client_fraction", "1.0", "--federation.local_epochs", "1", "--federation.batch_size", "32",
            "--federation.final_window", "1", "--optimizer.name", "adam", "--optimizer.lr", "0.001"]


def test_per_class_rows_match_the_runs_own_per_class_accuracy_and_confusion(tmp_path):
    run = tmp_path / "run"
    main(["fit", *tiny_args(run, *ONE_SHOT)])
    script = experiment_script("diagnose_voting")
    summary = json.loads((run / "summary.json").read_text())
    measured = summary["test_classes"]
    _, _, held, _ = script.member_outputs(run)

    rows = script.per_class(run)
    assert script.diagnose(run)["accuracy"] == pytest.approx(summary["last_accuracy"], abs=1e-6)
    assert [r["class"] for r in rows] == list(range(len(measured["accuracy"])))
    for r in rows:
        c, confusion = r["class"], measured["confusion"][r["class"]]
        assert r["accuracy"] == pytest.approx(measured["accuracy"][c], abs=1e-6)
        others = {k: v for k, v in enumerate(confusion) if k != c and v > 0}
        if others:  # the most frequent wrong class is the confusion row's largest off-diagonal entry
            assert confusion[r["wrong_class"]] == max(others.values())
            assert r["share_to_w"] == pytest.approx(confusion[r["wrong_class"]] / sum(confusion), abs=1e-6)
        else:
            assert r["wrong_class"] is None
        assert set(r["holders_c"]) == {m for m in range(held.shape[0]) if held[m, c]}
        assert all(0 <= p <= 1 and 0 <= unknown <= 1 for p, unknown in r["holders_c"].values())


def test_a_folder_without_its_checkpoint_is_refused_by_name(tmp_path, capsys):
    (tmp_path / "summary.json").write_text("{}")  # what a committed reproduction folder keeps
    with pytest.raises(SystemExit) as stopped:
        experiment_script("diagnose_voting").main(["--per-class", str(tmp_path)])
    assert stopped.value.code == 2
    assert f"{tmp_path} is not a finished run's --run.dir: it lacks checkpoints/last.ckpt" in capsys.readouterr().err
