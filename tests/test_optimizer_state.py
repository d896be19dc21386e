"""``optimizer.keep_state``: a client's optimizer state carried from one of its rounds to its next
(callbacks/optimizer_state.py), as a client that compiles its model once and fits it every round."""

from __future__ import annotations

import copy
import re

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
    assert kept[PREFIX + "classifier/1.weight/step"].item() == 2
    assert kept[PREFIX + "classifier/1.weight/exp_avg"].shape == (3, 4)
    assert kept[PREFIX + "classifier/1.bias/exp_avg_sq"].shape == (3,)


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


@pytest.mark.parametrize("kept, message", [
    # a moment of another shape than its parameter
    ({"1.weight/exp_avg": torch.zeros(4, 3), "1.weight/step": torch.tensor(1.0)}, r"'1\.weight'.*\(4, 3\).*\(3, 4\)"),
    # names the task's parameters lack (an older layout's module names): not a silent fresh start
    ({"network.1.weight/exp_avg": torch.zeros(3, 4)}, r"network\.1\.weight"),
])
def test_a_kept_state_that_does_not_fit_is_refused_by_both_engines(kept, message):
    template, x, y, ctx = _client()
    task = classifier_task(0, {k: v.clone() for k, v in template.state_dict().items()},
                           OptimizerConfig("adam", lr=0.05, keep_state=True))
    state = {PREFIX + "classifier/classes": torch.zeros(0, dtype=torch.long),
             **{PREFIX + "classifier/" + k: v for k, v in kept.items()}}
    with pytest.raises(ValueError, match=message):
        train_client(ctx, task, np.arange(len(y)), 1, state)
    (outcome,) = _cohort(ctx, [task], 1, [state])  # the client is dropped, the reason named
    assert re.search(message, outcome.reason)


def test_a_fit_that_steps_no_optimizer_keeps_the_clients_state_as_it_was():
    """A probe (FIM-L-BFGS's curvature task) trains nothing: asked to keep a state, it leaves
    what the client kept untouched."""
    from dataclasses import asdict

    from fl_lightning.messages import ClientTask

    template, x, y, ctx = _client()
    params = {k: v.detach().clone() for k, v in template.state_dict().items()}
    kept = {PREFIX + "curvature/classes": torch.zeros(0, dtype=torch.long), "other": torch.ones(1)}
    probe = ClientTask(0, "curvature", params, settings={"classes": [], "fisher": False, "keep_gradient": False,
                                                         "optimizer": asdict(OptimizerConfig("adam", keep_state=True))})
    result = train_client(ctx, probe, np.arange(len(y)), 1, kept)
    _assert_same(result.client_state, kept, atol=0)


def test_fim_lbfgs_cannot_keep_its_state():
    with pytest.raises(ValueError, match="optimizer.keep_state"):
        check_optimizer(OptimizerConfig("fim_lbfgs", lr=1.0, keep_state=True))


def _cohort(ctx, tasks, round_index, states):
    """``tasks`` trained together by the cohort engine (one job a client), their outcomes."""
    trainer = CohortTrainer(ctx, make_trainer)
    cohorts = []
    train = trainer.train
    trainer.train = lambda plugin, entries, *args, **kwargs: cohorts.append(len(entries)) or train(plugin, entries, *args,
                                                                                                   **kwargs)
    jobs = [CohortJob(ctx, task, np.arange(len(ctx.y)), round_index, state) for task, state in zip(tasks, states)]
    outcomes = train_in_cohorts(jobs, lambda _: trainer, 0)
    assert cohorts == [len(tasks)]  # one cohort of every task: none trained per client
    return outcomes


def _assert_same(a, b, atol=1e-6):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=atol)


@pytest.mark.parametrize("name", ["adam", "sgd"])
def test_cohort_engine_keeps_the_state_a_per_client_fit_keeps(name):
    """Two rounds of two clients, the first per client and the second in one cohort, equal two
    rounds per client: the cohort starts each member from its client's kept state and keeps the
    same state back (Adam's moments and step count, SGD's momentum), so a run may change engine."""
    template, x, y, ctx = _client()
    optimizer = OptimizerConfig(name, lr=0.05, momentum=0.9 if name == "sgd" else 0.0, keep_state=True)
    params = {k: v.detach().clone() for k, v in template.state_dict().items()}
    firsts = [train_client(ctx, classifier_task(c, params, optimizer), np.arange(len(y)), 1) for c in (0, 1)]
    tasks = [classifier_task(c, first.params, optimizer) for c, first in enumerate(firsts)]
    alone = [train_client(ctx, task, np.arange(len(y)), 2, first.client_state) for task, first in zip(tasks, firsts)]
    in_engine = _cohort(ctx, tasks, 2, [first.client_state for first in firsts])
    for ours, theirs in zip(in_engine, alone):
        _assert_same(ours.params, theirs.params)
        _assert_same(ours.client_state, theirs.client_state)
    if name == "adam":
        assert in_engine[0].client_state[PREFIX + "classifier/1.weight/step"].item() == 2
    # and the other way round: a state the cohort kept continues per client
    third = [train_client(ctx, classifier_task(r.client_id, r.params, optimizer), np.arange(len(y)), 3, r.client_state)
             for r in in_engine]
    fresh = _adam_steps(template, x, y, steps=3, fresh_every=3) if name == "adam" else None
    if fresh is not None:  # every client trains on the same data: three steps of one continued Adam
        _assert_same(third[0].params, fresh)


@pytest.mark.parametrize("second", ["cohort", "vmap"])
def test_detectors_kept_state_is_one_layout_for_every_engine_and_stacking(second):
    """Detectors kept per copy by the loop stacking continue in the cohort engine (one member a
    detector) or vmap's stacked tensors exactly as in the loop."""
    template, x, y, ctx = _client(outputs=1)
    stacked = {k: torch.stack([v.detach().clone()] * 2) for k, v in template.state_dict().items()}
    optimizer = OptimizerConfig("adam", lr=0.05, keep_state=True)
    first = train_client(ctx, detector_task(0, stacked, (0, 2), optimizer), np.arange(12), 1)
    assert first.client_state[PREFIX + "detectors/1.weight/exp_avg"].shape == (2, 1, 4)
    loop = train_client(ctx, detector_task(0, first.params, (0, 2), optimizer), np.arange(12), 2, first.client_state)
    if second == "cohort":
        (other,) = _cohort(ctx, [detector_task(0, first.params, (0, 2), optimizer)], 2, [first.client_state])
    else:
        other = train_client(ctx, detector_task(0, first.params, (0, 2), optimizer, stacking="vmap"), np.arange(12), 2,
                             first.client_state)
    _assert_same(other.params, loop.params)
    for k, v in loop.client_state.items():  # vmap keeps one step count for both copies
        torch.testing.assert_close(other.client_state[k].expand_as(v), v, rtol=0, atol=1e-6)


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
    steps = [v for k, v in second.client_state.items() if k.endswith("/step")]
    assert steps and all(v.tolist() == [2, 2] for v in steps)  # one count per detector


def _kept_steps(client_states) -> dict:
    """(client, kept step count's key) -> the optimizer steps the client has taken."""
    return {(client, k): v.tolist() for client, state in client_states.items() for k, v in state.items()
            if k.endswith("/step")}


@pytest.mark.parametrize("engine", ["per_client", "cohort"])
def test_resumed_run_with_kept_states_equals_uninterrupted_run(tmp_path, engine):
    """The kept states travel in the federation's checkpoint: a run resumed after round 1 trains
    round 2 as the uninterrupted run does, and every client holds Adam's state of its fits."""
    keep = ("--federation.client_fraction", "1.0", "--optimizer.name", "adam", "--optimizer.lr", "0.001",
            "--optimizer.keep_state", "true", "--trainer.engine", engine)
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
    assert all(torch.equal(torch.tensor(after_two[k]), 2 * torch.tensor(after_one[k])) for k in after_one)  # round 1's E epochs of steps, continued


def test_stacked_optimizer_starts_each_member_from_its_own_state_and_a_reused_one_afresh():
    """A reused cohort runner (a captured graph's, ``CohortRunner.load``) takes the new members'
    states: one member from its kept state, the other afresh, and then none kept at all."""
    from fl_lightning.cohort.optim import StackedOptimizer

    params = [torch.zeros(2, 3), torch.zeros(2)]
    optimizer = StackedOptimizer(OptimizerConfig("adam", lr=0.1, keep_state=True), params)
    kept = {"w/exp_avg": torch.full((3,), 0.5), "w/exp_avg_sq": torch.full((3,), 0.25), "w/step": torch.tensor(4.0),
            "b/exp_avg": torch.tensor(1.0), "b/exp_avg_sq": torch.tensor(2.0), "b/step": torch.tensor(4.0)}
    optimizer.start_from([None, kept], ["w", "b"])
    optimizer.reset()
    first, second = optimizer.member_states(["w", "b"])
    assert all(torch.count_nonzero(v) == 0 for v in first.values())
    _assert_same(second, kept, atol=0)
    optimizer.start_from([None, None], ["w", "b"])
    optimizer.reset()
    assert all(torch.count_nonzero(t) == 0 for t in optimizer.tensors())
    with pytest.raises(ValueError, match="step counts"):
        optimizer.start_from([{**kept, "b/step": torch.tensor(3.0)}, None], ["w", "b"])
