import numpy as np
import pytest
import torch

from fl_lightning.aggregation import fedavg, one_vs_all_groups


def test_fedavg_equals_hand_computed_mean_and_weighted_mean():
    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=(3, 4)) for _ in range(3)]
    states = [{"w": torch.tensor(a, dtype=torch.float32)} for a in arrays]

    plain = fedavg(states, [10, 20, 70], weighted=False)
    weighted = fedavg(states, [10, 20, 70], weighted=True)

    np.testing.assert_allclose(plain["w"].numpy(), (arrays[0] + arrays[1] + arrays[2]) / 3, rtol=1e-6)
    np.testing.assert_allclose(weighted["w"].numpy(), 0.1 * arrays[0] + 0.2 * arrays[1] + 0.7 * arrays[2], rtol=1e-6)


def test_one_vs_all_averages_each_classifier_over_its_own_group_only():
    current = {"w": torch.zeros(4, 2)}
    updates = [
        ((0, 1), {"w": torch.tensor([[1.0, 1.0], [10.0, 10.0]])}, 100),
        ((1, 2), {"w": torch.tensor([[20.0, 20.0], [5.0, 5.0]])}, 300),
        ((0,), {"w": torch.tensor([[3.0, 3.0]])}, 100),
    ]

    new, groups = one_vs_all_groups(current, updates, weighted=False)
    new_w, _ = one_vs_all_groups(current, updates, weighted=True)

    assert groups == {0: 2, 1: 2, 2: 1}
    torch.testing.assert_close(new["w"][0], torch.tensor([2.0, 2.0]))   # (1 + 3) / 2
    torch.testing.assert_close(new["w"][1], torch.tensor([15.0, 15.0]))  # (10 + 20) / 2
    torch.testing.assert_close(new["w"][2], torch.tensor([5.0, 5.0]))
    torch.testing.assert_close(new["w"][3], torch.tensor([0.0, 0.0]))  # no client held class 3
    torch.testing.assert_close(new_w["w"][1], torch.tensor([17.5, 17.5]))  # (100*10 + 300*20) / 400


def test_fednova_unweighted_by_hand_and_integer_buffers_averaged_as_fedavg():
    from fl_lightning.aggregation import fednova

    # w = 1; client 0 took 2 plain SGD steps to 0 (a = 2), client 1 took 4 steps to -3 (a = 4).
    # d_i = (w - w_i) / a_i = 1/2 and 4/4. Unweighted p = (1/2, 1/2): d = 0.75,
    # tau_eff = 1/2 * 2 + 1/2 * 4 = 3, w <- 1 - 3 * 0.75 = -1.25 (FedAvg would give -1.5).
    # (the integer buffer comes first: the floating tensors after it are updated too)
    global_state = {"steps": torch.tensor(10), "w": torch.tensor([1.0])}
    states = [{"steps": torch.tensor(12), "w": torch.tensor([0.0])}, {"steps": torch.tensor(14), "w": torch.tensor([-3.0])}]

    plain = fednova(global_state, states, steps=[2, 4], num_samples=[100, 300], weighted=False)
    weighted = fednova(global_state, states, steps=[2, 4], num_samples=[100, 300])

    assert plain["w"].item() == -1.25 and plain["steps"].item() == 13  # buffer: mean of 12 and 14
    # p = (1/4, 3/4): d = 1/4 * 1/2 + 3/4 * 1 = 0.875, tau_eff = 1/2 + 3 = 3.5, w = 1 - 3.0625
    assert weighted["w"].item() == -2.0625 and weighted["steps"].item() == 13  # 13.5, truncated to int64


def test_fednova_norm_rejects_momentum_of_one_or_more():
    from fl_lightning.aggregation import fednova_norm

    assert fednova_norm(3) == fednova_norm(3, 0.0) == 3.0
    assert fednova_norm(2, 0.5) == pytest.approx((2 - 0.5 * (1 - 0.25) / 0.5) / 0.5)  # = 2.5 = 1 + 1.5
    for bad in (1.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="momentum"):
            fednova_norm(3, bad)


def test_weighted_mean_accumulates_in_float64():
    # float32 rounding of a running sum would lose the small states next to a large one
    states = [{"w": torch.tensor([2.0**24], dtype=torch.float32)}] + [{"w": torch.tensor([1.0])}] * 4
    mean = fedavg(states, [1] * 5, weighted=False)["w"]
    assert mean.dtype == torch.float32 and mean.item() == (2.0**24 + 4) / 5  # 3355444.0, exact in float32
