import csv

from fl_lightning.cli import main
from tests.conftest import tiny_args


def test_csv_logger_writes_one_row_per_round(tmp_path):
    args = tiny_args(tmp_path / "csv", "--federation.rounds", "2")
    args[args.index("--run.logger") + 1] = "csv"
    summary = main(["fit", *args])

    rows = list(csv.DictReader(open(tmp_path / "csv" / "metrics" / "metrics.csv")))
    per_round = [r for r in rows if r.get("test/accuracy")]
    assert [float(r["test/accuracy"]) for r in per_round] == [m["test/accuracy"] for m in summary["history"]]


def test_wandb_offline_run_is_kept_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    args = tiny_args(tmp_path / "wb", "--federation.rounds", "1")
    args[args.index("--run.logger") + 1] = "wandb"
    main(["fit", *args])
    assert list((tmp_path / "wb" / "wandb").glob("offline-run-*"))
