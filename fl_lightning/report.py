"""``python -m fl_lightning report RUN_DIR... [--out reports/NAME] [--evaluate-checkpoints]``
(or ``report --reproduction CELLS_YAML [--readme README.md]``: the paper-cell table of
fl_lightning/reproduction.py)

One table row per run directory (``summary.json``, or only ``checkpoints/last.ckpt`` of an
unfinished run) written as ``NAME.md`` and ``NAME.csv``, and four PNG figures beside them:
``NAME_accuracy.png`` (test accuracy per round), ``NAME_detectors.png`` (FedOVA's per-detector
accuracy), ``NAME_partition.png`` (clients x classes heat map) and ``NAME_bytes.png``
(accuracy against cumulative bytes exchanged). A run directory without a summary, or every
run with ``--evaluate-checkpoints``, is re-evaluated on the test set from its checkpoint
(``checkpoint_accuracy``).
"""

from __future__ import annotations

import argparse
import csv
import importlib
import json
import math
import re
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from fl_lightning.per_client_eval import INTERVAL, client_accuracy_summary

# Published accuracies (%), keyed by (algorithm, data set, partition scheme, labels per client).
# Source: Zhu et al., "FedOVA: One-vs-All Training Method for Federated Learning with Non-IID
# Data", IJCNN 2021, Table I (Fashion-MNIST, non-IID-2, K=100, C=0.2, E=5, B=15). Runs with
# data sharing (partition.share_fraction > 0) are a different method and get no figure here.
PAPER_ACCURACY: dict[tuple[str, str, str, int], float] = {
    ("fedova", "fashion_mnist", "non_iid_l", 2): 89.4,
    ("fedavg", "fashion_mnist", "non_iid_l", 2): 84.3,
}

SMOOTH_ROUNDS = 10  # the paper's curves: value at round t = mean of rounds t..t+9
SMOOTH_ROUNDS_FROM = 3 * SMOOTH_ROUNDS  # runs shorter than this are plotted unsmoothed
MAX_DETECTOR_PANELS = 6
MAX_PARTITION_PANELS = 4
MAX_HEATMAP_CLIENTS = 100

CSV_COLUMNS = ["run", "method", "dataset", "partition", "labels_per_client", "dirichlet_beta", "share_fraction",
               "num_clients", "client_fraction", "local_epochs", "batch_size", "rounds", "final_window",
               "final_accuracy", "last_accuracy", "client_accuracy", "client_accuracy_ci95", "clients_evaluated",
               "checkpoint_accuracy", "paper_accuracy", "bytes_total", "wall_time_s", "source", "notes"]


@dataclass
class RunRecord:
    run_dir: Path
    source: str  # "summary.json" | "checkpoint"
    algorithm: str
    config: dict
    history: list[dict]
    rounds: int
    final_accuracy: Optional[float]
    final_window: int
    last_accuracy: Optional[float]
    bytes_total: int
    wall_time_s: Optional[float]
    checkpoint_accuracy: Optional[float] = None
    notes: list[str] = field(default_factory=list)
    diverged: Optional[dict] = None  # {"round", "reason"}: every client diverged there (on_divergence=stop)

    @property
    def checkpoint(self) -> Path:
        return self.run_dir / "checkpoints" / "last.ckpt"

    def setting(self, group: str, key: str, default: Any = None) -> Any:
        return (self.config.get(group) or {}).get(key, default)


@dataclass
class Report:
    runs: list[RunRecord]
    rows: list[dict[str, Any]]
    markdown: Path
    csv: Path
    figures: dict[str, Path]


# ---- reading runs ----------------------------------------------------------------------------
def evaluated(history: list[dict], key: str = "test/accuracy") -> tuple[list[int], list[float]]:
    pairs = [(int(m["round"]), float(m[key])) for m in history if m.get(key) is not None]
    return [r for r, _ in pairs], [a for _, a in pairs]


def final_from_history(history: list[dict], window: int) -> tuple[Optional[float], int, Optional[float]]:
    """(final accuracy = mean of the last ``window`` evaluated rounds, points used, last accuracy),
    as ``Federation.summary`` computes them."""
    _, acc = evaluated(history)
    tail = acc[-window:]
    return (float(np.mean(tail)) if tail else None), len(tail), (acc[-1] if acc else None)


def bytes_from_history(history: list[dict]) -> int:
    return int(sum(m.get("bytes/down", 0) + m.get("bytes/up", 0) for m in history))


def algorithm_name(config: dict) -> str:
    """The strategy's short name (``Strategy.name``, as in summary.json) from its class path."""
    class_path = str((config.get("algorithm") or {}).get("class_path", "unknown"))
    module, _, cls = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module or "fl_lightning.strategies"), cls).name
    except (ImportError, AttributeError):
        return cls.lower()


def is_run_dir(path: Path) -> bool:
    return (path / "summary.json").is_file() or (path / "checkpoints" / "last.ckpt").is_file()


def _natural(text: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text)]


def expand_run_dirs(paths: list[str | Path]) -> list[Path]:
    """Run directories as given; a folder holding run directories (a sweep's folder) stands
    for its run directories in natural order (E=2 before E=10)."""
    out = []
    for p in map(Path, paths):
        if is_run_dir(p):
            out.append(p)
        elif p.is_dir() and any(is_run_dir(c) for c in p.iterdir()):
            out += sorted((c for c in p.iterdir() if is_run_dir(c)), key=lambda c: _natural(c.name))
        else:
            raise FileNotFoundError(f"{p}: neither summary.json nor checkpoints/last.ckpt (nor run directories inside)")
    return out


def load_run(run_dir: str | Path) -> RunRecord:
    run_dir = Path(run_dir)
    summary_path = run_dir / "summary.json"
    if summary_path.is_file():
        s = json.loads(summary_path.read_text())
        config, history = s.get("config") or {}, s.get("history") or []
        record = RunRecord(run_dir, "summary.json", s.get("algorithm") or algorithm_name(config), config, history,
                           int(s["rounds"]), s.get("final_accuracy"), int(s.get("final_window") or 0),
                           s.get("last_accuracy"), int(s.get("bytes_total") or 0), s.get("wall_time_s"),
                           diverged=s.get("diverged"))
        if record.diverged:
            record.notes.append(f"diverged in round {record.diverged['round']}: no final accuracy")
        check_summary(record)
        return record
    from fl_lightning.checkpoint import load_checkpoint

    ckpt = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")
    config, history = ckpt["config"], list(ckpt["history"])
    window = int((config.get("federation") or {}).get("final_window", 20))
    final, used, last = final_from_history(history, window)
    return RunRecord(run_dir, "checkpoint", algorithm_name(config), config, history, int(ckpt["round"]), final, used,
                     last, bytes_from_history(history), None,
                     notes=[f"no summary.json: values from the checkpoint (round {ckpt['round']})"])


def check_summary(record: RunRecord) -> None:
    """Recompute final/last accuracy and bytes from the per-round history and note any
    disagreement with summary.json."""
    window = int(record.setting("federation", "final_window", record.final_window or 20))
    final, _, last = final_from_history(record.history, window)
    if record.diverged:
        final = None  # a diverged run has none, whatever the rounds before it scored
    for name, stored, recomputed in (("final_accuracy", record.final_accuracy, final),
                                     ("last_accuracy", record.last_accuracy, last),
                                     ("bytes_total", record.bytes_total, bytes_from_history(record.history))):
        same = (stored is None and recomputed is None) or (
            stored is not None and recomputed is not None and math.isclose(stored, recomputed, rel_tol=1e-9, abs_tol=1e-12))
        if not same:
            record.notes.append(f"summary {name} {stored} != {recomputed} recomputed from history")
            print(f"warning: {record.run_dir}: {record.notes[-1]}", file=sys.stderr)
    if len(record.history) != record.rounds:
        record.notes.append(f"history holds {len(record.history)} rounds, summary says {record.rounds}")


def evaluate_checkpoint(run_dir: str | Path, config: Optional[dict] = None) -> float:
    """Test accuracy of ``<run_dir>/checkpoints/last.ckpt``: the Federation of the configuration
    saved in the checkpoint (run.dir pointed at where the run is now), restored and evaluated."""
    import torch

    from fl_lightning.checkpoint import load_checkpoint
    from fl_lightning.settings import evaluate_checkpoint as evaluate, federation_from_config

    ckpt_path = Path(run_dir) / "checkpoints" / "last.ckpt"
    if config is None:
        config = load_checkpoint(ckpt_path)["config"]
    cfg = {k: v for k, v in config.items() if k not in ("config", "__path__", "ckpt_path")}
    cfg["run"] = {**(cfg.get("run") or {}), "dir": str(run_dir), "logger": "none", "progress": False}
    if (cfg.get("trainer") or {}).get("accelerator") == "gpu" and not torch.cuda.is_available():
        cfg["trainer"] = {**cfg["trainer"], "accelerator": "cpu"}
    metrics = evaluate(federation_from_config(cfg), ckpt_path, "test")
    return float(metrics["test/accuracy"])


# ---- the table -------------------------------------------------------------------------------
def paper_accuracy(record: RunRecord) -> Optional[float]:
    if record.setting("partition", "share_fraction", 0.0):
        return None
    key = (record.algorithm, record.setting("data", "name"), record.setting("partition", "scheme"),
           record.setting("partition", "labels_per_client"))
    return PAPER_ACCURACY.get(key)


def partition_text(record: RunRecord) -> str:
    scheme = record.setting("partition", "scheme", "?")
    text = {"non_iid_l": f"non_iid_l (l={record.setting('partition', 'labels_per_client')})",
            "num_labels": f"num_labels (#C={record.setting('partition', 'labels_per_client')})",
            "dirichlet": f"dirichlet (β={record.setting('partition', 'dirichlet_beta')})"}.get(scheme, scheme)
    share = record.setting("partition", "share_fraction", 0.0)
    return text + (f" + sharing {share:g}" if share else "")


def row(record: RunRecord) -> dict[str, Any]:
    window = int(record.setting("federation", "final_window", record.final_window or 20))
    clients = client_accuracy_summary(record.history, window) or {}
    return {
        "run": record.run_dir.name,
        "method": record.algorithm,
        "dataset": record.setting("data", "name"),
        "partition": record.setting("partition", "scheme"),
        "labels_per_client": record.setting("partition", "labels_per_client"),
        "dirichlet_beta": record.setting("partition", "dirichlet_beta"),
        "share_fraction": record.setting("partition", "share_fraction"),
        "num_clients": record.setting("partition", "num_clients"),
        "client_fraction": record.setting("federation", "client_fraction"),
        "local_epochs": record.setting("federation", "local_epochs"),
        "batch_size": record.setting("federation", "batch_size"),
        "rounds": record.rounds,
        "final_window": record.final_window,
        "final_accuracy": record.final_accuracy,
        "last_accuracy": record.last_accuracy,
        # federation.per_client_eval: the last evaluation's mean over clients and 95 % half width
        "client_accuracy": clients.get("mean"),
        "client_accuracy_ci95": clients.get("half_width"),
        "clients_evaluated": clients.get("clients"),
        "checkpoint_accuracy": record.checkpoint_accuracy,
        "paper_accuracy": paper_accuracy(record),
        "bytes_total": record.bytes_total,
        "wall_time_s": record.wall_time_s,
        "source": record.source,
        "notes": "; ".join(record.notes),
    }


def fmt_acc(value: Optional[float]) -> str:
    return "—" if value is None else f"{100 * value:.2f} %"


def fmt_interval(mean: Optional[float], half: Optional[float]) -> str:
    if mean is None:
        return "—"
    return fmt_acc(mean) if half is None or math.isnan(half) else f"{100 * mean:.2f} ± {100 * half:.2f} %"


def fmt_bytes(value: Optional[float]) -> str:
    if value is None:
        return "—"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= size:
            return f"{value / size:.2f} {unit}"
    return f"{int(value)} B"


def fmt_seconds(value: Optional[float]) -> str:
    if value is None:
        return "—"
    if value < 120:
        return f"{value:.1f} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.2f} h"


def fmt_batch(value: Any) -> str:
    return "full" if value == 0 else str(value)


def markdown_table(records: list[RunRecord], rows: list[dict[str, Any]], figures: dict[str, Path]) -> str:
    with_ckpt = any(r["checkpoint_accuracy"] is not None for r in rows)
    with_clients = any(r["client_accuracy"] is not None for r in rows)
    windows = sorted({r["final_window"] for r in rows})
    head = ["run", "method", "data set", "partition", "K", "C", "E", "B", "rounds",
            "final acc." if len(windows) != 1 else f"final acc. (last {windows[0]})", "last round",
            *(["per-client acc. (95 % CI)"] if with_clients else []), *(["checkpoint acc."] if with_ckpt else []), "paper", "bytes exchanged", "wall time"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for rec, r in zip(records, rows):
        cells = [r["run"], r["method"], str(r["dataset"]), partition_text(rec), str(r["num_clients"]),
                 f"{r['client_fraction']:g}", str(r["local_epochs"]), fmt_batch(r["batch_size"]), str(r["rounds"]),
                 fmt_acc(r["final_accuracy"]), fmt_acc(r["last_accuracy"]),
                 *([fmt_interval(r["client_accuracy"], r["client_accuracy_ci95"])] if with_clients else []),
                 *([fmt_acc(r["checkpoint_accuracy"])] if with_ckpt else []),
                 "—" if r["paper_accuracy"] is None else f"{r['paper_accuracy']:.1f} %",
                 fmt_bytes(r["bytes_total"]), fmt_seconds(r["wall_time_s"])]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    text = ["# Runs", "", *lines, "",
            "final acc. = mean test accuracy of the last `federation.final_window` evaluated rounds; "
            "B = full: the whole local set in one batch; bytes = parameters sent down and up over all rounds; "
            "paper = FedOVA (IJCNN 2021) Table I, where the setting matches."]
    if with_clients:
        text.append("per-client acc. = the global model at the last evaluated round on each client's own test "
                    "distribution (per-class test accuracy weighted by its training label proportions), mean over "
                    "clients ± the half width of the " + INTERVAL + " (`federation.per_client_eval`).")
    if with_ckpt:
        text.append("checkpoint acc. = `checkpoints/last.ckpt` re-evaluated on the test set now.")
    notes = [f"- {r['run']}: {r['notes']}" for r in rows if r["notes"]]
    if notes:
        text += ["", "Notes:", *notes]
    if figures:
        text += ["", *[f"![{name}]({path.name})" for name, path in figures.items()]]
    return "\n".join(text) + "\n"


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: "" if r[k] is None else r[k] for k in CSV_COLUMNS})


# ---- figures ---------------------------------------------------------------------------------
def run_labels(records: list[RunRecord]) -> list[str]:
    """Short legend labels: the method plus whatever setting differs between the runs."""
    fields = [("data", "name", "{}"), ("partition", "scheme", "{}"), ("partition", "labels_per_client", "l={}"),
              ("partition", "dirichlet_beta", "β={}"), ("partition", "share_fraction", "share={}"),
              ("partition", "num_clients", "K={}"), ("federation", "client_fraction", "C={}"),
              ("federation", "local_epochs", "E={}"), ("federation", "batch_size", "B={}"),
              ("optimizer", "name", "{}"), ("optimizer", "lr", "lr={}"), ("seed", None, "seed={}")]

    def get(rec, group, key):
        value = rec.config.get(group) if key is None else rec.setting(group, key)
        return "full" if (group, key) == ("federation", "batch_size") and value == 0 else value

    varying = [(g, k, f) for g, k, f in fields if len({json.dumps(get(r, g, k), default=str) for r in records}) > 1]
    labels = [" ".join([r.algorithm, *(f.format(get(r, g, k)) for g, k, f in varying)]) for r in records]
    if len(set(labels)) < len(labels):
        labels = [f"{label} ({r.run_dir.name})" for label, r in zip(labels, records)]
    return labels


def smooth(rounds: list[int], values: list[float], width: int = SMOOTH_ROUNDS) -> list[float]:
    """Value at round t = mean of the evaluated values in rounds t..t+width-1 (fewer at the end)."""
    r, v = np.asarray(rounds), np.asarray(values, dtype=float)
    return [float(v[(r >= t) & (r < t + width)].mean()) for t in r]


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # Agg, without pyplot's global state
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def _legend_with_points(ax) -> None:
    from matplotlib.lines import Line2D

    handles, names = ax.get_legend_handles_labels()
    handles.append(Line2D([], [], marker="o", ls="", color="gray", alpha=0.5, markersize=4))
    names.append("points: evaluated rounds")
    ax.legend(handles, names, fontsize=8, loc="lower right")


def plot_accuracy(records, labels, path: Path) -> Path:
    fig = _figure(8.5, 5.2)
    ax = fig.add_subplot()
    longest = max((max(evaluated(rec.history)[0], default=0) for rec in records), default=0)
    # A 10-round window over a 10-round run would flatten it into one number: short runs are drawn as measured.
    width = SMOOTH_ROUNDS if longest >= SMOOTH_ROUNDS_FROM else 1
    for rec, label, color in zip(records, labels, _colors(len(records))):
        rounds, acc = evaluated(rec.history)
        if not rounds:
            continue
        pct = [100 * a for a in acc]
        ax.scatter(rounds, pct, s=12, alpha=0.35, color=color, linewidths=0)
        ax.plot(rounds, smooth(rounds, pct, width), color=color, lw=2, label=label)
        plot_client_band(ax, rec, color)
        paper = paper_accuracy(rec)
        if paper is not None:
            ax.axhline(paper, color=color, ls="--", lw=1, alpha=0.8)
            ax.annotate(f"paper: {paper:.1f} % ({rec.algorithm})", (0.01, paper), xycoords=("axes fraction", "data"),
                        ha="left", va="bottom", fontsize=8, color=color)
    _legend_with_points(ax)
    ax.set(xlabel="communication round", ylabel="test accuracy (%)",
           title=f"Test accuracy per round (lines: mean of rounds t..t+{width - 1})" if width > 1
           else "Test accuracy per round")
    ax.grid(alpha=0.3)
    fig.savefig(path)
    return path


def plot_client_band(ax, rec: RunRecord, color) -> None:
    """federation.per_client_eval: the mean over clients per evaluated round (dashed) and its
    95 % interval (band)."""
    rounds, means = evaluated(rec.history, "test/client_accuracy")
    if not rounds:
        return
    by_round = {int(m["round"]): m for m in rec.history}
    half = np.array([by_round[r].get("test/client_accuracy_ci95", float("nan")) for r in rounds], dtype=float)
    mean = 100 * np.asarray(means)
    ax.plot(rounds, mean, color=color, lw=1, ls="--", label="  mean over clients, 95 % CI")
    ax.fill_between(rounds, mean - 100 * np.nan_to_num(half), mean + 100 * np.nan_to_num(half), color=color,
                    alpha=0.15, linewidth=0)


def _detector_id(key: str) -> tuple[int, ...]:
    """FedOVA logs one detector per class (`test/detector_acc/3`), ATHENA-FL one per cluster and
    class (`test/detector_acc/g1_c3`): the numbers in the name, for sorting."""
    name = key.rsplit("/", 1)[1]
    try:
        return tuple(int(part.lstrip("gc")) for part in name.split("_"))
    except ValueError:
        raise ValueError(f"detector metric {key!r}: expected 'detector_acc/<class>' or "
                         "'detector_acc/g<cluster>_c<class>'") from None


def _detector_label(key: str) -> str:
    ids = _detector_id(key)
    return f"class {ids[0]}" if len(ids) == 1 else f"cluster {ids[0]}, class {ids[1]}"


def plot_detectors(records, labels, path: Path) -> Optional[Path]:
    runs = []
    for rec, label in zip(records, labels):
        keys = sorted({k for m in rec.history for k in m if k.startswith("test/detector_acc/")},
                      key=_detector_id)
        if keys:
            runs.append((rec, label, keys))
    if not runs:
        return None
    shown = runs[:MAX_DETECTOR_PANELS]
    cols = min(len(shown), 3)
    rows = math.ceil(len(shown) / cols)
    fig = _figure(4.6 * cols + 1.4, 3.6 * rows + 0.4)
    axes = fig.subplots(rows, cols, squeeze=False, sharey=True)
    n_max = max(len(keys) for _, _, keys in shown)
    colors = _colors(n_max)
    for ax, (rec, label, keys) in zip(axes.flat, shown):
        for i, key in enumerate(keys):
            rounds, acc = evaluated(rec.history, key)
            ax.plot(rounds, [100 * a for a in acc], color=colors[i], lw=1.3, marker="." if len(rounds) < 30 else None,
                    label=_detector_label(key))
        ax.axhline(100 * (1 - 1 / len(keys)), color="gray", ls=":", lw=1.2, label="always 'no'")
        ax.set(title=label, xlabel="communication round")
        ax.grid(alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel("detector accuracy (%)")
    for ax in list(axes.flat)[len(shown):]:
        ax.set_visible(False)
    handles, names = axes.flat[0].get_legend_handles_labels()
    handles, names = handles[:-1][:20] + handles[-1:], names[:-1][:20] + names[-1:]  # classes (at most 20), baseline
    fig.legend(handles, names, loc="outside right center", fontsize=8, title="detector")
    more = f"\n(first {MAX_DETECTOR_PANELS} of {len(runs)} runs)" if len(runs) > len(shown) else ""
    fig.suptitle("One-vs-all detectors:\nbinary test accuracy per round" + more)
    fig.savefig(path)
    return path


def plot_partitions(records, labels, path: Path) -> Optional[Path]:
    tables: list[tuple[np.ndarray, list[str], RunRecord]] = []
    for rec, label in zip(records, labels):
        file = rec.run_dir / "partition.csv"
        if not file.is_file():
            continue
        counts = np.loadtxt(file, delimiter=",", skiprows=1, dtype=np.int64, ndmin=2)[:, 1:]
        for table, names, _ in tables:
            if table.shape == counts.shape and (table == counts).all():
                names.append(label)
                break
        else:
            tables.append((counts, [label], rec))
    if not tables:
        return None
    shown = tables[:MAX_PARTITION_PANELS]
    fig = _figure(4.8 * len(shown) + 0.6, 6.2)
    axes = fig.subplots(1, len(shown), squeeze=False)[0]
    for ax, (counts, names, rec) in zip(axes, shown):
        k = len(counts)
        part = counts[:MAX_HEATMAP_CLIENTS]
        image = ax.imshow(part, aspect="auto", interpolation="nearest", cmap="viridis")
        ax.set(xlabel="class", ylabel="client" + (f" (first {len(part)} of {k})" if k > len(part) else ""))
        if part.shape[1] <= 20:
            ax.set_xticks(range(part.shape[1]))
        who = textwrap.fill("runs: " + ", ".join(names), 50) if len(names) <= 3 else f"{len(names)} runs"
        ax.set_title(f"{partition_text(rec)}, K={k}\n{who}", fontsize=10)
        fig.colorbar(image, ax=ax, label="training samples", shrink=0.8)
    fig.suptitle("Partition: training samples per client and class")
    fig.savefig(path)
    return path


def plot_bytes(records, labels, path: Path) -> Path:
    totals = [np.cumsum([m.get("bytes/down", 0) + m.get("bytes/up", 0) for m in r.history]) for r in records]
    peak = max((t[-1] for t in totals if len(t)), default=0)
    unit, size = ("GB", 1e9) if peak >= 1e9 else ("MB", 1e6)
    fig = _figure(8.5, 5.2)
    ax = fig.add_subplot()
    for rec, label, color, cum in zip(records, labels, _colors(len(records)), totals):
        by_round = {int(m["round"]): c for m, c in zip(rec.history, cum)}
        rounds, acc = evaluated(rec.history)
        if not rounds:
            continue
        x = [by_round[r] / size for r in rounds]
        pct = [100 * a for a in acc]
        ax.scatter(x, pct, s=12, alpha=0.35, color=color, linewidths=0)
        ax.plot(x, smooth(rounds, pct), color=color, lw=2, label=label)
    _legend_with_points(ax)
    ax.set(xlabel=f"cumulative bytes exchanged, server→clients + clients→server ({unit})",
           ylabel="test accuracy (%)", title="Test accuracy against communication (lines: 10-round mean)")
    ax.grid(alpha=0.3)
    fig.savefig(path)
    return path


# ---- the command -----------------------------------------------------------------------------
def build_report(run_dirs: list[str | Path], out: str | Path = "reports/report", evaluate_checkpoints: bool = False,
                 plots: bool = True) -> Report:
    dirs = expand_run_dirs(run_dirs)
    if not dirs:
        raise ValueError("no run directories given")
    records = [load_run(d) for d in dirs]
    for rec in records:
        if (evaluate_checkpoints or rec.source == "checkpoint") and rec.checkpoint.is_file():
            rec.checkpoint_accuracy = evaluate_checkpoint(rec.run_dir, rec.config)
        elif evaluate_checkpoints:
            rec.notes.append("no checkpoints/last.ckpt to evaluate")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    figures: dict[str, Path] = {}
    if plots:
        labels = run_labels(records)
        figures["accuracy"] = plot_accuracy(records, labels, Path(f"{out}_accuracy.png"))
        for name, plot in (("detectors", plot_detectors), ("partition", plot_partitions)):
            made = plot(records, labels, Path(f"{out}_{name}.png"))
            if made is not None:
                figures[name] = made
        figures["bytes"] = plot_bytes(records, labels, Path(f"{out}_bytes.png"))
    rows = [row(r) for r in records]
    md, csv_path = Path(f"{out}.md"), Path(f"{out}.csv")
    md.write_text(markdown_table(records, rows, figures))
    write_csv(csv_path, rows)
    return Report(records, rows, md, csv_path, figures)


def build_report_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fl_lightning report", allow_abbrev=False,
        description="Tabulate and plot finished or interrupted runs: OUT.md, OUT.csv and OUT_*.png.")
    parser.add_argument("run_dirs", nargs="*", help="run directories (summary.json or checkpoints/last.ckpt), or "
                                                    "folders of them such as runs/sweeps/<sweep name>")
    parser.add_argument("--out", default="reports/report", help="output prefix (default: reports/report)")
    parser.add_argument("--evaluate-checkpoints", action="store_true",
                        help="re-evaluate every run's checkpoints/last.ckpt on the test set (always done for a run "
                             "without summary.json)")
    parser.add_argument("--reproduction", metavar="CELLS_YAML", default=None,
                        help="instead of run directories: the reproduction table of the paper cells in CELLS_YAML "
                             "(fl_lightning/reproduction.py), e.g. reports/reproduction/cells.yaml")
    parser.add_argument("--readme", default=None,
                        help="with --reproduction: replace the table between this file's reproduction markers")
    return parser


def main(argv: list[str]) -> "Report | str":
    parser = build_report_parser()
    args = parser.parse_args(argv)
    if args.reproduction:
        from fl_lightning import reproduction

        table = reproduction.write(args.reproduction, args.readme)
        print(table + (f"wrote the table into {args.readme}" if args.readme else ""))
        return table
    if args.readme:
        parser.error("--readme goes with --reproduction")
    if not args.run_dirs:
        parser.error("give run directories (or --reproduction CELLS_YAML)")
    report = build_report(args.run_dirs, args.out, args.evaluate_checkpoints)
    print(report.markdown.read_text().split("\n\n")[1])  # the table
    print("wrote " + ", ".join(str(p) for p in [report.markdown, report.csv, *report.figures.values()]))
    return report
