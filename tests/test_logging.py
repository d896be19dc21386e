import csv
import json
import struct

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
    summary = main(["fit", *args])

    (run_file,) = (tmp_path / "wb" / "wandb").glob("offline-run-*/run-*.wandb")
    records = list(_wandb_records(run_file))
    history = [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
               for r in records if r.HasField("history")]
    logged = [h for h in history if "test/accuracy" in h]
    # the run's own numbers, as the summary has them, are in the file that `wandb sync` uploads
    assert [h["test/accuracy"] for h in logged] == [m["test/accuracy"] for m in summary["history"]]
    assert [h["bytes/up"] for h in logged] == [m["bytes/up"] for m in summary["history"]]
    assert any(h.get("summary/final_accuracy") == summary["final_accuracy"] for h in history)
    assert records[-1].HasField("exit")  # the run was finished, not left open


def _wandb_records(path):
    """The protobuf records of an offline W&B run file: LevelDB's log format (32 KiB blocks,
    each record a 7-byte header: CRC-32, little-endian length, type FULL/FIRST/MIDDLE/LAST)
    after W&B's 7-byte file header ":W&B", magic, version."""
    from wandb.proto import wandb_internal_pb2

    block, data = 32768, path.read_bytes()
    assert data[:4] == b":W&B"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            break
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL, or LAST of a split record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def _progress_output(tmp_path, mode, monkeypatch, ci=False):
    import io

    from fl_lightning.callbacks import ConsoleProgress
    from fl_lightning import federation as fed_module

    if ci:
        monkeypatch.setenv("CI", "true")
    else:
        monkeypatch.delenv("CI", raising=False)
    stream = io.StringIO()
    made = []
    original = fed_module.Federation.default_callbacks

    def with_progress(self):
        cbs = [cb for cb in original(self) if not isinstance(cb, ConsoleProgress)]
        made.append(ConsoleProgress(stream, mode))
        return cbs + made

    monkeypatch.setattr(fed_module.Federation, "default_callbacks", with_progress)
    main(["fit", *tiny_args(tmp_path, "--federation.rounds", "2")])
    return made[0], stream.getvalue()


def test_bar_progress_redraws_one_line(tmp_path, monkeypatch):
    progress, out = _progress_output(tmp_path, "bar", monkeypatch)
    assert progress.mode == "bar"
    assert out.count("clients 3/3") == 2  # the last client of each of the 2 rounds
    assert out.count("\n") == 2 and "round    2/2" in out and "run eta" in out  # one kept line per round


def test_progress_in_logs_and_under_ci_is_plain_rate_limited_lines(tmp_path, monkeypatch):
    for ci in (True, False):
        lines, out = _progress_output(tmp_path / str(ci), "auto", monkeypatch, ci=ci)
        # the first epoch's estimate, then (short rounds) one line per round
        assert lines.mode == "lines" and "\r" not in out and len(out.splitlines()) == 3
        assert "epoch 1/2" in out.splitlines()[0]
