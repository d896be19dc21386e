"""experiments/fedov_stacked.py: its runs land where experiments/reproduction.sh puts them, and
its stacks group them by cell or by data set."""

from tests.conftest import experiment_script


def _script():
    return experiment_script("fedov_stacked")


def test_runs_are_named_as_reproduction_sh_names_them(tmp_path):
    configs = _script().configurations("mnist", ["C2"], ["fedov", "closeset"], [0, 2], 200, "_code", tmp_path,
                                       ["--trainer.accelerator", "gpu"])
    assert [c.run_dir for c in configs] == [tmp_path / "mnist_C2_fedov_code_e200" / "seed0",
                                           tmp_path / "mnist_C2_fedov_code_e200" / "seed2",
                                           tmp_path / "mnist_C2_closeset_code_e200" / "seed0",
                                           tmp_path / "mnist_C2_closeset_code_e200" / "seed2"]
    fedov, closeset = configs[0].args, configs[2].args
    assert fedov[fedov.index("--partition.labels_per_client") + 1] == "2"
    assert fedov[fedov.index("--federation.local_epochs") + 1] == "200"
    assert fedov[fedov.index("--seed") + 1] == "0" and "--algorithm" not in fedov
    assert closeset[closeset.index("--algorithm") + 1] == "CloseSetVoting"
    assert fedov[fedov.index("--trainer.accelerator") + 1] == "gpu"
    # E = 20, reproduction.sh's default budget, has no E tag
    (run,) = _script().configurations("fmnist", ["D05"], ["fedov"], [1], 20, "_code", tmp_path, [])
    assert run.run_dir == tmp_path / "fmnist_D05_fedov_code" / "seed1"


def test_cifar_runs_read_the_cifar_config_and_only_they_the_image_pack(tmp_path):
    pack = tmp_path / "cifar10_q75.npz"
    (run,) = _script().configurations("cifar", ["C2"], ["fedov"], [0], 200, "_code", tmp_path, [], pack)
    assert run.run_dir == tmp_path / "cifar_C2_fedov_code_e200" / "seed0"
    assert run.args[run.args.index("--config") + 1].endswith("configs/fedov_cifar.yaml")
    assert run.args[run.args.index("--data.image_pack") + 1] == str(pack)
    (mnist,) = _script().configurations("mnist", ["C2"], ["fedov"], [0], 200, "_code", tmp_path, [], pack)
    assert "--data.image_pack" not in mnist.args


def test_stacks_group_runs_by_cell_or_by_data_set():
    groups = _script().stack_groups(["fmnist", "mnist"], ["C1", "C2"], "cell")
    assert groups == [("fmnist", ["C1"]), ("fmnist", ["C2"]), ("mnist", ["C1"]), ("mnist", ["C2"])]
    assert _script().stack_groups(["fmnist", "mnist"], ["C1", "C2"], "data") == [("fmnist", ["C1", "C2"]),
                                                                               ("mnist", ["C1", "C2"])]


def test_a_stopped_stack_says_what_it_kept_and_how_to_go_on(tmp_path, monkeypatch, capsys):
    import signal

    from fl_lightning import sweep
    from fl_lightning.interrupts import RunInterrupted

    def stopped(configs, rounds, stack):
        stop = RunInterrupted(signal.SIGINT)
        stop.where, stop.kept = "with 2 stacked runs unfinished", ["mnist_C1_fedov_code_e3/seed0: nothing yet"]
        raise stop

    monkeypatch.setattr(sweep, "run_configurations", stopped)
    argv = ["--epochs", "3", "--data", "mnist", "--parts", "C1", "--runs-root", str(tmp_path)]
    assert _script().main(argv) == 130  # as a shell reports SIGINT
    line = capsys.readouterr().err.strip()
    assert line.startswith("fedov_stacked: stopped by SIGINT with 2 stacked runs unfinished "
                           "(kept: mnist_C1_fedov_code_e3/seed0: nothing yet); finished runs are kept")
    assert line.endswith(f"python experiments/fedov_stacked.py --epochs 3 --data mnist --parts C1 --runs-root {tmp_path}")
