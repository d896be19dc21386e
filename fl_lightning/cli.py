"""``python -m fl_lightning fit|validate|test --config FILE`` (LightningCLI conventions:
``--print_config``, dotted overrides such as ``--federation.rounds 3``, typed settings), plus
``sweep SWEEP_FILE`` (fl_lightning/sweep.py) and ``report RUN_DIR...`` (fl_lightning/report.py)."""

from __future__ import annotations

import sys
from typing import Optional

from jsonargparse import ActionConfigFile, ArgumentParser, lazy_instance

from fl_lightning.config import (DataConfig, FederationConfig, ModelConfig, OptimizerConfig, PartitionConfig,
                                 RunConfig, TrainerConfig)
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
                        help="fit: resume from this checkpoint; validate/test: evaluate it")
    return parser


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="fl_lightning", description="Federated learning with one-vs-all and open-set detectors",
                            epilog="Also: `fl_lightning sweep SWEEP_FILE ...` runs a W&B grid sweep file offline and "
                                   "`fl_lightning report RUN_DIR ...` tabulates and plots runs (each with --help).")
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
    from fl_lightning.federation import Federation

    parser = build_parser()
    cfg = parser.parse_args(argv)
    command = cfg.subcommand
    sub_cfg = cfg[command]
    resolved = parser.dump(cfg, skip_none=False, format="json_indented")
    init = parser.instantiate(cfg)[command]
    import json

    federation = Federation(
        **{name: init[name] for name in _GROUPS},
        algorithm=init["algorithm"],
        seed=sub_cfg.seed,
        config=json.loads(resolved)[command],
    )
    if command == "fit":
        summary = federation.fit(ckpt_path=sub_cfg.ckpt_path)
        if summary["final_accuracy"] is not None:
            print(f"final accuracy (mean of last {summary['final_window']} evaluations): "
                  f"{summary['final_accuracy']:.4f}; last: {summary['last_accuracy']:.4f}")
        print(f"summary: {federation.run_dir}/summary.json")
        return summary
    if not sub_cfg.ckpt_path:
        parser.error(f"{command} needs --ckpt_path (a checkpoint written by fit)")
    from fl_lightning.checkpoint import load_checkpoint

    federation.setup()
    federation.load_state_dict(load_checkpoint(sub_cfg.ckpt_path))
    metrics = federation.evaluate("test" if command == "test" else "train")
    print(json.dumps({"round": federation.round, **metrics}, indent=1))
    return metrics


def entry_point() -> None:
    """The ``fl-lightning`` console script: ``main`` returns results for Python callers, which
    ``sys.exit`` would print and turn into exit status 1."""
    main()
