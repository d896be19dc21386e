"""The papers' result tables transcribed whole (``paper_tables:`` in cells.yaml), so that the
reproduction table lists every cell of them that fl_lightning implements, not only the cells it
has runs or a hand-written entry for.

A transcribed table gives, row by row (a data set and a setting), the paper's figure in each
method's column. A cell that ``cells:`` already lists (the same paper, data, setting and method)
stays that entry, and its paper value must equal the transcription's: the two are typed apart,
so each checks the other. Every other cell becomes a cell of its own whose ``missing:`` says
why it has no runs yet and gives the command that makes them; its run folder is named as
experiments/reproduction.sh names it (``<data>_<setting>_<method><suffix>``), so runs put there
appear in the table as any cell's do. The doc shows the cells without runs compactly, one
table per paper table, in the paper's own layout (``pending_markdown``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SEEDS = "S = 0, 1, 2"


@dataclass(frozen=True)
class Column:
    """A data set, setting or method of a transcribed table: the name its run folders use,
    the command-line arguments that select it (none: the config's default), and (optional) why
    its cells have no runs yet."""
    folder: str
    args: str = ""
    why: str = ""


@dataclass(eq=False)  # compared and hashed by identity: a cell names the table it comes from
class PaperTable:
    paper: str              # "FedOV, Table 1": the cells' paper
    id: str                 # prefix of the cells' ids
    paper_protocol: str
    reading: str            # the reading the commands follow (the configs' default)
    suffix: str             # run folders: runs/<data>_<setting>_<method><suffix>
    args: str               # arguments every command of the table adds
    why: str                # why a cell has no runs, where neither its data nor its method says
    data: dict[str, Column]
    settings: dict[str, Column]
    methods: dict[str, Column]
    rows: list[list]        # [data, setting, the paper's figure of each method, in methods' order]
    left_out: str = ""      # the paper's columns not transcribed, and why (shown under the table)
    differences: str = ""   # what its cells' runs differ in from the paper that their configs cannot say
    position: int = 0       # its place among cells.yaml's paper_tables (the doc shows them in that order)
    values: dict[tuple[str, str, str], float] = field(default_factory=dict)

    def folder(self, data: str, setting: str, method: str) -> str:
        return f"runs/{self.data[data].folder}_{self.settings[setting].folder}_{self.methods[method].folder}{self.suffix}"

    def command(self, data: str, setting: str, method: str) -> str:
        # a method whose config is per data set names it as "{data}" (configs/athena_{data}_code.yaml)
        method_args = self.methods[method].args.replace("{data}", self.data[data].folder)
        parts = [method_args, self.data[data].args, self.settings[setting].args, self.args]
        return (f"python -m fl_lightning fit {' '.join(p for p in parts if p)} --seed S --run.dir "
                f"reports/reproduction/{self.folder(data, setting, method)}/seedS ({SEEDS})")

    def why_not_run(self, data: str, method: str) -> tuple[str, str]:
        """(whose reason, the reason): the data set's where it has one (it cannot be read
        here), else the method's, else the table's."""
        if self.data[data].why:
            return data, self.data[data].why
        return method, self.methods[method].why or self.why


def _columns(raw: Any, where: str) -> dict[str, Column]:
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"{where}: expected a mapping of names to {{folder, args[, why]}}")
    columns = {}
    for name, entry in raw.items():
        try:
            columns[str(name)] = Column(**entry)
        except TypeError as err:
            raise ValueError(f"{where}: {name!r}: {err}") from None
    return columns


def load_paper_tables(raw: Any, spec: str) -> list[PaperTable]:
    """The ``paper_tables:`` of ``spec`` (a list; absent: none), each row checked against its
    table's data sets, settings and methods."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ValueError(f"{spec}: 'paper_tables:' must be a list")
    tables = []
    for k, entry in enumerate(raw):
        where = f"{spec}: paper_tables[{k}] ({entry.get('paper', '?')})"
        try:
            table = PaperTable(**{**entry, "position": k, "data": _columns(entry.get("data"), f"{where}: data"),
                                  "settings": _columns(entry.get("settings"), f"{where}: settings"),
                                  "methods": _columns(entry.get("methods"), f"{where}: methods")})
        except TypeError as err:
            raise ValueError(f"{where}: {err}") from None
        for row in table.rows:
            if len(row) != 2 + len(table.methods):
                raise ValueError(f"{where}: row {row[:2]} has {len(row) - 2} figures for {len(table.methods)} methods "
                                 f"({', '.join(table.methods)})")
            data, setting, figures = str(row[0]), str(row[1]), row[2:]
            if data not in table.data or setting not in table.settings:
                raise ValueError(f"{where}: row {row[:2]}: data set or setting not among the table's "
                                 f"{sorted(table.data)} / {sorted(table.settings)}")
            for method, value in zip(table.methods, figures):
                key = (data, setting, method)
                if key in table.values:
                    raise ValueError(f"{where}: {key} is transcribed twice")
                table.values[key] = float(value)
        tables.append(table)
    return tables


def check_listed(table: PaperTable, listed: list, spec: str) -> None:
    """A listed cell of a transcribed table must carry the transcription's figure."""
    for cell in listed:
        if cell.paper != table.paper:
            continue
        value = table.values.get((cell.data, cell.setting, cell.method))
        if value is not None and abs(value - cell.paper_value) > 1e-9:
            raise ValueError(f"{spec}: cell {cell.id!r} has paper_value {cell.paper_value}, the transcription of "
                             f"{table.paper} ({cell.data}, {cell.setting}, {cell.method}) {value}: one of the two is "
                             "mistyped")


def unlisted_cells(table: PaperTable, listed: list) -> list[dict]:
    """The keyword arguments of a cell for every cell of ``table`` that ``listed`` lacks."""
    have = {(c.paper, c.data, c.setting, c.method) for c in listed}
    cells = []
    for (data, setting, method), value in table.values.items():
        if (table.paper, data, setting, method) in have:
            continue
        cells.append(dict(
            id=f"{table.id}_{table.data[data].folder}_{table.settings[setting].folder}_{table.methods[method].folder}",
            paper=table.paper, data=data, setting=setting, method=method, paper_value=value,
            paper_protocol=table.paper_protocol, reading=table.reading, runs=table.folder(data, setting, method),
            differences=table.differences,
            missing="{}: {}; {}".format(*table.why_not_run(data, method), table.command(data, setting, method))))
    return cells


def pending_markdown(table: PaperTable, pending: set[tuple[str, str, str]]) -> str:
    """The table's cells without runs (``pending``: their (data, setting, method)) in the
    paper's layout, with why they have none and the command of each; "·": a row of the table
    above (listed, or run)."""
    rows = []
    for data, setting, *_ in table.rows:
        if any((data, setting, m) in pending for m in table.methods):
            rows.append([data, setting] + [f"{table.values[(data, setting, m)]:.1f}" if (data, setting, m) in pending
                                           else "·" for m in table.methods])
    if not rows:
        return ""
    head = ["data", "setting", *table.methods]
    lines = [f"**{table.paper}** ({table.paper_protocol}; reading: {table.reading}): the paper's figures (%) of "
             f"its {sum(len(r) - 2 - r.count('·') for r in rows)} cells not run yet; · : a row of the table above.",
             "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    reasons: dict[str, list[str]] = {}  # a reason and the columns it holds for, in the table's order
    for method in table.methods:
        for data, setting, *_ in table.rows:
            if (data, setting, method) in pending:
                whose, why = table.why_not_run(data, method)
                reasons.setdefault(why, [])
                if whose not in reasons[why]:
                    reasons[why].append(whose)
    lines += ["", "Why not run:"] + [f"- {', '.join(whose)}: {why}" for why, whose in reasons.items()]
    lines += ["",
              f"A cell's command: `python -m fl_lightning fit <method> <data> <setting>"
              f"{' ' + table.args if table.args else ''} --seed S --run.dir "
              f"reports/reproduction/runs/<data>_<setting>_<method>{table.suffix}/seedS` ({SEEDS}), with",
              "- methods: " + _column_list(table.methods) + (" (`{data}`: the data set's folder name)" if any(
                  "{data}" in c.args for c in table.methods.values()) else ""),
              "- data: " + _column_list(table.data), "- settings: " + _column_list(table.settings)]
    if table.left_out:
        lines.append(f"- not transcribed: {table.left_out}")
    return "\n".join(lines) + "\n"


def _column_list(columns: dict[str, Column]) -> str:
    return "; ".join(f"{name} `{c.folder}`" + (f": `{c.args}`" if c.args else "") for name, c in columns.items())
