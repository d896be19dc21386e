import csv
import json
import shutil

import pytest

from fl_lightning import report
from fl_lightning.cli import main
from tests.conftest import tiny_args

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two tiny 3-round fits: FedOVA (B=10) and FedAvg with the whole local set (B=0)."""
    root = tmp_path_factory.mktemp("runs")
    main(["fit", *tiny_args(root / "ova", "--federation.rounds", "3")])
    main(["fit", *tiny_args(root / "avg", "--federation.rounds", "3", "--algorithm", "FedAvg",
                            "--federation.batch_size", "0")])
    return root


def summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


def test_report_rows_equal_the_summaries_and_figures_are_written(runs, tmp_path):
    rep = main(["report", str(runs / "ova"), str(runs / "avg"), "--out", str(tmp_path / "rep")])

    rows = list(csv.DictReader(open(tmp_path / "rep.csv")))
    table = (tmp_path / "rep.md").read_text()
    for name, r, batch in (("ova", rows[0], "10"), ("avg", rows[1], "full")):
        s = summary(runs / name)
        assert r["run"] == name and r["method"] == s["algorithm"] and r["source"] == "summary.json"
        assert float(r["final_accuracy"]) == s["final_accuracy"]
        assert float(r["last_accuracy"]) == s["last_accuracy"]
        assert int(r["bytes_total"]) == s["bytes_total"] and int(r["rounds"]) == s["rounds"] == 3
        assert int(r["local_epochs"]) == s["config"]["federation"]["local_epochs"] == 2
        assert int(r["batch_size"]) == s["config"]["federation"]["batch_size"]
        assert float(r["wall_time_s"]) == s["wall_time_s"] and r["notes"] == ""
        line = next(line for line in table.splitlines() if line.startswith(f"| {name} |"))
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[1:10] == [s["algorithm"], "synthetic", "non_iid_l (l=2)", "10", "0.3", "2", batch, "3",
                               f"{100 * s['final_accuracy']:.2f} %"]
        assert cells[10] == f"{100 * s['last_accuracy']:.2f} %"
    assert "final acc. (last 2)" in table
    assert set(rep.figures) == {"accuracy", "detectors", "partition", "bytes"}  # detectors: the FedOVA run
    for path in rep.figures.values():
        data = path.read_bytes()
        assert data.startswith(PNG) and len(data) > 5000, path
        assert f"]({path.name})" in table


def test_report_from_a_checkpoint_only(runs, tmp_path):
    s = summary(runs / "ova")
    moved = tmp_path / "interrupted"
    shutil.copytree(runs / "ova", moved)  # elsewhere than the run.dir saved in its config
    (moved / "summary.json").unlink()

    rep = report.build_report([moved], tmp_path / "ckpt", plots=False)

    r = rep.rows[0]
    assert r["source"] == "checkpoint" and r["rounds"] == 3 and r["wall_time_s"] is None
    assert r["checkpoint_accuracy"] == pytest.approx(s["last_accuracy"], abs=1e-6)
    assert r["final_accuracy"] == pytest.approx(s["final_accuracy"], abs=1e-12)
    assert r["last_accuracy"] == s["last_accuracy"] and r["bytes_total"] == s["bytes_total"]
    assert r["method"] == "fedova"
    assert "checkpoint acc." in rep.markdown.read_text()


def test_a_summary_that_disagrees_with_its_history_is_flagged(runs, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(runs / "ova", bad)
    s = summary(bad)
    s["final_accuracy"] += 0.01
    (bad / "summary.json").write_text(json.dumps(s))
    rep = report.build_report([bad], tmp_path / "bad_report", plots=False)
    assert "final_accuracy" in rep.rows[0]["notes"]


def test_per_cluster_detectors_are_drawn(runs, tmp_path):
    """ATHENA-FL names its detectors by cluster and class (detector_acc/g<k>_c<c>)."""
    athena = tmp_path / "athena"
    shutil.copytree(runs / "ova", athena)
    s = summary(athena)
    for m in s["history"]:
        for key in [k for k in m if "/detector_acc/" in k]:
            c = int(key.rsplit("/", 1)[1])
            m[key.replace(f"/{c}", f"/g{c // 2}_c{c}")] = m.pop(key)
    (athena / "summary.json").write_text(json.dumps(s))

    rep = report.build_report([athena], tmp_path / "athena_report")

    assert rep.figures["detectors"].read_bytes().startswith(PNG)
    keys = sorted({k for m in s["history"] for k in m if k.startswith("test/detector_acc/")}, key=report._detector_id)
    assert keys[:3] == ["test/detector_acc/g0_c0", "test/detector_acc/g0_c1", "test/detector_acc/g1_c2"]
    assert report._detector_label(keys[2]) == "cluster 1, class 2"
    assert report._detector_label("test/detector_acc/7") == "class 7"
    with pytest.raises(ValueError, match="detector_acc/x"):
        report._detector_id("test/detector_acc/x")


def test_smoothing_and_paper_lookup():
    assert report.smooth([5, 10, 15, 16], [1.0, 2.0, 3.0, 5.0]) == [1.5, 10 / 3, 4.0, 5.0]
    assert report.PAPER_ACCURACY[("fedova", "fashion_mnist", "non_iid_l", 2)] == 89.4
    assert report.fmt_batch(0) == "full" and report.fmt_bytes(2_133_648) == "2.13 MB"
