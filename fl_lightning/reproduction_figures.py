"""The figures of docs/reproduction.md, drawn from the reproduction cells and their committed runs
(``report --reproduction CELLS_YAML --figures DIR``):

- ``<paper>_cells``: per paper, each cell run: the paper's figure beside ours (mean ± sample std
  over seeds, each seed a dot, runs at the paper's budget apart);
- ``<table>_rounds``: per table whose runs last more than one round, test accuracy (or the cell's
  metric) per round, mean ± std over seeds, one panel per data set and setting, and the paper's
  figure as a dashed line in the same colour: the runs are the cell's own, so its protocol is
  theirs by construction (the row's "our protocol" says how it differs from the paper's).

Every figure is written as PNG and in the vector formats asked for (report.save_figure).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from fl_lightning.report import FORMATS, draw_group, evaluated, integer_rounds, new_figure, palette, save_figure
from fl_lightning.reproduction import Cell, _paper, diverged_text


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def cells_figure(paper: str, cells: list[Cell]):
    """The paper's figure and ours for every cell of ``paper`` that has runs."""
    ran = [c for c in cells if c.records]
    tables = {c.paper for c in ran}
    fig = new_figure(8.5, 1.8 + 0.3 * len(ran))
    ax = fig.add_subplot()
    for y, cell in enumerate(reversed(ran)):
        acc = cell.accuracies
        outside = cell.off_by_more()
        ax.scatter(acc, [y] * len(acc), s=10, color="gray", alpha=0.6, zorder=2,
                   label="ours, one seed" if y == 0 else None)
        if cell.mean is not None:
            ax.errorbar(cell.mean, y, xerr=cell.std or 0, fmt="o", ms=5, capsize=3, zorder=3,
                        color="tab:red" if outside else "tab:green")
        budget = cell.accuracies_of(cell.budget_records)
        ax.scatter(budget, [y + 0.25] * len(budget), marker="^", s=22, color="tab:orange", zorder=3)
        ax.scatter([cell.paper_value], [y], marker="D", s=30, facecolors="none", edgecolors="black", zorder=4)
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], marker="D", ls="", mfc="none", color="black", label="paper"),
               Line2D([], [], marker="o", ls="", color="tab:green", label="ours, mean ± std: within 3 points"),
               Line2D([], [], marker="o", ls="", color="tab:red", label="ours, mean ± std: outside"),
               Line2D([], [], marker="o", ls="", ms=4, color="gray", label="ours, one seed"),
               Line2D([], [], marker="^", ls="", color="tab:orange", label="ours at a larger budget: the paper's, or as its row says (not in the mean)")]
    fig.legend(handles=handles, fontsize=7, loc="outside lower center", ncols=3)
    names = [(f"{c.paper.split(', ', 1)[-1]}: " if len(tables) > 1 else "") + f"{c.data} {c.setting} {c.method}"
             for c in reversed(ran)]
    ax.set_yticks(range(len(ran)), names, fontsize=7)
    ax.set(xlabel="test accuracy (%)", xlim=(0, 100), title=f"{paper}: the paper's figures and ours")
    ax.grid(axis="x", alpha=0.3)
    return fig


def rounds_figure(table: str, cells: list[Cell]):
    """Per round, mean ± std over each cell's seeds (diverged seeds left out, as in its mean)."""
    panels: dict[tuple[str, str], list[Cell]] = {}
    for cell in cells:
        panels.setdefault((cell.data, cell.setting), []).append(cell)
    # one colour per method and reading across the panels, so a line is found by its colour
    lines = list(dict.fromkeys((c.method, c.reading) for c in cells))
    colors = dict(zip(lines, palette(len(lines))))
    fig = new_figure(max(4.6 * len(panels) + 0.8, 8.5), 5.6)
    axes = fig.subplots(1, len(panels), squeeze=False, sharey=True)[0]
    for ax, ((data, setting), own) in zip(axes, panels.items()):
        for cell in own:
            color = colors[cell.method, cell.reading]
            kept = [r for r in cell.records if not r.diverged]
            label = cell.method + (f", {cell.reading} reading" if cell.reading else "") \
                + (f" ({len(kept)} seeds)" if len(kept) > 1 else "") \
                + (f"; {diverged_text(cell)}, left out" if cell.diverged else "")
            if cell.budget_records:  # beneath the cell's own line, which it often continues
                draw_group(ax, cell.budget_records, f"{cell.method}, {cell.budget_label} (not in the mean)",
                           "tab:gray", width=1, key=cell.history_key)
            # the paper's value in the legend, not on the line: papers' figures often lie within a
            # point of each other; one entry per line keeps a panel's legend as narrow as the panel
            paper = f"paper (dashed): {cell.paper_value:.1f} %"
            if kept:
                draw_group(ax, kept, f"{label}\n{paper}", color, width=1, key=cell.history_key)
            ax.axhline(cell.paper_value, color=color, ls="--", lw=1, alpha=0.8,
                       label=None if kept else f"{label}: {paper}")
        ax.set(title=f"{data}, {setting}", xlabel="communication round")
        integer_rounds(ax)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncols=1)
    metric = {c.metric for c in cells} - {""}
    per_client = metric and all(m.startswith("test/client_accuracy") for m in metric)
    axes[0].set_ylabel("mean accuracy over clients (%)" if per_client else "test accuracy (%)")
    fig.suptitle(f"{table}: per round, mean ± std over seeds; dashed: the paper's figure")
    return fig


def _rounds(cell: Cell) -> int:
    return max((len(evaluated(r.history, cell.history_key)[0]) for r in cell.records), default=0)


def write_figures(cells: list[Cell], out_dir: str | Path, formats: tuple[str, ...] = FORMATS) -> list[tuple[str, Path]]:
    """Every figure, as (caption, PNG path)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    made = []
    for paper in dict.fromkeys(_paper(c) for c in cells):
        own = [c for c in cells if _paper(c) == paper]
        if any(c.records for c in own):
            path = save_figure(cells_figure(paper, own), out_dir / f"{slug(paper)}_cells.png", formats)
            made.append((f"{paper}: the paper's figures and ours, cell by cell", path))
        for table in dict.fromkeys(c.paper for c in own):
            curves = [c for c in own if c.paper == table and _rounds(c) > 1]
            if curves:
                path = save_figure(rounds_figure(table, curves), out_dir / f"{slug(table)}_rounds.png", formats)
                made.append((f"{table}: accuracy per round", path))
    return made


def figures_markdown(made: list[tuple[str, Path]], doc_dir: str | Path, formats: tuple[str, ...] = FORMATS) -> str:
    """The doc's list of figures, linked relative to the doc, with the vector copies beside."""
    def rel(path: Path) -> str:
        return Path(os.path.relpath(path, doc_dir)).as_posix()

    lines = []
    for caption, path in made:
        links = ", ".join(f"[{fmt.upper()}]({rel(path.with_suffix('.' + fmt))})" for fmt in formats if fmt != "png")
        lines += [f"**{caption}**" + (f" ({links})" if links else ""), "", f"![{caption}]({rel(path)})", ""]
    return "\n".join(lines)
