"""The server evaluates in evaluation mode: batch norm normalises with the model's running
statistics (never the test batch's, and never updating them) and dropout keeps every unit, so a
prediction depends on its own input only and leaves the global state as it was. (Before, the
template's training mode made FedAvg-MobileNet's test accuracy use each test batch's statistics,
with dropout on, and write test statistics into the global model.)"""

import torch
from torch import nn

from fl_lightning.algorithms.fedova.strategy import FedOVA
from fl_lightning.config import OptimizerConfig
from fl_lightning.modules.stacking import StackedModel, stack_models
from fl_lightning.strategy import model_logits


def network(outputs: int = 10, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                        nn.Dropout(0.5), nn.Linear(4, outputs))
    net[1].running_mean.uniform_(-1, 1)  # statistics unlike any batch's
    net[1].running_var.uniform_(0.5, 2)
    return net


def by_hand(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The network in evaluation mode, written out: (x - running mean) / sqrt(running var + eps)."""
    conv, bn = net[0], net[1]
    h = conv(x)
    h = (h - bn.running_mean[:, None, None]) / torch.sqrt(bn.running_var[:, None, None] + bn.eps)
    h = torch.relu(h * bn.weight[:, None, None] + bn.bias[:, None, None]).mean((2, 3))
    return net[6](h)


def test_model_logits_uses_running_statistics_and_leaves_the_state_alone():
    template = network()  # in training mode, as the federation builds it
    state = {k: v.clone() for k, v in network(seed=1).state_dict().items()}
    before = {k: v.clone() for k, v in state.items()}
    x = torch.randn(6, 1, 8, 8)

    whole, half = model_logits(template, state, x), model_logits(template, state, x[:3])

    reference = network(seed=1)
    with torch.no_grad():
        torch.testing.assert_close(whole, by_hand(reference, x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(whole[:3], half, rtol=1e-6, atol=1e-6)  # no batch statistics, no dropout
    assert all(torch.equal(before[k], state[k]) for k in state)  # no running statistic written
    assert template.training  # the template's own mode is restored for the clients that copy it


def test_one_vs_all_detectors_with_batch_norm_evaluate_in_evaluation_mode():
    strategy = FedOVA()
    template = network(outputs=1)
    strategy.setup(template, 3, OptimizerConfig("sgd", lr=0.1), "loop")
    detectors = [network(outputs=1, seed=s) for s in (1, 2, 3)]
    state = stack_models(detectors)
    assert any(k.endswith("running_var") for k in state)  # the statistics travel with the parameters
    before = {k: v.clone() for k, v in state.items()}
    x = torch.randn(5, 1, 8, 8)

    with torch.no_grad():
        logits = strategy.predict_logits(state, x)
        expected = torch.cat([by_hand(d, x) for d in detectors], dim=1)
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    assert all(torch.equal(before[k], state[k]) for k in state)


def test_stacked_copies_keep_their_statistics_and_vmap_evaluates_them_as_the_loop():
    detectors = [network(outputs=1, seed=s) for s in (1, 2)]
    state = stack_models(detectors)
    x = torch.randn(4, 1, 8, 8)
    with torch.no_grad():
        loop = StackedModel(network(outputs=1), state, mode="loop").eval()(x)
        vmapped = StackedModel(network(outputs=1), state, mode="vmap").eval()(x)
    torch.testing.assert_close(loop, vmapped, rtol=1e-5, atol=1e-5)
    for mode in ("loop", "vmap"):
        restacked = StackedModel(network(outputs=1), state, mode=mode).stacked_state()
        assert list(restacked) == list(state) and all(torch.equal(restacked[k], state[k]) for k in state)
    training = StackedModel(network(outputs=1), state, mode="vmap")
    try:
        training(x)
        raise AssertionError("vmap trained copies with batch norm")
    except ValueError as error:
        assert "stacking 'loop'" in str(error)
