"""``python -m fl_lightning fit|validate|test --config FILE`` (LightningCLI conventions:
``--print_config``, dotted overrides such as ``--federation.rounds 3``, typed settings), plus
``sweep SWEEP_FILE`` (fl_lightning/sweep.py) and ``report RUN_DIR...`` (fl_lightning/report.py).

The command line only: the parser and the settings -> Federation factory are
fl_lightning/settings.py's, which every other entry point uses too."""

from __future__ import annotations

import json
import os
import sys
from typing import Optional

from fl_lightning.errors import RoundFailedError, RunDirInUseError
from fl_lightning.interrupts import RunInterrupted, stop_on_signals, stopped_line
from fl_lightning.settings import build_federation, evaluate_checkpoint, metrics_path, resolve_ckpt_path


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
        from fl_lightning.algorithms.athena import compose_cli

        return compose_cli.main(argv[1:])
    parser, cfg, federation = build_federation(argv)
    command = cfg.subcommand
    ckpt_path = resolve_ckpt_path(cfg[command].ckpt_path, federation.run_dir, command)
    if command == "fit":
        # --ckpt_path last before the first checkpoint: nothing to load, but a stopped run's
        # client results (run.checkpoint_clients) are still reused
        summary = federation.fit(ckpt_path=ckpt_path, resume=cfg.fit.ckpt_path is not None)
        if summary["final_accuracy"] is not None:
            print(f"final accuracy (mean of last {summary['final_window']} evaluations): "
                  f"{summary['final_accuracy']:.4f}; last: {summary['last_accuracy']:.4f}")
        print(f"summary: {federation.run_dir}/summary.json")
        return summary
    # validate/test: build_federation took the settings from the checkpoint (flags on top)
    metrics = evaluate_checkpoint(federation, ckpt_path, "test" if command == "test" else "train")
    record = {"round": federation.round, **metrics}
    print(json.dumps(record, indent=1))
    path = metrics_path(ckpt_path, command)
    path.write_text(json.dumps({"ckpt_path": str(ckpt_path), **record}, indent=1) + "\n")
    print(f"metrics: {path}")
    return metrics


# Bad input (settings, data files, checkpoints) and a diverging run: one line, no traceback.
USER_ERRORS = (ValueError, OSError, FloatingPointError, RoundFailedError, RunDirInUseError)


def run(argv: Optional[list[str]] = None) -> int:
    """``main`` as a program: the exit status, with a user error answered by one ``error:``
    line on stderr and status 1 instead of a traceback (FL_LIGHTNING_TRACEBACK=1 shows it);
    argument errors exit with 2 (the parser's own message). Ctrl-C or SIGTERM stops a run
    within seconds with one line saying how to resume, status 130 or 143
    (fl_lightning/interrupts.py)."""
    argv = list(argv if argv is not None else sys.argv[1:])
    try:
        with stop_on_signals():
            main(argv)
    except RunInterrupted as stop:
        print(f"fl_lightning: {stopped_line(stop, argv)}", file=sys.stderr, flush=True)
        return stop.exit_status
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
