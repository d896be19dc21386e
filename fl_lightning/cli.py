"""``python -m fl_lightning fit|validate|test --config FILE`` (LightningCLI conventions:
``--print_config``, dotted overrides such as ``--federation.rounds 3``, typed settings), plus
``sweep SWEEP_FILE`` (fl_lightning/sweep.py) and ``report RUN_DIR...`` (fl_lightning/report.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

from jsonargparse import ActionConfigFile, ArgumentParser, lazy_instance

from fl_lightning.config import (DataConfig, FederationConfig, ModelConfig, OptimizerConfig, PartitionConfig,
                                 RunConfig, TrainerConfig)
from fl_lightning.errors import RoundFailedError
from fl_lightning.strategies import FedOVA, Strategy

_GROUPS = {
    "data": DataConfig,
    "partition": PartitionConfig,
    "model": ModelConfig,
    "optimizer": OptimizerConfig,
    "federation": FederationConfig,
    "trainer": TrainerConfig,
    "run": RunConfig,
}


def _subcommand_parser(description: str) -> ArgumentParser:
    parser = ArgumentParser(description=description, exit_on_error=True)
    parser.add_argument("--config", action=ActionConfigFile, help="YAML file with any of the settings below")
    parser.add_argument("--seed", type=int, default=0, help="seeds the partition, initialisation, sampling and clients")
    for name, cls in _GROUPS.items():
        parser.add_class_arguments(cls, name)
    parser.add_subclass_arguments(Strategy, "algorithm", default=lazy_instance(FedOVA),
                                  help="the federated algorithm (server strategy)")
    parser.add_argument("--ckpt_path", type=Optional[str], default=None,
                        help="fit: resume from this checkpoint ('last': the run's checkpoints/last.ckpt if there "
                             "is one, else start afresh); validate/test: evaluate it")
    return parser


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="fl_lightning", description="Federated learning with one-vs-all and open-set detectors",
                            epilog="Also: `fl_lightning sweep SWEEP_FILE ...` runs a W&B grid sweep file offline and "
                                   "`fl_lightning report RUN_DIR ...` tabulates and plots runs, `fl_lightning compose --db_url URL` "
                                   "builds ATHENA-FL's one-vs-all model from a detector database (each with --help).")
    subcommands = parser.add_subcommands(dest="subcommand")
    subcommands.add_subcommand("fit", _subcommand_parser("Train a federation (resume with --ckpt_path)"))
    subcommands.add_subcommand("validate", _subcommand_parser("Evaluate a saved federation on the training set"))
    subcommands.add_subcommand("test", _subcommand_parser("Evaluate a saved federation on the test set"))
    return parser


def main(argv: Optional[list[str]] = None):
    """fit: the summary dict; validate/test: the metrics dict; sweep: the list of
    ``sweep.Configuration``; report: ``report.Report``."""
    argv = list(argv if argv is not None else sys.argv[1:])
    if argv and argv[0] == "sweep":  # own small parsers: they pass unknown arguments on to fit
        from fl_lightning import sweep

        return sweep.main(argv[1:])
    if argv and argv[0] == "report":
        from fl_lightning import report

        return report.main(argv[1:])
    if argv and argv[0] == "compose":
        from fl_lightning import compose_cli

        return compose_cli.main(argv[1:])
    parser, cfg, federation = build_federation(argv)
    command = cfg.subcommand
    sub_cfg = cfg[command]
    ckpt_path = resolve_ckpt_path(sub_cfg.ckpt_path, federation.run_dir, command)
    from fl_lightning import crashpoints

    crashpoints.instrument(federation)  # kill points of the crash-safety tests; nothing unless armed
    if command == "fit":
        summary = federation.fit(ckpt_path=ckpt_path)
        if summary["final_accuracy"] is not None:
            print(f"final accuracy (mean of last {summary['final_window']} evaluations): "
                  f"{summary['final_accuracy']:.4f}; last: {summary['last_accuracy']:.4f}")
        print(f"summary: {federation.run_dir}/summary.json")
        return summary
    if not ckpt_path:
        parser.error(f"{command} needs --ckpt_path (a checkpoint written by fit)")
    import json

    from fl_lightning.checkpoint import load_checkpoint

    federation.setup()
    federation.load_state_dict(load_checkpoint(ckpt_path))
    metrics = federation.evaluate("test" if command == "test" else "train")
    print(json.dumps({"round": federation.round, **metrics}, indent=1))
    return metrics


def build_federation(argv: list[str]):
    """(parser, parsed settings, Federation) for ``fit|validate|test ...`` arguments: the one
    place settings become a Federation (the CLI and the Flower ServerApp both use it)."""
    import json

    from fl_lightning.federation import Federation

    parser = build_parser()
    check_config_files(parser, argv)
    cfg = parser.parse_args(argv)
    command = cfg.subcommand
    resolved = parser.dump(cfg, skip_none=False, format="json_indented")
    init = parser.instantiate(cfg)[command]
    federation = Federation(
        **{name: init[name] for name in _GROUPS},
        algorithm=init["algorithm"],
        seed=cfg[command].seed,
        config=json.loads(resolved)[command],
    )
    check_settings(init)
    return parser, cfg, federation


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


# Bad input (settings, data files, checkpoints) and a diverging run: one line, no traceback.
USER_ERRORS = (ValueError, OSError, FloatingPointError, RoundFailedError)


def run(argv: Optional[list[str]] = None) -> int:
    """``main`` as a program: the exit status, with a user error answered by one ``error:``
    line on stderr and status 1 instead of a traceback (FL_LIGHTNING_TRACEBACK=1 shows it);
    argument errors exit with 2 (the parser's own message)."""
    try:
        main(argv)
    except USER_ERRORS as err:
        if os.environ.get("FL_LIGHTNING_TRACEBACK"):
            raise
        print(f"fl_lightning: error: {err}", file=sys.stderr)
        return 1
    return 0


def entry_point() -> None:
    """The ``fl-lightning`` console script: exits with ``run``'s status (``main`` returns
    results for Python callers, which ``sys.exit`` would print and turn into status 1)."""
    sys.exit(run())
