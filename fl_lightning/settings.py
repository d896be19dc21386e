"""Settings -> Federation: the one place typed settings become a ``Federation``.

Every entry point builds its Federation here: the CLI (``fit|validate|test``), ``sweep``,
``report`` (re-evaluating a checkpoint from the settings saved in it), the Flower apps and
the benches. The settings are LightningCLI-style (``--config FILE``, dotted overrides such
as ``--federation.rounds 3``, typed dataclasses from fl_lightning.config), parsed by
jsonargparse so a wrong key or type is rejected with its dotted name."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

from jsonargparse import ActionConfigFile, ArgumentParser, Namespace

from fl_lightning.config import (DataConfig, FederationConfig, ModelConfig, OptimizerConfig, PartitionConfig,
                                 RunConfig, TrainerConfig)
from fl_lightning.strategies import Strategy

DEFAULT_ALGORITHM = "FedOVA"
GROUPS = {
    "data": DataConfig,
    "partition": PartitionConfig,
    "model": ModelConfig,
    "optimizer": OptimizerConfig,
    "federation": FederationConfig,
    "trainer": TrainerConfig,
    "run": RunConfig,
}


def settings_parser(description: str = "The settings of a federation") -> ArgumentParser:
    """The parser of one federation's settings (a subcommand's arguments)."""
    parser = ArgumentParser(description=description, exit_on_error=True)
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
    parser = ArgumentParser(prog="fl_lightning", description="Federated learning with one-vs-all and open-set detectors",
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
    ``options`` go to the Federation as they are (e.g. ``callbacks=[]``)."""
    parser = build_parser()
    check_config_files(parser, argv)
    cfg = parser.parse_args(argv)
    command = cfg.subcommand
    with_default_algorithm(cfg[command])
    resolved = json.loads(parser.dump(cfg, skip_none=False, format="json_indented"))[command]
    return parser, cfg, _federation(parser.instantiate(cfg)[command], cfg[command].seed, resolved, options)


def federation_from_config(config: dict, **options: Any):
    """The Federation of a saved configuration (a checkpoint's or summary.json's ``config``:
    the resolved settings), checked as the command line checks them."""
    parser = settings_parser()
    config = {k: v for k, v in config.items() if k not in ("config", "__path__")}
    algorithm = config.get("algorithm")
    if isinstance(algorithm, dict) and isinstance(algorithm.get("class_path"), str):
        # by class name: configs saved before the strategies moved to fl_lightning/algorithms/
        config["algorithm"] = {**algorithm, "class_path": algorithm["class_path"].rsplit(".", 1)[-1]}
    cfg = with_default_algorithm(parser.parse_object(config))
    resolved = json.loads(parser.dump(cfg, skip_none=False, format="json_indented"))
    return _federation(parser.instantiate(cfg), cfg.seed, resolved, options)


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
    print(f"--ckpt_path last: no checkpoint in {last.parent} yet; starting from round 0", file=sys.stderr)
    return None


def evaluate_checkpoint(federation, ckpt_path: str | Path, split: str = "test") -> dict[str, float]:
    """The metrics of ``federation`` restored from ``ckpt_path`` on ``split`` (test | train),
    after checking that the checkpoint was written with the same settings."""
    from fl_lightning.checkpoint import load_checkpoint

    federation.setup()
    federation.load_state_dict(load_checkpoint(ckpt_path))
    return federation.evaluate(split)
