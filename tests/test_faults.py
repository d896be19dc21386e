"""Client failures (injected in process): a client that raises, runs past its time budget or
returns non-finite values is dropped from its round and logged by id; the round completes
from the others; below federation.min_clients the round is retried, then the run stops."""

import pytest
import torch

import fl_lightning.client as client_module
from fl_lightning.cli import main
from fl_lightning.plugins import client_plugin
from tests.conftest import tiny_args

real_train = client_module.train_client


def run(tmp_path, *extra):
    return main(["fit", *tiny_args(tmp_path, "--federation.rounds", "2", "--federation.client_fraction", "0.5", *extra)])


def inject(monkeypatch, fault):
    """``fault(task, round_index, attempt, train)`` may raise, or return a replacement result
    (``train()`` runs the real local training)."""
    attempts: dict = {}

    def faulty(ctx, task, indices, round_index, client_state=None):
        key = (round_index, task.client_id)
        attempts[key] = attempts.get(key, 0) + 1
        train = lambda: real_train(ctx, task, indices, round_index, client_state)
        replaced = fault(task, round_index, attempts[key], train)
        return replaced if replaced is not None else train()

    monkeypatch.setattr(client_module, "train_client", faulty)


def test_a_raising_client_is_dropped_and_logged_and_the_round_completes(tmp_path, monkeypatch, capsys):
    clean = run(tmp_path / "clean")
    victim = 3 if 3 in _sampled(clean) else _sampled(clean)[0]

    def fault(task, round_index, attempt, train):
        if task.client_id == victim and round_index == 1:
            raise OSError("connection reset by peer")

    inject(monkeypatch, fault)
    faulty = run(tmp_path / "faulty")
    first = faulty["history"][0]
    assert first["clients/failed"] == 1 and first["clients"] == clean["history"][0]["clients"] - 1
    assert f"client {victim}: OSError: connection reset by peer" in first["failures"]
    assert f"round 1: client {victim} dropped" in capsys.readouterr().err
    assert faulty["history"][1]["clients/failed"] == 0


def _sampled(summary):
    # FedOVA group sizes name classes, not clients; re-derive round 1's sample instead.
    from fl_lightning.strategy import sample_clients

    return sample_clients(torch.Generator().manual_seed(summary["config"]["seed"] + 1), 10, 0.5)


def test_non_finite_parameters_drop_only_that_client(tmp_path, monkeypatch):
    victim = _sampled({"config": {"seed": 0}})[0]

    def fault(task, round_index, attempt, train):
        if task.client_id == victim:
            result = train()
            result.params = {k: torch.full_like(v, float("nan")) for k, v in result.params.items()}
            return result

    inject(monkeypatch, fault)
    summary = run(tmp_path)
    assert f"client {victim}: non-finite values" in summary["history"][0]["failures"]
    assert summary["history"][0]["clients/failed"] == 1
    assert all(torch.isfinite(torch.tensor(m["test/accuracy"])) for m in summary["history"])


def test_a_client_past_its_time_budget_is_dropped(tmp_path, monkeypatch):
    """A simulated clock (wall time under a loaded CI machine would make any small budget
    flaky): each of the victim's steps takes 10 "seconds", everyone else's none."""
    victim = _sampled({"config": {"seed": 0}})[0]
    now = [0.0]
    monkeypatch.setattr(client_module, "_clock", lambda: now[0])

    plugin = client_plugin("detectors")
    real_build = plugin.build

    def slow_build(ctx, task, client_state):
        module = real_build(ctx, task, client_state)
        if task.client_id == victim:
            step = module.training_step

            def slow_step(*args, **kwargs):
                now[0] += 10.0
                return step(*args, **kwargs)

            module.training_step = slow_step
        return module

    monkeypatch.setattr(plugin, "build", slow_build)
    summary = run(tmp_path, "--federation.client_timeout", "5")
    assert f"client {victim}: ClientTimeout" in summary["history"][0]["failures"]
    assert summary["history"][0]["clients/failed"] == 1


def test_a_flaky_client_is_retried_and_the_run_equals_a_fault_free_one(tmp_path, monkeypatch):
    clean = run(tmp_path / "clean", "--federation.min_clients", "5")

    def fault(task, round_index, attempt, train):
        if round_index == 1 and attempt == 1:
            raise RuntimeError("transient")

    inject(monkeypatch, fault)
    retried = run(tmp_path / "retried", "--federation.min_clients", "5", "--federation.round_retries", "1")
    assert [m["test/accuracy"] for m in retried["history"]] == [m["test/accuracy"] for m in clean["history"]]


def test_below_min_clients_after_retries_stops_with_the_failures_listed(tmp_path, monkeypatch):
    def fault(task, round_index, attempt, train):
        if task.client_id % 2 == 0:
            raise RuntimeError("disk full")

    inject(monkeypatch, fault)
    with pytest.raises(RuntimeError, match=r"fewer than federation.min_clients=5, after 2 attempt\(s\).*disk full"):
        run(tmp_path, "--federation.min_clients", "5", "--federation.round_retries", "1")
    assert not (tmp_path / "summary.json").exists()


def test_failures_in_worker_processes_are_dropped_too(tmp_path, monkeypatch):
    victim = _sampled({"config": {"seed": 0}})[0]

    def fault(task, round_index, attempt, train):
        if task.client_id == victim:
            raise ValueError("bad local data")

    inject(monkeypatch, fault)  # patched before the pool forks: workers inherit it
    summary = run(tmp_path, "--trainer.workers", "2")
    assert f"client {victim}: ValueError: bad local data" in summary["history"][0]["failures"]
