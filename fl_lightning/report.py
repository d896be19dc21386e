"""``python -m fl_lightning report RUN_DIR... [--out reports/NAME] [--evaluate-checkpoints]``
(or ``report --reproduction CELLS_YAML [--doc docs/reproduction.md] [--readme README.md]
[--figures docs/figures]``: the paper-cell table of fl_lightning/reproduction.py)

One table row per run directory (``summary.json``, or only ``checkpoints/last.ckpt`` of an
unfinished run) written as ``NAME.md`` and ``NAME.csv``, and four figures beside them, each as
PNG and as vector files (``--formats``, default PDF): ``NAME_accuracy`` (test accuracy per
round; runs that differ only in their seed drawn as one mean line with a ± std band),
``NAME_detectors`` (FedOVA's per-detector accuracy), ``NAME_partition`` (clients x classes heat
map) and ``NAME_bytes`` (accuracy against cumulative bytes exchanged). A paper's figure is
drawn, and put in the table, only for a run whose protocol (data, partition, model, optimizer,
K, C, E, B, rounds, algorithm) is that of a reproduction cell's runs (``--cells``, default
reports/reproduction/cells.yaml). A run directory without a summary, or every run with
``--evaluate-checkpoints``, is re-evaluated on the test set from its checkpoint
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

# The papers' figures live in the reproduction cells, each beside the runs that measure it: a
# run gets a paper's line only when its protocol is that of a cell's runs.
DEFAULT_CELLS = Path(__file__).resolve().parents[1] / "reports" / "reproduction" / "cells.yaml"

# What makes two runs the same experiment, with the value a config saved before the key existed
# had. Seeds, run folders, engines and data paths are left out: they do not change the protocol.
PROTOCOL_KEYS: tuple[tuple[str, str, Any], ...] = (
    ("data", "name", None), ("data", "image_size", None), ("data", "test_subset", 0),
    ("partition", "scheme", None), ("partition", "num_clients", None), ("partition", "labels_per_client", None),
    ("partition", "dirichlet_beta", None), ("partition", "share_fraction", 0.0),
    ("model", "architecture", None), ("model", "hidden_units", 0), ("optimizer", "name", None), ("optimizer", "lr", None),
    ("federation", "rounds", None), ("federation", "client_fraction", None), ("federation", "local_epochs", None),
    ("federation", "batch_size", None))
NOT_PROTOCOL = {"seed", "run", "trainer", "ckpt_path", "config", "__path__"}
DATA_PATHS = {"root", "offline_roots", "idx_gz_dir", "download", "mirror", "check_integrity", "image_pack",
              "speech_commands_dir", "fsdd_dir"}
LABEL_SCHEMES = {"non_iid_l", "num_labels", "label_groups"}  # where labels_per_client means something

DPI = 200
FORMATS = ("png", "pdf")  # PNG for the web pages, a vector copy for papers

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
def protocol(record: RunRecord) -> dict[str, Any]:
    """The settings that make a run's figure comparable with another's (PROTOCOL_KEYS, plus the
    algorithm); a key that means nothing under the run's partition scheme is left out."""
    scheme = record.setting("partition", "scheme")
    out = {f"{g}.{k}": record.setting(g, k, default) for g, k, default in PROTOCOL_KEYS}
    if scheme not in LABEL_SCHEMES:
        out.pop("partition.labels_per_client")
    if scheme != "dirichlet":
        out.pop("partition.dirichlet_beta")
    out["algorithm"] = record.algorithm
    return out


def _init_args(record: RunRecord) -> dict:
    return dict((record.config.get("algorithm") or {}).get("init_args") or {})


def same_protocol(a: RunRecord, b: RunRecord) -> bool:
    """Equal protocols, and the algorithms' settings agree wherever both configs name them (a
    config saved before a setting existed does not name it)."""
    if protocol(a) != protocol(b):
        return False
    args_a, args_b = _init_args(a), _init_args(b)
    return all(args_a[k] == args_b[k] for k in args_a.keys() & args_b.keys())


@dataclass(frozen=True)
class PaperFigure:
    value: float   # %
    source: str    # "FedOVA, Table I: FedOVA"


def paper_figures(record: RunRecord, cells: list) -> list[PaperFigure]:
    """The paper figures of the reproduction cells whose runs (or runs at the paper's budget)
    have ``record``'s protocol; none for any other run."""
    found = []
    for cell in cells:
        if any(same_protocol(record, other) for other in [*cell.records, *cell.budget_records]):
            figure = PaperFigure(cell.paper_value, f"{cell.paper}: {cell.method}")
            if figure not in found:
                found.append(figure)
    return found


def load_reference_cells(path: Optional[str | Path]) -> list:
    """The reproduction cells to take paper figures from; none without a cells file, and none,
    said on stderr, when it cannot be read: a report of runs does not depend on it."""
    if path is None or not Path(path).is_file():
        return []
    from fl_lightning.reproduction import load_cells  # reproduction reads runs through this module

    try:
        return load_cells(path)
    except ValueError as err:
        print(f"warning: no paper figures: {err}", file=sys.stderr)
        return []


def paper_accuracy(record: RunRecord, cells: list) -> Optional[float]:
    """The paper's figure for the table: the first matching cell's (none for other protocols)."""
    figures = paper_figures(record, cells)
    return figures[0].value if figures else None


def partition_text(record: RunRecord) -> str:
    scheme = record.setting("partition", "scheme", "?")
    text = {"non_iid_l": f"non_iid_l (l={record.setting('partition', 'labels_per_client')})",
            "num_labels": f"num_labels (#C={record.setting('partition', 'labels_per_client')})",
            "dirichlet": f"dirichlet (β={record.setting('partition', 'dirichlet_beta')})"}.get(scheme, scheme)
    share = record.setting("partition", "share_fraction", 0.0)
    return text + (f" + sharing {share:g}" if share else "")


def row(record: RunRecord, cells: list = ()) -> dict[str, Any]:
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
        "paper_accuracy": paper_accuracy(record, list(cells)),
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
            "paper = the figure of the reproduction cell (reports/reproduction/cells.yaml) whose runs have this run's "
            "protocol (data, partition, model, optimizer, K, C, E, B, rounds, algorithm); — for any other run."]
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


def new_figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # Agg, without pyplot's global state
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig, path: Path, formats: tuple[str, ...] = FORMATS) -> Path:
    """``path`` (its suffix replaced) in every format; returns the PNG (or the first) path. Vector
    files carry no date and fixed SVG ids, so an unchanged figure rewrites the same bytes."""
    import matplotlib

    written = []
    for fmt in formats:
        target = Path(path).with_suffix(f".{fmt}")
        metadata = {"png": None, "svg": {"Date": None}, "pdf": {"CreationDate": None}}.get(fmt)
        with matplotlib.rc_context({"svg.hashsalt": "fl_lightning"}):
            fig.savefig(target, format=fmt, dpi=DPI, metadata=metadata)
        written.append(target)
    return next((p for p in written if p.suffix == ".png"), written[0])


def integer_rounds(ax) -> None:
    """Rounds are counted: ticks at whole rounds only."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def palette(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def _legend_with_points(ax) -> None:
    from matplotlib.lines import Line2D

    handles, names = ax.get_legend_handles_labels()
    handles.append(Line2D([], [], marker="o", ls="", color="gray", alpha=0.5, markersize=4))
    names.append("points: evaluated rounds")
    ax.legend(handles, names, fontsize=8, loc="lower right")


def _without_seed(config: dict) -> str:
    """A run's config less what does not change the experiment (seed, run folder, engine, data
    paths): runs with equal keys differ only in their seed."""
    kept = {k: v for k, v in config.items() if k not in NOT_PROTOCOL}
    kept["data"] = {k: v for k, v in (config.get("data") or {}).items() if k not in DATA_PATHS}
    return json.dumps(kept, sort_keys=True, default=str)


def seed_groups(records: list[RunRecord]) -> list[list[RunRecord]]:
    """Runs that differ only in their seed, grouped, in the order of their first run."""
    groups: dict[str, list[RunRecord]] = {}
    for rec in records:
        groups.setdefault(_without_seed(rec.config), []).append(rec)
    return list(groups.values())


def seed_band(records: list[RunRecord], key: str = "test/accuracy",
              width: int = 1) -> tuple[list[int], np.ndarray, np.ndarray]:
    """(rounds, mean, std) over the runs of ``key`` in %, at the rounds every run evaluated, each
    run first smoothed as a single run's line is (``smooth``); std is the sample std (ddof 1, as
    the reproduction table's), zero for one run."""
    common = sorted(set.intersection(*(set(evaluated(r.history, key)[0]) for r in records)))
    curves = []
    for rec in records:
        by_round = dict(zip(*evaluated(rec.history, key)))
        curves.append(smooth(common, [100 * by_round[r] for r in common], width) if common else [])
    values = np.asarray(curves, dtype=float).reshape(len(records), len(common))
    std = values.std(axis=0, ddof=1) if len(records) > 1 else np.zeros(len(common))
    return common, values.mean(axis=0), std


def group_labels(groups: list[list[RunRecord]]) -> list[str]:
    """A legend label per group: the first run's, less its seed when the group has several."""
    labels = run_labels([g[0] for g in groups])
    return [label.split(" seed=")[0] + f" ({len(g)} seeds, mean ± std)" if len(g) > 1 else label
            for label, g in zip(labels, groups)]


def draw_group(ax, group: list[RunRecord], label: str, color, width: int, key: str = "test/accuracy") -> None:
    """One run: its points and line; several seeds: the mean line and a ± std band."""
    if len(group) == 1:
        rounds, acc = evaluated(group[0].history, key)
        if rounds:
            pct = [100 * a for a in acc]
            ax.scatter(rounds, pct, s=12, alpha=0.35, color=color, linewidths=0)
            ax.plot(rounds, smooth(rounds, pct, width), color=color, lw=2, label=label)
        return
    rounds, mean, std = seed_band(group, key, width)
    if rounds:
        ax.plot(rounds, mean, color=color, lw=2, label=label)
        ax.fill_between(rounds, mean - std, mean + std, color=color, alpha=0.2, linewidth=0)


def draw_paper_line(ax, figure: PaperFigure, color) -> None:
    ax.axhline(figure.value, color=color, ls="--", lw=1, alpha=0.8)
    ax.annotate(f"paper: {figure.value:.1f} % ({figure.source})", (0.01, figure.value),
                xycoords=("axes fraction", "data"), ha="left", va="bottom", fontsize=7, color=color)


def accuracy_figure(records: list[RunRecord], cells: list = ()):
    """Test accuracy per round: a line per run, or per group of seeds with its ± std band; the
    paper's figure only where a reproduction cell's runs have the same protocol."""
    fig = new_figure(8.5, 5.2)
    ax = fig.add_subplot()
    longest = max((max(evaluated(rec.history)[0], default=0) for rec in records), default=0)
    # A 10-round window over a 10-round run would flatten it into one number: short runs are drawn as measured.
    width = SMOOTH_ROUNDS if longest >= SMOOTH_ROUNDS_FROM else 1
    groups = seed_groups(records)
    for group, label, color in zip(groups, group_labels(groups), palette(len(groups))):
        draw_group(ax, group, label, color, width)
        if len(group) == 1:  # one run's interval over clients; a group's band is over seeds
            plot_client_band(ax, group[0], color)
        for figure in paper_figures(group[0], list(cells)):
            draw_paper_line(ax, figure, color)
    _legend_with_points(ax)
    ax.set(xlabel="communication round", ylabel="test accuracy (%)",
           title=f"Test accuracy per round (lines: mean of rounds t..t+{width - 1})" if width > 1
           else "Test accuracy per round")
    integer_rounds(ax)
    ax.grid(alpha=0.3)
    return fig


def plot_accuracy(records, path: Path, cells: list = (), formats: tuple[str, ...] = FORMATS) -> Path:
    return save_figure(accuracy_figure(records, cells), path, formats)


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


def plot_detectors(records, labels, path: Path, formats: tuple[str, ...] = FORMATS) -> Optional[Path]:
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
    fig = new_figure(4.6 * cols + 1.4, 3.6 * rows + 0.4)
    axes = fig.subplots(rows, cols, squeeze=False, sharey=True)
    n_max = max(len(keys) for _, _, keys in shown)
    colors = palette(n_max)
    for ax, (rec, label, keys) in zip(axes.flat, shown):
        for i, key in enumerate(keys):
            rounds, acc = evaluated(rec.history, key)
            ax.plot(rounds, [100 * a for a in acc], color=colors[i], lw=1.3, marker="." if len(rounds) < 30 else None,
                    label=_detector_label(key))
        ax.axhline(100 * (1 - 1 / len(keys)), color="gray", ls=":", lw=1.2, label="always 'no'")
        ax.set(title=label, xlabel="communication round")
        integer_rounds(ax)
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
    return save_figure(fig, path, formats)


def plot_partitions(records, labels, path: Path, formats: tuple[str, ...] = FORMATS) -> Optional[Path]:
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
    fig = new_figure(4.8 * len(shown) + 0.6, 6.2)
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
    return save_figure(fig, path, formats)


def plot_bytes(records, labels, path: Path, formats: tuple[str, ...] = FORMATS) -> Path:
    totals = [np.cumsum([m.get("bytes/down", 0) + m.get("bytes/up", 0) for m in r.history]) for r in records]
    peak = max((t[-1] for t in totals if len(t)), default=0)
    unit, size = ("GB", 1e9) if peak >= 1e9 else ("MB", 1e6)
    fig = new_figure(8.5, 5.2)
    ax = fig.add_subplot()
    for rec, label, color, cum in zip(records, labels, palette(len(records)), totals):
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
    return save_figure(fig, path, formats)


# ---- the command -----------------------------------------------------------------------------
def build_report(run_dirs: list[str | Path], out: str | Path = "reports/report", evaluate_checkpoints: bool = False,
                 plots: bool = True, cells: Optional[str | Path] = DEFAULT_CELLS,
                 formats: tuple[str, ...] = FORMATS) -> Report:
    dirs = expand_run_dirs(run_dirs)
    if not dirs:
        raise ValueError("no run directories given")
    records = [load_run(d) for d in dirs]
    for rec in records:
        if (evaluate_checkpoints or rec.source == "checkpoint") and rec.checkpoint.is_file():
            rec.checkpoint_accuracy = evaluate_checkpoint(rec.run_dir, rec.config)
        elif evaluate_checkpoints:
            rec.notes.append("no checkpoints/last.ckpt to evaluate")
    reference = load_reference_cells(cells)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    figures: dict[str, Path] = {}
    if plots:
        labels = run_labels(records)
        figures["accuracy"] = plot_accuracy(records, Path(f"{out}_accuracy.png"), reference, formats)
        for name, plot in (("detectors", plot_detectors), ("partition", plot_partitions)):
            made = plot(records, labels, Path(f"{out}_{name}.png"), formats)
            if made is not None:
                figures[name] = made
        figures["bytes"] = plot_bytes(records, labels, Path(f"{out}_bytes.png"), formats)
    rows = [row(r, reference) for r in records]
    md, csv_path = Path(f"{out}.md"), Path(f"{out}.csv")
    md.write_text(markdown_table(records, rows, figures))
    write_csv(csv_path, rows)
    return Report(records, rows, md, csv_path, figures)


def parse_formats(text: str) -> tuple[str, ...]:
    formats = tuple(f.strip().lower() for f in text.split(",") if f.strip())
    unknown = sorted(set(formats) - {"png", "pdf", "svg"})
    if unknown or not formats:
        raise argparse.ArgumentTypeError(f"--formats {text!r}: choose from png, pdf, svg (comma-separated)")
    return formats


def build_report_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fl_lightning report", allow_abbrev=False,
        description="Tabulate and plot finished or interrupted runs: OUT.md, OUT.csv and OUT_*.png (+ vector copies).")
    parser.add_argument("run_dirs", nargs="*", help="run directories (summary.json or checkpoints/last.ckpt), or "
                                                    "folders of them such as runs/sweeps/<sweep name>")
    parser.add_argument("--out", default="reports/report", help="output prefix (default: reports/report)")
    parser.add_argument("--evaluate-checkpoints", action="store_true",
                        help="re-evaluate every run's checkpoints/last.ckpt on the test set (always done for a run "
                             "without summary.json)")
    parser.add_argument("--cells", default=str(DEFAULT_CELLS),
                        help="reproduction cells whose paper figures are drawn for runs of the same protocol "
                             "(default: the project's reports/reproduction/cells.yaml; '' for none)")
    parser.add_argument("--formats", type=parse_formats, default=FORMATS,
                        help="figure formats, comma-separated from png, pdf, svg (default: png,pdf)")
    parser.add_argument("--reproduction", metavar="CELLS_YAML", default=None,
                        help="instead of run directories: the reproduction table of the paper cells in CELLS_YAML "
                             "(fl_lightning/reproduction.py), e.g. reports/reproduction/cells.yaml")
    parser.add_argument("--doc", default=None,
                        help="with --reproduction: replace the table and headline between this file's reproduction "
                             "markers (docs/reproduction.md)")
    parser.add_argument("--readme", default=None,
                        help="with --reproduction: replace the one-line-per-paper summary between this file's "
                             "markers (README.md)")
    parser.add_argument("--figures", default=None, metavar="DIR",
                        help="with --reproduction: write the reproduction figures into DIR (docs/figures) and, with "
                             "--doc, list them between the doc's figure markers")
    return parser


def main(argv: list[str]) -> "Report | str":
    parser = build_report_parser()
    args = parser.parse_args(argv)
    if args.reproduction:
        from fl_lightning import reproduction

        table = reproduction.write(args.reproduction, doc=args.doc, readme=args.readme, figures=args.figures,
                                   formats=args.formats)
        wrote = [f"the table and headline into {args.doc}"] * bool(args.doc) + \
                [f"the summary into {args.readme}"] * bool(args.readme) + [f"the figures into {args.figures}"] * bool(args.figures)
        print(table + ("wrote " + "; ".join(wrote) if wrote else ""))
        return table
    for name in ("doc", "readme", "figures"):
        if getattr(args, name):
            parser.error(f"--{name} goes with --reproduction")
    if not args.run_dirs:
        parser.error("give run directories (or --reproduction CELLS_YAML)")
    report = build_report(args.run_dirs, args.out, args.evaluate_checkpoints, cells=args.cells or None,
                          formats=args.formats)
    print(report.markdown.read_text().split("\n\n")[1])  # the table
    vectors = [f for f in args.formats if f != "png"]
    print("wrote " + ", ".join(str(p) for p in [report.markdown, report.csv, *report.figures.values()])
          + (f" (and a {', '.join(vectors)} copy beside each figure)" if vectors else ""))
    return report
