"""Settings -> Federation: the one place typed settings become a ``Federation``.

Every entry point builds its Federation here: the CLI (``fit|validate|test``), ``sweep``,
``report`` (re-evaluating a checkpoint from the settings saved in it), the Flower apps and
the benches. The settings are LightningCLI-style (``--config FILE``, dotted overrides such
as ``--federation.rounds 3``, typed dataclasses from fl_lightning.config), parsed by
jsonargparse so a wrong key or type is rejected with its dotted name."""

from __future__ import annotations

import difflib
import json
import re
import sys
from pathlib import Path
from typing import Any, Optional

import yaml
from jsonargparse import ActionConfigFile, ArgumentParser, Namespace, get_loader, set_loader

from fl_lightning.config import (DataConfig, FederationConfig, ModelConfig, OptimizerConfig, PartitionConfig,
                                 RunConfig, TrainerConfig)
from fl_lightning.strategies import Strategy

DEFAULT_ALGORITHM = "FedOVA"
# The algorithms' public module (the plug-in layout); fl_lightning.strategies is a compatibility
# alias that old configs and checkpoints name, read as the canonical path so that --print_config,
# summary.json and --help all say fl_lightning.algorithms.X.
ALGORITHMS_MODULE = "fl_lightning.algorithms."
_ALIAS_MODULE = "fl_lightning.strategies."
GROUPS = {
    "data": DataConfig,
    "partition": PartitionConfig,
    "model": ModelConfig,
    "optimizer": OptimizerConfig,
    "federation": FederationConfig,
    "trainer": TrainerConfig,
    "run": RunConfig,
}


def canonical_names(value: Any) -> Any:
    """``value`` with every ``fl_lightning.strategies.X`` string read as ``fl_lightning.algorithms.X``."""
    if isinstance(value, str) and value.startswith(_ALIAS_MODULE):
        return ALGORITHMS_MODULE + value[len(_ALIAS_MODULE):]
    if isinstance(value, dict):
        return {k: canonical_names(v) for k, v in value.items()}
    if isinstance(value, list):
        return [canonical_names(v) for v in value]
    return value


_YAML_LOADER = get_loader("yaml")
# config files and command-line values alike pass through the parser mode's loader
set_loader("fl_lightning", lambda text: canonical_names(_YAML_LOADER(text)), exceptions=(yaml.YAMLError,))


class SettingsParser(ArgumentParser):
    """jsonargparse's parser, answering a bad argument with the error and a "did you mean" first,
    then a one-line tip, instead of the whole usage before them (exit status 2 as before)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("parser_mode", "fl_lightning")  # jsonargparse builds inner parsers of this class too
        super().__init__(*args, **kwargs)

    def error(self, message: str, ex: Optional[Exception] = None):
        if not self.exit_on_error:  # an inner parser: jsonargparse catches and reports it
            super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self
        hint = did_you_mean(message, parser)
        prog = parser.prog.replace(" [options]", "")
        sys.stderr.write(f"error: {message.rstrip()}\n{hint}tip: `{prog} --help` lists the accepted options\n")
        self.exit(2)


def known_keys(parser: ArgumentParser) -> list[str]:
    """The dotted settings a parser accepts (``federation.rounds``), and its subcommands."""
    keys = [option[2:] for action in parser._actions for option in action.option_strings if option.startswith("--")]
    for action in parser._actions:
        if isinstance(getattr(action, "choices", None), dict):  # subcommands
            keys += list(action.choices)
    return keys


def did_you_mean(message: str, parser: ArgumentParser) -> str:
    """A "did you mean" line for the mistyped key, subcommand or algorithm in ``message`` (empty
    when nothing is close)."""
    if "invalid choice:" in message:
        found = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        typed, candidates = (found.group(1), re.findall(r"'([^']*)'", found.group(2))) if found else ("", [])
    elif 'Parser key "algorithm"' in message:
        from fl_lightning import algorithms

        found = re.search(r"Given value: (\S+)", message)
        typed, candidates = (found.group(1).rsplit(".", 1)[-1] if found else ""), list(algorithms.__all__)
    else:
        found = re.search(r"unrecognized arguments: --([\w.]+)", message) or \
            re.search(r"does not accept option '([\w.]+)'", message)
        typed, candidates = (found.group(1) if found else ""), known_keys(parser)
    close = difflib.get_close_matches(typed, candidates, n=1, cutoff=0.6) if typed else []
    if not close:
        return ""
    is_key = close[0] in known_keys(parser) and "." in close[0]
    return f"did you mean {'--' if is_key else ''}{close[0]}?\n"


def settings_parser(description: str = "The settings of a federation") -> ArgumentParser:
    """The parser of one federation's settings (a subcommand's arguments)."""
    parser = SettingsParser(description=description, exit_on_error=True)
    parser.add_argument("--config", action=ActionConfigFile, help="YAML file with any of the settings below")
    parser.add_argument("--seed", type=int, default=0, help="seeds the partition, initialisation, sampling and clients")
    for name, cls in GROUPS.items():
        parser.add_class_arguments(cls, name)
    # Optional with None, not a default instance: jsonargparse carries a default instance's
    # init args over to another class chosen later (its issue #460), which gave every
    # `--algorithm X` FedOVA's weighted=False; None is FedOVA with its own defaults
    # (with_default_algorithm).
    parser.add_argument("--algorithm", type=Optional[Strategy], default=None,
                        help=f"the federated algorithm (server strategy); unset: {DEFAULT_ALGORITHM}")
    parser.add_argument("--ckpt_path", type=Optional[str], default=None,
                        help="fit: resume from this checkpoint ('last': the run's checkpoints/last.ckpt if there "
                             "is one, else start afresh); validate/test: evaluate it")
    return parser


def with_default_algorithm(cfg: Namespace) -> Namespace:
    """``algorithm`` unset: DEFAULT_ALGORITHM with its own defaults (in place; returns ``cfg``)."""
    if cfg.get("algorithm") is None:
        parser = ArgumentParser()
        parser.add_argument("--algorithm", type=Optional[Strategy])
        cfg.algorithm = parser.parse_args(["--algorithm", DEFAULT_ALGORITHM]).algorithm
    return cfg


def build_parser() -> ArgumentParser:
    """``fit|validate|test`` and their settings (the ``fl_lightning`` command line)."""
    parser = SettingsParser(prog="fl_lightning", description="Federated learning with one-vs-all and open-set detectors",
                            epilog="Also: `fl_lightning sweep SWEEP_FILE ...` runs a W&B grid sweep file offline and "
                                   "`fl_lightning report RUN_DIR ...` tabulates and plots runs, `fl_lightning compose --db_url URL` "
                                   "builds ATHENA-FL's one-vs-all model from a detector database (each with --help).")
    subcommands = parser.add_subcommands(dest="subcommand")
    subcommands.add_subcommand("fit", settings_parser("Train a federation (resume with --ckpt_path)"))
    subcommands.add_subcommand("validate", settings_parser("Evaluate a saved federation on the training set"))
    subcommands.add_subcommand("test", settings_parser("Evaluate a saved federation on the test set"))
    return parser


def build_federation(argv: list[str], **options: Any):
    """(parser, parsed settings, Federation) for ``fit|validate|test ...`` arguments.
    ``options`` go to the Federation as they are (e.g. ``callbacks=[]``). validate/test: the
    settings are the checkpoint's, with what ``argv`` names on top (evaluation_settings)."""
    parser = build_parser()
    argv = canonical_names(list(argv))
    check_config_files(parser, argv)
    cfg = parser.parse_args(argv)
    command = cfg.subcommand
    if command in ("validate", "test"):
        ckpt_path = resolve_ckpt_path(cfg[command].ckpt_path, cfg[command].run.dir, command)
        if not ckpt_path:
            parser.error(f"{command} needs --ckpt_path (a checkpoint written by fit)")
        cfg[command] = evaluation_settings(ckpt_path, argv[argv.index(command) + 1:])
        cfg[command].ckpt_path = ckpt_path
    with_default_algorithm(cfg[command])
    resolved = json.loads(parser.dump(cfg, skip_none=False, format="json_indented"))[command]
    return parser, cfg, _federation(parser.instantiate(cfg)[command], cfg[command].seed, resolved, options)


def federation_from_config(config: dict, **options: Any):
    """The Federation of a saved configuration (a checkpoint's or summary.json's ``config``:
    the resolved settings), checked as the command line checks them."""
    parser = settings_parser()
    cfg = with_default_algorithm(saved_settings(parser, config))
    resolved = json.loads(parser.dump(cfg, skip_none=False, format="json_indented"))
    return _federation(parser.instantiate(cfg), cfg.seed, resolved, options)


def saved_settings(parser: ArgumentParser, config: dict) -> Namespace:
    """A saved configuration (resolved settings) parsed as settings."""
    config = {k: v for k, v in config.items() if k not in ("config", "__path__")}
    algorithm = config.get("algorithm")
    if isinstance(algorithm, dict) and isinstance(algorithm.get("class_path"), str):
        # by class name: configs saved before the strategies moved to fl_lightning/algorithms/
        config["algorithm"] = {**algorithm, "class_path": algorithm["class_path"].rsplit(".", 1)[-1]}
    return parser.parse_object(config)


def evaluation_settings(ckpt_path: str, args: list[str]) -> Namespace:
    """validate/test: the settings the checkpoint was written with, and on top of them only what
    ``args`` names (a ``--config`` file's keys, dotted flags), so that a checkpoint of any settings
    is evaluated without repeating them and what the user gives explicitly wins."""
    from fl_lightning.checkpoint import load_checkpoint

    parser = settings_parser()
    saved = saved_settings(parser, load_checkpoint(ckpt_path)["config"])
    return parser.parse_args(args, namespace=saved)


def metrics_path(ckpt_path: str | Path, command: str) -> Path:
    """Where validate/test write their metrics: ``<run dir>/<command>_metrics.json``, the run dir
    being the folder holding the checkpoint's ``checkpoints/`` (else the checkpoint's folder)."""
    folder = Path(ckpt_path).resolve().parent
    return (folder.parent if folder.name == "checkpoints" else folder) / f"{command}_metrics.json"


def _federation(init: Namespace, seed: int, resolved: dict, options: dict):
    from fl_lightning.federation import Federation

    federation = Federation(**{name: init[name] for name in GROUPS}, algorithm=init["algorithm"], seed=seed,
                            config=resolved, **options)
    check_settings(init)
    return federation


def check_config_files(parser: ArgumentParser, argv: list[str]) -> None:
    """A ``--config`` file that is not YAML, named (the parser's own message does not say which)."""
    import yaml

    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            path = argv[i + 1]
        elif arg.startswith("--config="):
            path = arg.partition("=")[2]
        else:
            continue
        if Path(path).is_file():
            with open(path) as f:
                try:
                    yaml.safe_load(f)
                except yaml.YAMLError as err:
                    parser.error(f"--config {path} is not valid YAML: {' '.join(str(err).split())}")


def check_settings(init) -> None:
    """Constraints between setting groups that no single group can check."""
    clients, fraction = init["partition"].num_clients, init["federation"].client_fraction
    if clients >= 1 and fraction * clients < 1:
        raise ValueError(
            f"federation.client_fraction={fraction} x partition.num_clients={clients} = {fraction * clients:g} < 1: "
            f"less than one client per round; raise client_fraction to at least {1 / clients:g}"
        )


def resolve_ckpt_path(ckpt_path: Optional[str], run_dir: str, command: str) -> Optional[str]:
    """``last`` is the run's own ``checkpoints/last.ckpt`` (Lightning's convention): after a
    crash, the same command resumes from the latest complete checkpoint, or starts afresh
    when the run died before writing one. Fit only; test/validate need a checkpoint."""
    if ckpt_path != "last":
        return ckpt_path
    last = Path(run_dir) / "checkpoints" / "last.ckpt"
    if last.is_file() or command != "fit":
        return str(last)
    return None  # the loop says so: "resumed at round 0 of R (no checkpoint yet)"


def evaluate_checkpoint(federation, ckpt_path: str | Path, split: str = "test") -> dict[str, float]:
    """The metrics of ``federation`` restored from ``ckpt_path`` on ``split`` (test | train),
    after checking that the checkpoint was written with the same settings."""
    from fl_lightning.checkpoint import load_checkpoint

    federation.setup()
    federation.load_state_dict(load_checkpoint(ckpt_path))
    return federation.evaluate(split)
