"""``optimizer.keep_state``: a client's optimizer state carried from one of its rounds to its next
(callbacks/optimizer_state.py), as a client that compiles its model once and fits it every round."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fl_lightning.algorithms.baselines.classifier import classifier_task
from fl_lightning.callbacks.optimizer_state import PREFIX
from fl_lightning.algorithms.fedova.detectors import detector_task
from fl_lightning.checkpoint import load_checkpoint
from fl_lightning.cli import main
from fl_lightning.client import ClientContext, CohortJob, make_trainer, train_client, train_in_cohorts
from fl_lightning.cohort.engine import CohortTrainer
from fl_lightning.config import FederationConfig, OptimizerConfig, TrainerConfig, check_optimizer
from tests.conftest import tiny_args


def _client(outputs: int = 3):
    """A linear model and 12 samples trained in one full batch (the step does not depend on the
    batches' order)."""
    torch.manual_seed(0)
    template = nn.Sequential(nn.Flatten(), nn.Linear(4, outputs))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(12, 4, generator=g), torch.arange(12) % 3
    ctx = ClientContext(x, y, template, FederationConfig(local_epochs=1, batch_size=0),
                        TrainerConfig(accelerator="cpu", precision="32-true"), seed=0)
    return template, x, y, ctx


def _two_rounds(keep_state: bool, classes=((), ())):
    """One client's parameters after two rounds of one full-batch Adam step each, the server
    sending back the client's own parameters (FedAvg over this one client)."""
    template, x, y, ctx = _client()
    optimizer = OptimizerConfig("adam", lr=0.05, keep_state=keep_state)
    params = {k: v.detach().clone() for k, v in template.state_dict().items()}
    kept = {}
    for round_index, held in enumerate(classes, start=1):
        task = classifier_task(0, params, optimizer, classes=held)
        result = train_client(ctx, task, np.arange(len(y)), round_index, kept)
        params, kept = result.params, result.client_state
    return params, kept


def _adam_steps(template, x, y, steps: int, fresh_every: int):
    """``steps`` full-batch Adam steps on ``template``'s copy, a fresh Adam every ``fresh_every``."""
    net = copy.deepcopy(template)
    for step in range(steps):
        if step % fresh_every == 0:
            adam = torch.optim.Adam(net.parameters(), lr=0.05)
        adam.zero_grad()
        F.cross_entropy(net(x), y).backward()
        adam.step()
    return {k: v.detach() for k, v in net.state_dict().items()}


def test_kept_state_makes_two_rounds_one_continued_adam_run():
    template, x, y, _ = _client()
    kept_params, kept = _two_rounds(keep_state=True)
    continued = _adam_steps(template, x, y, steps=2, fresh_every=2)
    for k in continued:
        torch.testing.assert_close(kept_params[k], continued[k], rtol=0, atol=1e-6)
    # what the client keeps: Adam's step count and both moments of each parameter, on the CPU
    assert kept[PREFIX + "classifier/network.1.weight/step"].item() == 2
    assert kept[PREFIX + "classifier/network.1.weight/exp_avg"].shape == (3, 4)
    assert kept[PREFIX + "classifier/network.1.bias/exp_avg_sq"].shape == (3,)


def test_without_kept_state_each_round_starts_a_fresh_adam():
    template, x, y, _ = _client()
    fresh_params, kept = _two_rounds(keep_state=False)
    restarted = _adam_steps(template, x, y, steps=2, fresh_every=1)
    continued = _adam_steps(template, x, y, steps=2, fresh_every=2)
    for k in restarted:
        torch.testing.assert_close(fresh_params[k], restarted[k], rtol=0, atol=1e-6)
    assert not torch.allclose(restarted["1.weight"], continued["1.weight"], atol=1e-4)  # the two readings differ
    assert not any(k.startswith(PREFIX) for k in kept)


def test_another_class_set_starts_afresh():
    template, x, y, _ = _client()
    params, _ = _two_rounds(keep_state=True, classes=((0, 1), (0, 2)))
    restarted = _adam_steps(template, x, y, steps=2, fresh_every=1)
    for k in restarted:
        torch.testing.assert_close(params[k], restarted[k], rtol=0, atol=1e-6)


def test_kept_state_of_another_shape_is_refused():
    template, x, y, ctx = _client()
    task = classifier_task(0, {k: v.clone() for k, v in template.state_dict().items()},
                           OptimizerConfig("adam", lr=0.05, keep_state=True))
    wrong = {PREFIX + "classifier/classes": torch.zeros(0, dtype=torch.long),
             PREFIX + "classifier/network.1.weight/exp_avg": torch.zeros(4, 3)}
    with pytest.raises(ValueError, match=r"network\.1\.weight.*\(4, 3\).*\(3, 4\)"):
        train_client(ctx, task, np.arange(len(y)), 1, wrong)


def test_fim_lbfgs_cannot_keep_its_state():
    with pytest.raises(ValueError, match="optimizer.keep_state"):
        check_optimizer(OptimizerConfig("fim_lbfgs", lr=1.0, keep_state=True))


def test_cohort_engine_trains_a_keeping_task_per_client():
    """The cohort's optimizers start afresh in every fit, so a task that keeps its state is
    trained per client there, with the state it kept: the same parameters as ``train_client``."""
    template, x, y, ctx = _client()
    optimizer = OptimizerConfig("adam", lr=0.05, keep_state=True)
    params = {k: v.detach().clone() for k, v in template.state_dict().items()}
    first = train_client(ctx, classifier_task(0, params, optimizer), np.arange(len(y)), 1)
    task = classifier_task(0, first.params, optimizer)
    alone = train_client(ctx, task, np.arange(len(y)), 2, first.client_state)
    trainer = CohortTrainer(ctx, make_trainer)
    (in_engine,) = train_in_cohorts([CohortJob(ctx, task, np.arange(len(y)), 2, first.client_state)],
                                    lambda _: trainer, 0)
    for k in alone.params:
        torch.testing.assert_close(in_engine.params[k], alone.params[k], rtol=0, atol=0)
    assert in_engine.client_state[PREFIX + "classifier/network.1.weight/step"].item() == 2


def test_detectors_keep_their_state_per_class_set():
    """FedOVA's (and ATHENA-FL's) stacked detectors keep theirs under the task kind 'detectors'."""
    template, _, _, ctx = _client(outputs=1)
    stacked = {k: torch.stack([v.detach().clone()] * 2) for k, v in template.state_dict().items()}
    optimizer = OptimizerConfig("adam", lr=0.05, keep_state=True)
    first = train_client(ctx, detector_task(0, stacked, (0, 2), optimizer), np.arange(12), 1)
    kept = first.client_state
    assert torch.equal(kept[PREFIX + "detectors/classes"], torch.tensor([0, 2]))
    assert any(k.endswith("/exp_avg_sq") for k in kept)
    second = train_client(ctx, detector_task(0, first.params, (0, 2), optimizer), np.arange(12), 2, kept)
    assert all(v.item() == 2 for k, v in second.client_state.items() if k.endswith("/step"))


def _kept_steps(client_states) -> dict:
    """(client, kept step count's key) -> the optimizer steps the client has taken."""
    return {(client, k): v.item() for client, state in client_states.items() for k, v in state.items()
            if k.endswith("/step")}


def test_resumed_run_with_kept_states_equals_uninterrupted_run(tmp_path):
    """The kept states travel in the federation's checkpoint: a run resumed after round 1 trains
    round 2 as the uninterrupted run does, and every client holds Adam's state of its fits."""
    keep = ("--federation.client_fraction", "1.0", "--optimizer.name", "adam", "--optimizer.lr", "0.001",
            "--optimizer.keep_state", "true")
    straight = main(["fit", *tiny_args(tmp_path / "a", "--federation.rounds", "2", *keep)])
    round_one = tmp_path / "b" / "checkpoints" / "last.ckpt"
    main(["fit", *tiny_args(tmp_path / "b", "--federation.rounds", "1", *keep)])
    resumed = main(["fit", *tiny_args(tmp_path / "c", "--federation.rounds", "2", *keep, "--ckpt_path", str(round_one))])
    assert [m["train/loss"] for m in resumed["history"]] == [m["train/loss"] for m in straight["history"]]
    a = load_checkpoint(tmp_path / "a" / "checkpoints" / "last.ckpt")
    c = load_checkpoint(tmp_path / "c" / "checkpoints" / "last.ckpt")
    assert all(torch.equal(a["state"][k], c["state"][k]) for k in a["state"])
    kept_after_one = load_checkpoint(round_one)["client_states"]
    assert len(kept_after_one) == 10
    after_one, after_two = _kept_steps(kept_after_one), _kept_steps(c["client_states"])
    assert after_one and after_two.keys() == after_one.keys()
    assert all(after_two[k] == 2 * after_one[k] for k in after_one)  # round 1's E epochs of steps, continued
