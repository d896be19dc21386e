"""``python -m fl_lightning sweep SWEEP_FILE [--runs-dir runs/sweeps] [--dry-run] [fit overrides...]``

Runs a W&B *grid* sweep file (the ones in ``sweeps/``, also accepted by ``wandb sweep``)
without a W&B server: the grid is expanded in file order and each configuration is one
ordinary ``fit`` in ``<runs-dir>/<sweep name>/<key>=<value>,...``. A configuration whose
run directory already holds a finished ``summary.json`` is skipped and one with only a
checkpoint is resumed from it, so an interrupted sweep is continued by running the same
command again.

Each fit runs in this process (``fit_configuration``, through fl_lightning.settings): no
interpreter start and import per configuration, errors keep their tracebacks, and tests can
count the fits. A process crash ends the sweep, which the resume rule then continues.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

# Settings the sweep runner itself decides, per configuration.
_RESERVED = ("--run.dir", "--ckpt_path")


class SweepError(ValueError):
    """A sweep file the offline runner cannot run; the message names the offending key."""


@dataclass
class Sweep:
    name: str
    parameters: list[tuple[str, list[Any]]]  # (dotted key, values), in file order
    fixed_args: list[str]  # the fit arguments of ``command:`` without ${...} placeholders
    metric: Optional[dict] = None


@dataclass
class Configuration:
    values: dict[str, Any]
    name: str
    run_dir: Path
    args: list[str] = field(default_factory=list)  # ``fit`` arguments, without --ckpt_path
    status: str = ""  # done | skipped | resumed | failed (dry run: would ...)
    summary: Optional[dict] = None
    error: Optional[str] = None


# ---- the sweep file ------------------------------------------------------------------------
def load_sweep(path: str | Path) -> Sweep:
    path = Path(path)
    try:
        spec = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise SweepError(f"{path}: not valid YAML ({err})") from err
    if not isinstance(spec, dict):
        raise SweepError(f"{path}: a sweep file is a mapping with method, parameters and command")
    method = spec.get("method")
    if method != "grid":
        raise SweepError(f"{path}: method: {method!r} is not supported by the offline runner (only method: grid); "
                         f"use `wandb sweep` + `wandb agent` for random or bayes searches")
    params = spec.get("parameters")
    if not isinstance(params, dict) or not params:
        raise SweepError(f"{path}: parameters: must map each setting to {{values: [...]}} or {{value: x}}")
    parameters = []
    for key, form in params.items():
        if isinstance(form, dict) and set(form) == {"values"} and isinstance(form["values"], list) and form["values"]:
            parameters.append((str(key), list(form["values"])))
        elif isinstance(form, dict) and set(form) == {"value"}:
            parameters.append((str(key), [form["value"]]))
        else:
            raise SweepError(f"{path}: parameter {key!r} must be {{values: [non-empty list]}} or {{value: x}} for a "
                             f"grid sweep, not {form!r}")
    return Sweep(name=_safe(str(spec.get("name") or path.stem)), parameters=parameters,
                 fixed_args=fit_arguments(spec.get("command"), path), metric=spec.get("metric"))


def fit_arguments(command: Optional[list], path: Path | str = "sweep") -> list[str]:
    """The fixed ``fit`` arguments of a W&B ``command:`` list: the ${...} macros (${env},
    ${interpreter}, ${program}, ${args}, ...) are dropped and everything after ``fit`` is kept.
    No command means plain ``fit`` with the parameters only."""
    if command is None:
        return []
    if not isinstance(command, list):
        raise SweepError(f"{path}: command: must be a list")
    words = [str(w) for w in command if not re.fullmatch(r"\$\{[A-Za-z_]+\}", str(w))]
    if "fit" not in words:
        raise SweepError(f"{path}: command: {command!r} does not run `fl_lightning fit`")
    return words[words.index("fit") + 1:]


def expand(sweep: Sweep) -> list[dict[str, Any]]:
    """The grid: the cartesian product of the parameters' values, the first parameter
    varying slowest (file order)."""
    keys = [k for k, _ in sweep.parameters]
    return [dict(zip(keys, combo)) for combo in itertools.product(*(v for _, v in sweep.parameters))]


def cli_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return value
    return json.dumps(value)


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=,+-]", "_", text)


def config_name(values: dict[str, Any]) -> str:
    """``key1=v1,key2=v2`` in file order; characters outside [A-Za-z0-9._=,+-] become ``_``."""
    return _safe(",".join(f"{k}={cli_value(v)}" for k, v in values.items()))


# ---- running ---------------------------------------------------------------------------------
def plan(sweep: Sweep, runs_dir: str | Path, extra: list[str]) -> list[Configuration]:
    for word in extra:
        key = word.split("=", 1)[0]
        if key in _RESERVED or key.lstrip("-") in {k for k, _ in sweep.parameters}:
            raise SweepError(f"override {key} is set by the sweep itself (swept parameter, run.dir or ckpt_path)")
    configs = []
    for values in expand(sweep):
        name = config_name(values)
        run_dir = Path(runs_dir) / sweep.name / name
        args = [*sweep.fixed_args, *extra]
        for key, value in values.items():
            args += [f"--{key}", cli_value(value)]
        args += ["--run.dir", str(run_dir)]
        configs.append(Configuration(values=values, name=name, run_dir=run_dir, args=args))
    return configs


def target_rounds(args: list[str]) -> int:
    """federation.rounds of a configuration, from the real parser (also rejects a wrong key
    before any training starts)."""
    from fl_lightning.settings import build_parser

    return int(build_parser().parse_args(["fit", *args]).fit.federation.rounds)


def decide(config: Configuration, rounds: int) -> tuple[str, Optional[str]]:
    """(action, checkpoint): run | skip | resume."""
    summary_path = config.run_dir / "summary.json"
    if summary_path.is_file():
        try:
            if json.loads(summary_path.read_text()).get("rounds") == rounds:
                return "skip", None
        except json.JSONDecodeError:
            pass
    ckpt = config.run_dir / "checkpoints" / "last.ckpt"
    if ckpt.is_file():
        return "resume", str(ckpt)
    return "run", None


def fit_configuration(args: list[str]) -> dict:
    """One configuration's ``fit`` (its arguments, ``--ckpt_path`` included): the summary."""
    from fl_lightning.settings import build_federation

    _, cfg, federation = build_federation(["fit", *args])
    return federation.fit(ckpt_path=cfg.fit.ckpt_path)


@contextmanager
def _wandb_env(sweep_name: str):
    """W&B runs of the sweep stay on disk (``wandb sync`` later) unless WANDB_MODE is set,
    and are grouped under the sweep's name."""
    saved = {k: os.environ.get(k) for k in ("WANDB_MODE", "WANDB_RUN_GROUP")}
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_RUN_GROUP", sweep_name)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_sweep(sweep_file: str | Path, runs_dir: str | Path = "runs/sweeps", extra: Optional[list[str]] = None,
              dry_run: bool = False, stack: Optional[str] = None) -> list[Configuration]:
    sweep = load_sweep(sweep_file)
    configs = plan(sweep, runs_dir, list(extra or []))
    rounds = [target_rounds(c.args) for c in configs]  # all parsed before the first fit
    with _wandb_env(sweep.name):
        return run_configurations(configs, rounds, dry_run, stack)


def run_configurations(configs: list[Configuration], rounds: list[int], dry_run: bool = False,
                       stack: Optional[str] = None) -> list[Configuration]:
    """Each configuration run, skipped (its summary.json has ``rounds``) or resumed from its
    checkpoint: stacked (``stack``: grouped | padded) where the cohort engine is selected, else
    one after another."""
    if stack and not dry_run and run_stacked(configs, rounds, padded=stack == "padded"):
        return configs
    width = len(str(len(configs)))
    for i, (config, target) in enumerate(zip(configs, rounds), 1):
        action, ckpt = decide(config, target)
        head = f"[{i:>{width}}/{len(configs)}]"
        if dry_run:
            config.status = {"run": "would run", "skip": "would skip", "resume": "would resume"}[action]
            command = " ".join(["fl_lightning", "fit", *config.args, *(["--ckpt_path", ckpt] if ckpt else [])])
            print(f"{head} {config.status:<12} {config.name}: {command}", flush=True)
            continue
        if action == "skip":
            config.status = "skipped"
            print(f"{head} skipped  {config.name} (summary.json has {target} rounds) {config.run_dir}", flush=True)
            continue
        started = time.perf_counter()
        try:
            summary = fit_configuration([*config.args, *(["--ckpt_path", ckpt] if ckpt else [])])
        except Exception as err:  # a diverged run should not end the sweep; argument errors exit above
            _failed(config, head, err)
            continue
        _finished(config, head, summary, ckpt, time.perf_counter() - started)
    return configs


def _failed(config: Configuration, head: str, error: BaseException) -> None:
    config.status, config.error = "failed", f"{type(error).__name__}: {error}"
    print(f"{head} failed   {config.name}: {config.error}", flush=True)


def _finished(config: Configuration, head: str, summary: dict, ckpt: Optional[str], seconds: float) -> None:
    config.summary, config.status = summary, "resumed" if ckpt else "done"
    acc = summary.get("final_accuracy")
    acc_text = f"final accuracy {acc:.4f}" if acc is not None else "no accuracy"
    print(f"{head} {config.status:<8} {config.name}: {acc_text}, {summary['rounds']} rounds, {seconds:.1f} s "
          f"-> {config.run_dir}", flush=True)


def run_stacked(configs: list[Configuration], rounds: list[int], padded: bool = False) -> bool:
    """The configurations left to run, trained together as one stack (fl_lightning/stacking.py);
    False (after saying why) when they cannot be stacked here: the caller runs them one by one."""
    from fl_lightning.settings import build_federation
    from fl_lightning.stacking import StackedRun, fit_stacked, stackable

    runs, members = [], []
    for i, (config, target) in enumerate(zip(configs, rounds), 1):
        action, ckpt = decide(config, target)
        if action == "skip":
            config.status = "skipped"
            print(f"[{i}/{len(configs)}] skipped  {config.name} (summary.json has {target} rounds) {config.run_dir}",
                  flush=True)
            continue
        args = [*config.args, *(["--ckpt_path", ckpt] if ckpt else [])]
        if not any(a == "--run.progress" or a.startswith("--run.progress=") for a in args):
            args += ["--run.progress", "off"]  # one line per stacked step instead of every run's bars
        _, cfg, federation = build_federation(["fit", *args])
        runs.append(StackedRun(config.name, federation, cfg.fit.ckpt_path))
        members.append((config, ckpt))
    if not runs:
        return True
    why_not = stackable([run.federation for run in runs])
    if why_not is not None:
        print(f"--stack: {why_not}, so the {len(runs)} runs train one after another (as without --stack); "
              f"--trainer.engine cohort stacks them on this machine too", flush=True)
        return False
    print(f"--stack: {len(runs)} runs trained together", flush=True)
    fit_stacked(runs, padded=padded)
    for run, (config, ckpt) in zip(runs, members):
        head = f"[{configs.index(config) + 1}/{len(configs)}]"
        if run.error is None:
            _finished(config, head, run.summary, ckpt, run.seconds)
        elif isinstance(run.error, Exception):
            _failed(config, head, run.error)
        else:  # an interrupt: the sweep stops
            raise run.error
    return True


def build_sweep_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fl_lightning sweep", allow_abbrev=False,
        description="Run a W&B grid sweep file offline: one fit per configuration, skipping finished runs and "
                    "resuming interrupted ones. Other arguments (e.g. --federation.rounds 3) are passed to every fit.")
    parser.add_argument("sweep_file", help="a W&B sweep YAML with method: grid (e.g. sweeps/fedova_fmnist_epochs.yaml)")
    parser.add_argument("--runs-dir", default="runs/sweeps",
                        help="runs go to RUNS_DIR/<sweep name>/<key>=<value>,... (default: runs/sweeps)")
    parser.add_argument("--dry-run", action="store_true", help="print what would run, skip or resume; train nothing")
    parser.add_argument("--stack", nargs="?", const="grouped", choices=("grouped", "padded"), default=None,
                        help="train the configurations together, their clients in shared cohorts (one GPU, one "
                             "process: fl_lightning/stacking.py): runs of equal batch size and local epochs share "
                             "cohorts (grouped, the default), or all runs do, padded and masked (padded); where the "
                             "cohort engine is not selected (a CPU by default) they run one after another")
    return parser


def main(argv: list[str]) -> list[Configuration]:
    parser = build_sweep_parser()
    args, extra = parser.parse_known_args(argv)
    try:
        configs = run_sweep(args.sweep_file, args.runs_dir, extra, args.dry_run, args.stack)
    except SweepError as err:
        parser.error(str(err))
    failed = [c for c in configs if c.status == "failed"]
    if failed:
        print(f"{len(failed)} of {len(configs)} configurations failed: {', '.join(c.name for c in failed)}")
    return configs
