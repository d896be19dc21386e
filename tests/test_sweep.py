import os
from pathlib import Path

import pytest

from fl_lightning import cli, sweep
from tests.conftest import tiny_args

REPO = Path(__file__).resolve().parents[1]


def write(path, text):
    path.write_text(text)
    return path


def tiny_fixed(*drop):
    """tiny_args without run.dir (the sweep sets it) and without the swept keys."""
    args = tiny_args("unused")
    out = []
    for key, value in zip(args[::2], args[1::2]):
        if key not in ("--run.dir", *drop):
            out += [key, value]
    return out


SWEEP_2X2 = """\
method: grid
parameters:
  federation.local_epochs: {values: [1, 2]}
  optimizer.lr: {values: [0.05, 0.1]}
  federation.batch_size: {value: 0}
command:
  - ${env}
  - ${interpreter}
  - -m
  - fl_lightning
  - fit
  - --config
  - some.yaml
  - --run.logger
  - wandb
  - ${args}
"""


def test_grid_is_the_cartesian_product_in_file_order(tmp_path):
    s = sweep.load_sweep(write(tmp_path / "grid.yaml", SWEEP_2X2))
    assert s.name == "grid"
    assert s.fixed_args == ["--config", "some.yaml", "--run.logger", "wandb"]
    assert sweep.expand(s) == [
        {"federation.local_epochs": 1, "optimizer.lr": 0.05, "federation.batch_size": 0},
        {"federation.local_epochs": 1, "optimizer.lr": 0.1, "federation.batch_size": 0},
        {"federation.local_epochs": 2, "optimizer.lr": 0.05, "federation.batch_size": 0},
        {"federation.local_epochs": 2, "optimizer.lr": 0.1, "federation.batch_size": 0},
    ]
    configs = sweep.plan(s, tmp_path / "runs", ["--federation.rounds", "3"])
    assert configs[1].run_dir == tmp_path / "runs" / "grid" / "federation.local_epochs=1,optimizer.lr=0.1,federation.batch_size=0"
    assert configs[1].args == ["--config", "some.yaml", "--run.logger", "wandb", "--federation.rounds", "3",
                               "--federation.local_epochs", "1", "--optimizer.lr", "0.1", "--federation.batch_size", "0",
                               "--run.dir", str(configs[1].run_dir)]
    with pytest.raises(sweep.SweepError, match="optimizer.lr"):
        sweep.plan(s, tmp_path / "runs", ["--optimizer.lr=0.5"])  # a swept setting cannot be overridden


@pytest.mark.parametrize("name, size", [("fedova_fmnist_batch.yaml", 4), ("fedova_fmnist_epochs.yaml", 4),
                                        ("fedova_fmnist_seeds.yaml", 3)])
def test_the_repository_sweeps_load(name, size):
    s = sweep.load_sweep(REPO / "sweeps" / name)
    assert len(sweep.expand(s)) == size
    assert s.fixed_args == ["--config", "configs/fedova_fmnist.yaml", "--run.logger", "wandb"]


def test_non_grid_sweeps_and_unknown_parameter_forms_are_refused(tmp_path, capsys):
    bayes = write(tmp_path / "bayes.yaml", SWEEP_2X2.replace("method: grid", "method: bayes"))
    with pytest.raises(SystemExit):
        cli.main(["sweep", str(bayes)])
    assert "method: 'bayes'" in capsys.readouterr().err
    ranged = write(tmp_path / "ranged.yaml",
                   SWEEP_2X2.replace("optimizer.lr: {values: [0.05, 0.1]}", "optimizer.lr: {min: 0.01, max: 0.1}"))
    with pytest.raises(sweep.SweepError, match="parameter 'optimizer.lr'"):
        sweep.load_sweep(ranged)


def test_sweep_runs_skips_and_resumes(tmp_path, monkeypatch, capsys):
    file = write(tmp_path / "tiny.yaml", """\
method: grid
parameters:
  federation.local_epochs: {values: [1, 2]}
command: [fl_lightning, fit, --run.logger, wandb]
""")
    fits = []
    real_fit = sweep.fit_configuration

    def counting_fit(args):
        fits.append(list(args))
        return real_fit(args)

    monkeypatch.setattr(sweep, "fit_configuration", counting_fit)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    runs = tmp_path / "runs"
    argv = [str(file), "--runs-dir", str(runs), *tiny_fixed("--federation.local_epochs"), "--federation.rounds", "2"]

    first = sweep.main(argv)
    assert [c.status for c in first] == ["done", "done"] and len(fits) == 2
    assert "WANDB_MODE" not in os.environ  # forced to offline during the sweep only
    dirs = [runs / "tiny" / "federation.local_epochs=1", runs / "tiny" / "federation.local_epochs=2"]
    assert [c.run_dir for c in first] == dirs
    assert all((d / "summary.json").is_file() for d in dirs)
    assert first[1].summary["config"]["federation"]["local_epochs"] == 2
    assert first[1].summary["config"]["run"]["logger"] == "none"  # the overrides come after the command's arguments

    again = sweep.main(argv)
    assert [c.status for c in again] == ["skipped", "skipped"] and len(fits) == 2
    assert [c.status for c in sweep.main([*argv, "--dry-run"])] == ["would skip", "would skip"] and len(fits) == 2

    (dirs[1] / "summary.json").unlink()  # an interrupted run: checkpoint, no summary
    resumed = sweep.main(argv)
    assert [c.status for c in resumed] == ["skipped", "resumed"] and len(fits) == 3
    assert fits[-1][-2:] == ["--ckpt_path", str(dirs[1] / "checkpoints" / "last.ckpt")]
    assert resumed[1].summary["final_accuracy"] == first[1].summary["final_accuracy"]
    assert resumed[1].summary["history"] == first[1].summary["history"]

    longer = sweep.main([*argv, "--federation.rounds", "3"])  # more rounds: both continue from their checkpoints
    assert [c.status for c in longer] == ["resumed", "resumed"] and len(fits) == 5
    assert [c.summary["rounds"] for c in longer] == [3, 3]
    out = capsys.readouterr().out
    assert "[1/2] done" in out and "[2/2] skipped" in out and "[2/2] resumed" in out
