import importlib.util
import os
from pathlib import Path

import pytest
import torch
from torch import nn

os.environ.setdefault("WANDB_MODE", "disabled")
# A clean machine: no data copy found outside the folders a test names (fl_lightning/data/sources.py).
os.environ.setdefault("FL_LIGHTNING_DATA_FALLBACKS", "off")


@pytest.fixture(autouse=True)
def _one_thread():
    # Tests compare results bit for bit; a fixed thread count fixes the reduction order.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def experiment_script(name: str):
    """The module of ``experiments/<name>.py`` (a script folder, not a package)."""
    path = Path(__file__).resolve().parent.parent / "experiments" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_args(run_dir, *extra):
    """The real CLI, shrunk: synthetic data, 10 clients, 2 local epochs, no logger."""
    return [
        "--data.name", "synthetic", "--data.synthetic_size", "600",
        "--partition.num_clients", "10", "--partition.labels_per_client", "2",
        "--federation.client_fraction", "0.3", "--federation.local_epochs", "2",
        "--federation.batch_size", "10", "--federation.final_window", "2",
        "--trainer.threads", "1", "--run.logger", "none", "--run.progress", "false",
        "--run.dir", str(run_dir), *extra,
    ]


def smoothed(network: nn.Module) -> nn.Module:
    """``network`` with softplus for every ReLU and average for every max pooling (the same
    parameters, the same names): a loss smooth in its parameters and inputs.

    Tests that train the same network along two code paths (a cohort against per-client
    training, co-trained detectors against single ones) compare sums computed in different
    orders, which differ by float rounding. On a smooth network that difference stays at
    rounding level through training. With ReLU and max pooling it does not: a rounding
    difference that moves a pre-activation across 0, or reorders two near-equal values of a
    pooling window, changes a gradient by a finite jump that later steps carry forward
    (after two rounds of FedProx: below 1e-5 on one CPU, 0.08 on an AMD EPYC, whose kernels
    round otherwise). No fixed tolerance separates such a jump from a real error on every
    machine, so exact comparisons of training paths run on smoothed networks."""
    for name, layer in network.named_children():
        if isinstance(layer, nn.ReLU):
            setattr(network, name, nn.Softplus())
        elif isinstance(layer, nn.MaxPool2d):
            setattr(network, name, nn.AvgPool2d(layer.kernel_size))
        else:
            smoothed(layer)
    return network


def outcome(summary):
    """Everything a run computed, round by round (wall-clock times left out): equal outcomes
    are equal runs."""
    return [{k: v for k, v in m.items() if not k.startswith("time/")} for m in summary["history"]]


# Tests that take a minute each (a Flower federation on localhost) go first, so that the two
# xdist workers run them beside the many short tests rather than after them.
LONG_FIRST = ("test_flower.py::test_every_algorithm_on_flower", "test_flower.py::test_flower_localhost")


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: not any(name in item.nodeid for name in LONG_FIRST))
