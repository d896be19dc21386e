import numpy as np
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
