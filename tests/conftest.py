import os

import pytest
import torch

os.environ.setdefault("WANDB_MODE", "disabled")


@pytest.fixture(autouse=True)
def _one_thread():
    # Tests compare results bit for bit; a fixed thread count fixes the reduction order.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


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


def outcome(summary):
    """Everything a run computed, round by round (wall-clock times left out): equal outcomes
    are equal runs."""
    return [{k: v for k, v in m.items() if not k.startswith("time/")} for m in summary["history"]]


# Tests that take a minute each (a Flower federation on localhost) go first, so that the two
# xdist workers run them beside the many short tests rather than after them.
LONG_FIRST = ("test_flower.py::test_every_algorithm_on_flower", "test_flower.py::test_flower_localhost")


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: not any(name in item.nodeid for name in LONG_FIRST))
