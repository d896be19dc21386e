import csv
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fl_lightning import report
from fl_lightning.cli import main
from tests.conftest import tiny_args

PNG = b"\x89PNG\r\n\x1a\n"
ROOT = Path(__file__).resolve().parents[1]


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


def test_smoothing_and_formats():
    assert report.smooth([5, 10, 15, 16], [1.0, 2.0, 3.0, 5.0]) == [1.5, 10 / 3, 4.0, 5.0]
    assert report.fmt_batch(0) == "full" and report.fmt_bytes(2_133_648) == "2.13 MB"


# ---- paper lines, seed bands, formats and ticks ---------------------------------------------
def edited_copy(src, dst, seed=None, accuracies=None, **settings):
    """A copy of run ``src`` whose summary has another seed, other per-round accuracies (and a
    final accuracy to match) or other settings ("federation.local_epochs": 5)."""
    shutil.copytree(src, dst)
    s = summary(dst)
    if seed is not None:
        s["config"]["seed"] = seed
    for dotted, value in settings.items():
        group, key = dotted.split(".")
        s["config"][group][key] = value
    if accuracies is not None:
        for m, a in zip(s["history"], accuracies):
            m["test/accuracy"] = a
        s["last_accuracy"] = accuracies[-1]
        s["final_accuracy"] = sum(accuracies[-s["final_window"]:]) / s["final_window"]
    (dst / "summary.json").write_text(json.dumps(s))
    return dst


def cells_with(tmp_path, runs_folder, paper_value=61.5):
    """A reproduction spec with one cell whose runs are ``runs_folder``."""
    spec = tmp_path / "cells.yaml"
    spec.write_text("cells:\n  - {id: ova, paper: 'FedOVA, Table I', data: SYN, setting: non-IID-2, method: FedOVA, "
                    f"paper_value: {paper_value}, paper_protocol: x, runs: {os.path.relpath(runs_folder, tmp_path)}}}\n")
    return report.load_reference_cells(spec)


def paper_lines(fig, value):
    return [line for line in fig.axes[0].lines if list(line.get_ydata()) == [value, value]]


def test_the_papers_line_is_drawn_only_for_a_run_with_the_cells_protocol(runs, tmp_path):
    (tmp_path / "cell").mkdir()
    shutil.copytree(runs / "ova", tmp_path / "cell" / "seed0")
    cells = cells_with(tmp_path, tmp_path / "cell")
    same = edited_copy(runs / "ova", tmp_path / "same", seed=7)  # another seed, same protocol
    other_e = edited_copy(runs / "ova", tmp_path / "e5", **{"federation.local_epochs": 5})
    other_rounds = edited_copy(runs / "ova", tmp_path / "r100", **{"federation.rounds": 100})
    other_model = edited_copy(runs / "ova", tmp_path / "h512", **{"model.hidden_units": 512})

    for run_dir, expected in ((same, [61.5]), (other_e, []), (other_rounds, []), (other_model, [])):
        rec = report.load_run(run_dir)
        assert [f.value for f in report.paper_figures(rec, cells)] == expected, run_dir.name
        assert report.row(rec, cells)["paper_accuracy"] == (expected[0] if expected else None)
        assert len(paper_lines(report.accuracy_figure([rec], cells), 61.5)) == len(expected), run_dir.name
    avg = report.load_run(runs / "avg")  # another algorithm
    assert report.paper_figures(avg, cells) == []

    rep = report.build_report([same, other_e], tmp_path / "rep", cells=tmp_path / "cells.yaml", plots=False)
    assert [r["paper_accuracy"] for r in rep.rows] == [61.5, None]


def test_runs_differing_only_in_seed_are_one_mean_line_with_a_std_band(runs, tmp_path):
    seeds = [[0.50, 0.60, 0.70], [0.60, 0.60, 0.90], [0.40, 0.75, 0.80]]
    group = [edited_copy(runs / "ova", tmp_path / f"seed{k}", seed=k, accuracies=acc) for k, acc in enumerate(seeds)]
    other = edited_copy(runs / "ova", tmp_path / "e5", seed=0, **{"federation.local_epochs": 5})
    records = [report.load_run(d) for d in [*group, other]]

    groups = report.seed_groups(records)
    assert [[r.run_dir.name for r in g] for g in groups] == [["seed0", "seed1", "seed2"], ["e5"]]
    rounds, mean, std = report.seed_band(groups[0])
    # by hand, round by round: mean of the three seeds and the sample std (n - 1 = 2)
    by_hand_mean = [50.0, 65.0, 80.0]
    by_hand_std = [math.sqrt((0 + 100 + 100) / 2), math.sqrt((25 + 25 + 100) / 2), math.sqrt((100 + 100 + 0) / 2)]
    assert rounds == [1, 2, 3]
    assert list(mean) == pytest.approx(by_hand_mean) and list(std) == pytest.approx(by_hand_std)

    fig = report.accuracy_figure(records)
    ax = fig.axes[0]
    mean_line = next(line for line in ax.lines if "3 seeds, mean ± std" in line.get_label())
    assert list(mean_line.get_ydata()) == pytest.approx(by_hand_mean)
    band = ax.collections[0].get_paths()[0].vertices  # fill_between: lower edge forth, upper edge back
    lows = {round(x): y for x, y in band[1:4]}
    highs = {round(x): y for x, y in band[5:8]}
    assert [lows[r] for r in rounds] == pytest.approx([m - s for m, s in zip(by_hand_mean, by_hand_std)])
    assert [highs[r] for r in rounds] == pytest.approx([m + s for m, s in zip(by_hand_mean, by_hand_std)])


def test_round_ticks_are_whole_rounds(runs):
    fig = report.accuracy_figure([report.load_run(runs / "ova")])
    fig.canvas.draw()
    ax = fig.axes[0]
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks)


def test_figures_are_written_as_png_and_vector_files(runs, tmp_path):
    rep = report.build_report([runs / "ova"], tmp_path / "rep", formats=("png", "pdf", "svg"))
    for path in rep.figures.values():
        assert path.read_bytes().startswith(PNG)
        assert path.with_suffix(".pdf").read_bytes().startswith(b"%PDF")
        assert b"<svg" in path.with_suffix(".svg").read_bytes()[:1000]
    from PIL import Image

    with Image.open(rep.figures["accuracy"]) as image:
        assert image.size == (8.5 * report.DPI, 5.2 * report.DPI) and report.DPI >= 200


def test_the_reproduction_figures_command_writes_them_and_lists_them_in_the_doc(runs, tmp_path):
    for k, acc in enumerate([[0.5, 0.6, 0.7], [0.6, 0.6, 0.9]]):
        edited_copy(runs / "ova", tmp_path / "cell" / f"seed{k}", seed=k, accuracies=acc)
    cells_with(tmp_path, tmp_path / "cell", paper_value=89.4)
    doc, readme = tmp_path / "docs" / "reproduction.md", tmp_path / "README.md"
    doc.parent.mkdir()
    from fl_lightning import reproduction as r

    doc.write_text(f"{r.HEADLINE_BEGIN}\n{r.HEADLINE_END}\n{r.BEGIN}\n{r.END}\n{r.FIGURES_BEGIN}\n{r.FIGURES_END}\n")
    readme.write_text(f"# x\n{r.SUMMARY_BEGIN}\n{r.SUMMARY_END}\n")

    done = subprocess.run([sys.executable, "-m", "fl_lightning", "report", "--reproduction", str(tmp_path / "cells.yaml"),
                           "--doc", str(doc), "--readme", str(readme), "--figures", str(tmp_path / "docs" / "figures"),
                           "--formats", "png,svg"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})

    assert done.returncode == 0, done.stderr
    figures = tmp_path / "docs" / "figures"
    assert sorted(p.name for p in figures.iterdir()) == ["fedova_cells.png", "fedova_cells.svg",
                                                         "fedova_table_i_rounds.png", "fedova_table_i_rounds.svg"]
    text = doc.read_text()
    assert "![FedOVA, Table I: accuracy per round](figures/fedova_table_i_rounds.png)" in text
    assert "[SVG](figures/fedova_table_i_rounds.svg)" in text
    assert "| FedOVA, Table I | SYN | non-IID-2 | FedOVA | 89.4 |" in text
    assert r.block(readme, r.SUMMARY_BEGIN, r.SUMMARY_END) == "- **FedOVA**: 1 of 1 cells run, 0 within 3 points of the paper.\n"
