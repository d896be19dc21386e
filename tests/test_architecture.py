"""The layering of the package, read from its import statements (docs/architecture.md): each
rule that breaks names the file and the import."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fl_lightning"


def imports_of(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, module) of every import in ``path``, lazy ones inside functions included;
    relative imports resolved against the file's package."""
    tree = ast.parse(path.read_text(), str(path))
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            # `from fl_lightning import cli` imports the submodule
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def python_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py"))


def violations(files: list[Path], forbidden: tuple[str, ...], root: Path = ROOT) -> list[str]:
    return [f"{path.relative_to(root)}:{line} imports {module}" for path in files
            for line, module in imports_of(path, root) if any(module == f or module.startswith(f + ".") for f in forbidden)]


LOOP = ("fl_lightning.federation", "fl_lightning.client", "fl_lightning.cohort", "fl_lightning.settings")


def test_data_imports_no_models_strategies_or_loop():
    assert violations(python_files(PACKAGE / "data"), ("fl_lightning.models", "fl_lightning.modules",
                                                        "fl_lightning.strategies", *LOOP, "lightning")) == []


def test_models_import_no_lightning_or_loop():
    assert violations(python_files(PACKAGE / "models"), ("lightning", "fl_lightning.modules", "fl_lightning.strategies",
                                                          *LOOP)) == []


def test_the_cohort_engine_imports_no_algorithm():
    # the engine finds a kind's cohort plug-in through its client plug-in (fl_lightning.plugins)
    assert violations(python_files(PACKAGE / "cohort"), ("fl_lightning.modules", "fl_lightning.algorithms",
                                                          "fl_lightning.aggregation")) == []


def test_the_loop_client_and_flower_import_no_algorithm():
    # they find client plug-ins by kind (fl_lightning.plugins) and strategies through settings.py
    files = [PACKAGE / "client.py", PACKAGE / "federation.py", PACKAGE / "plugins.py", PACKAGE / "messages.py",
             PACKAGE / "strategy.py", *python_files(PACKAGE / "cohort"), *python_files(PACKAGE / "flower")]
    assert violations(files, ("fl_lightning.algorithms", "fl_lightning.strategies")) == []


def test_nothing_imports_the_cli_but_its_entry_point():
    allowed = {PACKAGE / "cli.py", PACKAGE / "__main__.py"}
    files = [p for p in python_files(PACKAGE) + python_files(ROOT / "callbacks") + python_files(ROOT / "bench")
             if p not in allowed]
    assert violations(files, ("fl_lightning.cli",)) == []


def test_no_import_cycles_between_packages():
    """Module-level imports only (lazy imports inside functions break cycles on purpose)."""
    def top_level(path: Path) -> set[str]:
        tree = ast.parse(path.read_text())
        names = set()
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fl_lightning."):
                names.add(node.module.split(".")[1])
            elif isinstance(node, ast.Import):
                names |= {a.name.split(".")[1] for a in node.names if a.name.startswith("fl_lightning.")}
        return names

    packages = [p for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    graph = {p.name: set().union(*[top_level(f) for f in python_files(p)]) - {p.name} for p in packages}
    graph = {name: {d for d in deps if d in graph} for name, deps in graph.items()}

    def cycle_from(start, node, seen):
        for nxt in graph[node]:
            if nxt == start:
                return [node, nxt]
            if nxt not in seen:
                seen.add(nxt)
                rest = cycle_from(start, nxt, seen)
                if rest:
                    return [node, *rest]
        return None

    cycles = [c for name in graph if (c := cycle_from(name, name, set()))]
    assert cycles == [], f"package import cycles: {cycles}"


def test_a_broken_rule_names_the_file_and_the_import(tmp_path):
    offender = tmp_path / "fl_lightning" / "data" / "bad.py"
    offender.parent.mkdir(parents=True)
    offender.write_text("import os\n\ndef f():\n    from fl_lightning.models import build_architecture\n")

    found = violations([offender], ("fl_lightning.models",), root=tmp_path)

    assert found == ["fl_lightning/data/bad.py:4 imports fl_lightning.models",
                     "fl_lightning/data/bad.py:4 imports fl_lightning.models.build_architecture"]


def test_the_worked_example_in_the_architecture_doc_runs_as_a_new_algorithm(tmp_path, monkeypatch):
    """docs/architecture.md's "How to add an algorithm": its code, as printed, is a new
    algorithm the CLI runs without any change to the loop: clients fine-tune and send only the
    head, so the features stay as initialised and only the head's bytes go up."""
    import re
    import sys

    import torch

    from fl_lightning.checkpoint import load_checkpoint
    from fl_lightning.cli import main
    from tests.conftest import tiny_args

    doc = (ROOT / "docs" / "architecture.md").read_text()
    code = re.search(r"### How to add an algorithm.*?```python\n(.*?)```", doc, re.S).group(1)
    (tmp_path / "fedhead_example.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))

    summary = main(["fit", *tiny_args(tmp_path / "run", "--federation.rounds", "1", "--model.architecture", "simple_cnn",
                                      "--algorithm", "fedhead_example.FedHead", "--run.checkpoint_every", "1")])

    final = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt")["state"]
    initial = sys.modules["fedhead_example"].FedHead  # the strategy class came from the doc's code
    assert summary["algorithm"] == "fedhead" and initial.name == "fedhead"
    from fl_lightning.settings import build_federation

    fresh = build_federation(["fit", *tiny_args(tmp_path / "fresh", "--model.architecture", "simple_cnn",
                                                "--algorithm", "fedhead_example.FedHead")])[2]
    fresh.setup()
    start = fresh.state
    assert all(torch.equal(final[k], start[k]) for k in final if not k.startswith("head."))
    assert any(not torch.equal(final[k], start[k]) for k in final if k.startswith("head."))
    head_bytes = sum(v.numel() * v.element_size() for k, v in start.items() if k.startswith("head."))
    assert summary["history"][0]["bytes/up"] == summary["history"][0]["clients"] * head_bytes


ALGORITHM_NAMES = ("fedova", "fedov", "fedavg", "fedprox", "fednova", "scaffold", "feddane", "feddf", "fedkt",
                   "athena", "fimlbfgs", "lbfgs", "proser", "open_set", "voting", "detector", "curvature", "party")
GENERIC = [PACKAGE / "client.py", PACKAGE / "federation.py", PACKAGE / "plugins.py", PACKAGE / "messages.py",
           PACKAGE / "flower" / "codec.py", *python_files(PACKAGE / "cohort")]


def code_names(path: Path) -> list[tuple[int, str]]:
    """Identifiers and string literals of ``path``'s code; comments and docstrings (which may
    cite an algorithm as an example) left out."""
    import io
    import tokenize

    tokens = list(tokenize.generate_tokens(io.StringIO(path.read_text()).readline))
    found, previous = [], tokenize.NEWLINE
    for tok in tokens:
        if tok.type == tokenize.NAME or (tok.type == tokenize.STRING and previous not in (tokenize.NEWLINE, tokenize.INDENT,
                                                                                         tokenize.DEDENT, tokenize.NL)):
            found.append((tok.start[0], tok.string))
        if tok.type not in (tokenize.COMMENT, tokenize.NL):
            previous = tok.type
    return found


def test_the_loop_client_cohort_engine_and_codec_name_no_algorithm():
    hits = [f"{path.relative_to(ROOT)}:{line}: {name}" for path in GENERIC for line, name in code_names(path)
            if any(a in name.lower() for a in ALGORITHM_NAMES)]
    assert hits == []


def test_the_algorithm_name_check_sees_code_but_not_docstrings(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('"""FedOVA is cited here."""\n\n\ndef f(task):\n    # SCAFFOLD too\n'
                      '    return task.kind == "detectors"\n')
    assert [name for _, name in code_names(sample) if "detector" in name.lower()] == ['"detectors"']
    assert not [name for _, name in code_names(sample) if "fedova" in name.lower() or "scaffold" in name.lower()]


def test_configs_saved_before_the_algorithms_moved_still_build_and_resume(tmp_path):
    from fl_lightning.federation import _config_differences
    from fl_lightning.settings import federation_from_config

    saved = {"algorithm": {"class_path": "fl_lightning.strategies.fedova.FedOVA", "init_args": {"weighted": False}},
             "data": {"name": "synthetic"}, "run": {"dir": str(tmp_path)}}

    federation = federation_from_config(saved)

    assert type(federation.strategy).__name__ == "FedOVA"
    now = {"algorithm": {"class_path": "fl_lightning.algorithms.FedOVA", "init_args": {"weighted": False}}}
    assert _config_differences({"algorithm": saved["algorithm"]}, now) == []
    other = {"algorithm": {"class_path": "fl_lightning.algorithms.FedAvg", "init_args": {"weighted": False}}}
    assert _config_differences({"algorithm": saved["algorithm"]}, other)  # another algorithm is still refused


def test_the_server_steps_after_the_clients_are_the_strategys_callbacks(tmp_path):
    """Aggregation runs as a callback the strategy configures (callbacks/aggregation.py), not
    as a call in the loop: a strategy that configures none keeps its initial state, and one
    that adds a callback sees every round's results."""
    import torch

    from fl_lightning.callbacks.base import FederatedCallback
    from fl_lightning.algorithms import FedAvg
    from fl_lightning.settings import build_federation
    from tests.conftest import tiny_args

    seen = []

    class Spy(FederatedCallback):
        def on_clients_end(self, federation, round_index, results):
            seen.append((round_index, sorted(r.client_id for r in results)))
            return {"spy/clients": len(results)}

    class NoAggregation(FedAvg):
        def configure_callbacks(self):
            return [Spy()]

    args = tiny_args(tmp_path, "--algorithm", "FedAvg", "--federation.rounds", "2")
    federation = build_federation(["fit", *args], callbacks=[])[2]
    federation.strategy = NoAggregation()
    federation.setup()
    start = {k: v.clone() for k, v in federation.state.items()}

    summary = federation.fit()

    assert all(torch.equal(federation.state[k], start[k]) for k in start)
    assert [r for r, _ in seen] == [1, 2] and all(len(ids) == 3 for _, ids in seen)
    assert [m["spy/clients"] for m in summary["history"]] == [3, 3]
