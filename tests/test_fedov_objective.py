"""FedOV's one local objective (fl_lightning/algorithms/fedov/objective.py) and its random draws
(draws.py), pinned by hand: with one objective the two engines can no longer catch each
other's mistakes, so each term, the FGSM step, the precision policy and the draw order are
checked on their own here."""

import math

import pytest
import torch
from torch.func import vmap

from fl_lightning.algorithms.fedov import destruction as D
from fl_lightning.algorithms.fedov.draws import OpenSetDraws, _beta
from fl_lightning.algorithms.fedov.objective import (OpenSetLoss, destroyed, fgsm_away_from, fgsm_step_size,
                                                     open_set_objective, open_set_terms, outliers,
                                                     terms_with_outliers)
from fl_lightning.algorithms.fedov.open_set import OpenSetClient, OpenSetDetector
from fl_lightning.config import OptimizerConfig
from fl_lightning.functional import functional_forward
from fl_lightning.models import SimpleCNN

MEAN, STD = (0.49, 0.48, 0.45), (0.25, 0.24, 0.26)  # a CIFAR-like standardisation


class _OneFeature(torch.nn.Module):
    """features = the input itself (one number per sample); head: logits (x, 2x, 1/2) for
    classes 0, 1 and "unknown" (index 2): every term can be written down by hand."""

    def __init__(self):
        super().__init__()
        self.features = torch.nn.Identity()
        self.head = torch.nn.Linear(1, 3)
        with torch.no_grad():
            self.head.weight.copy_(torch.tensor([[1.0], [2.0], [0.0]]))
            self.head.bias.copy_(torch.tensor([0.0, 0.0, 0.5]))

    def forward(self, x):
        return self.head(self.features(x))


def _ce(logits, target):
    """-log softmax(logits)[target], by hand."""
    return math.log(sum(math.exp(v) for v in logits)) - logits[target]


def _logits(v):
    return [v, 2 * v, 0.5]


def _hand_terms():
    """Two samples with different features (1 and 3) and labels (0, 1), paired with each other,
    lambda = 0.25; destroyed outliers 2 and 4, enhanced -1 and -2."""
    net = _OneFeature()
    x, y = torch.tensor([[1.0], [3.0]]), torch.tensor([0, 1])
    made = {"destroyed": torch.tensor([[2.0], [4.0]]), "enhanced": torch.tensor([[-1.0], [-2.0]])}
    draws = {"pair": torch.tensor([1, 0]), "lam": torch.tensor(0.25, dtype=torch.float64)}
    expected = {
        "ce": (_ce(_logits(1), 0) + _ce(_logits(3), 1)) / 2,
        # the true class masked out, "unknown" must win among the rest (PROSER's dummy, Eq. 1)
        "dummy": (_ce([2.0, 0.5], 1) + _ce([3.0, 0.5], 1)) / 2,
        # mixed embeddings 0.25 * 1 + 0.75 * 3 = 2.5 and 0.25 * 3 + 0.75 * 1 = 1.5, target unknown:
        # dropping lambda (or mixing a sample with itself) gives other numbers
        "mixup": (_ce(_logits(2.5), 2) + _ce(_logits(1.5), 2)) / 2,
        "destroyed": (_ce(_logits(2), 2) + _ce(_logits(4), 2)) / 2,
        "enhanced": (_ce(_logits(-1), 2) + _ce(_logits(-2), 2)) / 2,
    }
    return net, x, y, made, draws, expected


def test_each_open_set_term_is_cross_entropy_by_hand_with_two_different_features():
    net, x, y, made, draws, expected = _hand_terms()

    terms = terms_with_outliers(functional_forward(net), dict(net.named_parameters()), x, y, torch.ones(2), made,
                                draws, OpenSetLoss(), unknown=2)

    assert set(terms) == set(expected)
    for name, value in expected.items():
        assert float(terms[name]) == pytest.approx(value, rel=1e-6), name


def test_the_objective_weights_the_terms_by_hand():
    net, x, y, made, draws, expected = _hand_terms()
    loss = OpenSetLoss(dummy_weight=1.0, mixup_weight=0.01, destruction_weight=0.5, adversarial_weight=2.0)
    weights = {"ce": 1, "dummy": 1.0, "mixup": 0.01, "destroyed": 0.5, "enhanced": 2.0}

    terms = terms_with_outliers(functional_forward(net), dict(net.named_parameters()), x, y, torch.ones(2), made,
                                draws, loss, unknown=2)

    total = sum(weights[k] * terms[k] for k in terms)
    assert float(total) == pytest.approx(sum(weights[k] * v for k, v in expected.items()), rel=1e-6)


def test_padding_counts_for_nothing():
    # the cohort pads a member's batch with weight-0 samples (paired with themselves): every term
    # equals the unpadded batch's
    net, x, y, made, draws, expected = _hand_terms()
    pad = lambda t, v: torch.cat([t, v])
    padded = terms_with_outliers(
        functional_forward(net), dict(net.named_parameters()), pad(x, torch.tensor([[7.0]])), pad(y, torch.tensor([0])),
        torch.tensor([1.0, 1.0, 0.0]), {k: pad(v, torch.tensor([[9.0]])) for k, v in made.items()},
        {"pair": torch.tensor([1, 0, 2]), "lam": draws["lam"]}, OpenSetLoss(), unknown=2)
    for name, value in expected.items():
        assert float(padded[name]) == pytest.approx(value, rel=1e-6), name


def test_mixup_of_one_class_counts_for_nothing():
    net = SimpleCNN(1, 28, 11)
    x, y = torch.randn(8, 1, 28, 28), torch.zeros(8, dtype=torch.long)
    loss = OpenSetLoss(dummy_weight=0, destruction_weight=0, adversarial_weight=0)
    params = dict(net.named_parameters())
    draws = {"pair": torch.randperm(8), "lam": torch.tensor(0.3, dtype=torch.float64)}

    terms = open_set_terms(functional_forward(net), params, x, y, torch.ones(8), draws, loss, 10)

    assert float(terms["mixup"]) == 0.0
    head = [p for n, p in params.items() if n.startswith("head.")]
    grads = torch.autograd.grad(terms["mixup"], head, allow_unused=True)
    assert all(g is None or float(g.abs().max()) == 0.0 for g in grads)


@pytest.mark.parametrize("setting", ["dummy_weight", "mixup_weight", "destruction_weight", "adversarial_weight"])
def test_zeroing_a_loss_weight_removes_exactly_its_term(setting):
    torch.manual_seed(0)
    net = SimpleCNN(1, 28, 11)
    x, y = torch.randn(16, 1, 28, 28), torch.tensor([0, 1] * 8)
    full = OpenSetLoss(dummy_weight=0.3, mixup_weight=0.7, destruction_weight=0.5, adversarial_weight=2.0)
    without = OpenSetLoss(**{**full.__dict__, setting: 0.0})
    term = {"dummy_weight": "dummy", "mixup_weight": "mixup", "destruction_weight": "destroyed",
            "adversarial_weight": "enhanced"}[setting]
    args = (functional_forward(net), dict(net.named_parameters()), x, y, torch.ones(16))
    draws = OpenSetDraws(full, seed=3, image_size=(28, 28)).take(0, 16)

    terms = open_set_terms(*args, draws, full, 10)
    total = open_set_objective(*args, draws, full, 10)
    reduced = open_set_objective(*args, draws, without, 10)

    assert set(terms) == {"ce", "dummy", "mixup", "destroyed", "enhanced"} and all(float(t) > 0 for t in terms.values())
    torch.testing.assert_close(total, sum(full.weights()[k] * v for k, v in terms.items()))
    torch.testing.assert_close(reduced, total - getattr(full, setting) * terms[term])


def test_fgsm_moves_outliers_towards_seen_classes_and_leaves_the_parameters_alone():
    torch.manual_seed(0)
    net = SimpleCNN(1, 28, 11)
    outliers_ = torch.randn(16, 1, 28, 28)
    before = net(outliers_).softmax(1)

    enhanced = fgsm_away_from(functional_forward(net), dict(net.named_parameters()), outliers_, torch.ones(16),
                              label=10, steps=5, step_size=0.05)

    after = net(enhanced).softmax(1)
    assert enhanced.shape == outliers_.shape
    assert (enhanced - outliers_).abs().max() <= 5 * 0.05 + 1e-6
    assert bool((after[:, 10] < before[:, 10]).all())  # less "unknown" for every outlier
    assert all(p.grad is None for p in net.parameters())


def test_fgsm_on_standardised_inputs_steps_each_pixel_away_from_unknown_by_the_paper_step():
    # A linear model on 3 one-pixel channels: logits (x_0, -x_1, 0) for two classes and unknown.
    # d CE(., unknown) / dx = p_0 * (1, 0, 0) + p_1 * (0, -1, 0): ascent raises channel 0, lowers
    # channel 1 and leaves channel 2 (no gradient) where it is.
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3, 3, bias=False))
    with torch.no_grad():
        net[1].weight.copy_(torch.tensor([[1.0, 0.0, 0.0], [0.0, -1.0, 0.0], [0.0, 0.0, 0.0]]))
    x = torch.tensor([[0.2, -0.3, 0.7], [-1.0, 0.5, 0.0]]).view(2, 3, 1, 1)
    loss = OpenSetLoss(fgsm_step_size=0.002, pixel_mean=MEAN, pixel_std=STD)

    moved = fgsm_away_from(functional_forward(net), dict(net.named_parameters()), x, torch.ones(2), 2, 1,
                           fgsm_step_size(loss, x))

    # 0.002 in [0, 1] pixel units is 0.002 / std in standardised units
    expected = x + torch.tensor([0.002 / STD[0], -0.002 / STD[1], 0.0]).view(1, 3, 1, 1)
    torch.testing.assert_close(moved, expected, rtol=0, atol=1e-7)


def test_destruction_with_the_data_standardisation_erases_to_black_pixels():
    g = torch.Generator().manual_seed(2)
    pixels = torch.rand(8, 3, 32, 32, generator=g) * 0.8 + 0.1  # no black pixel yet
    mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
    x = (pixels - mean) / std
    op, args = D.draw_destruction(8, 32, 32, torch.Generator().manual_seed(0), ("erase",))

    out = destroyed(x, op, args.float(), OpenSetLoss(destruction_ops=("erase",), pixel_mean=MEAN, pixel_std=STD))

    black = (out * std + mean).abs() < 1e-6
    assert torch.equal(black, black[:, :1].expand_as(black))  # whole pixels, every channel
    assert 0.3 < float(black.float().mean()) <= 0.52  # one box of a third to a half per image
    assert torch.allclose(out[~black], x[~black], atol=1e-5)
    # Without the statistics the box takes the value 0 of the inputs as given: the mean colour.
    plain = destroyed(x, op, args.float(), OpenSetLoss(destruction_ops=("erase",)))
    assert torch.equal(plain == 0, black)


def test_outliers_are_made_in_float32_under_bf16_autocast():
    # the precision policy: destruction and FGSM's input gradient run in fp32 in both engines
    torch.manual_seed(0)
    net = SimpleCNN(1, 28, 11)
    x = torch.randn(8, 1, 28, 28)
    loss = OpenSetLoss()
    draws = OpenSetDraws(loss, seed=1, image_size=(28, 28)).take(0, 8)
    args = (functional_forward(net), dict(net.named_parameters()), x, torch.ones(8), draws, loss, 10)

    plain = outliers(*args)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = outliers(*args)

    for name in ("destroyed", "enhanced"):
        assert mixed[name].dtype == torch.float32
        torch.testing.assert_close(mixed[name], plain[name], rtol=0, atol=0)


def test_draws_follow_the_clients_own_generators_in_order():
    loss = OpenSetLoss(destruction_ops=("erase", "blur"))
    first, again = OpenSetDraws(loss, 11, (28, 28)), OpenSetDraws(loss, 11, (28, 28))
    steps = [first.take(s, 10) for s in range(3)]

    # the client seed's generator: first the destruction generator's seed, then per step
    # randperm and Beta; the destruction generator draws the ops and their parameters
    mixing = torch.Generator().manual_seed(11)
    destruction = torch.Generator().manual_seed(int(torch.randint(2**62, (1,), generator=mixing)))
    for s, drawn in enumerate(steps):
        op, args = D.draw_destruction(10, 28, 28, destruction, ("erase", "blur"))
        assert torch.equal(drawn["op"], op) and torch.equal(drawn["op_args"], args.float())
        assert torch.equal(drawn["pair"], torch.randperm(10, generator=mixing))
        assert torch.equal(drawn["lam"], _beta(1.0, mixing)) and 0 < float(drawn["lam"]) < 1
        assert {k: torch.equal(v, drawn[k]) for k, v in again.take(s, 10).items()} == dict.fromkeys(drawn, True)


def test_a_draw_out_of_turn_fails():
    draws = OpenSetDraws(OpenSetLoss(), 0, (28, 28))
    draws.take(0, 4)
    with pytest.raises(RuntimeError, match="out of turn"):
        draws.take(2, 4)
    with pytest.raises(RuntimeError, match="out of turn"):
        draws.take(0, 4)


def test_padded_draws_pair_padding_with_itself():
    drawn = OpenSetDraws(OpenSetLoss(), 0, (28, 28)).take(0, 5, width=8)
    assert drawn["op"].shape == (8,) and drawn["op_args"].shape == (8, D.ARGS)
    assert drawn["pair"][5:].tolist() == [5, 6, 7] and sorted(drawn["pair"][:5].tolist()) == list(range(5))


def test_only_the_terms_in_use_draw():
    assert set(OpenSetDraws(OpenSetLoss(mixup_weight=0), 0, (28, 28)).take(0, 4)) == {"op", "op_args"}
    assert set(OpenSetDraws(OpenSetLoss(destruction_weight=0, adversarial_weight=0), 0, (28, 28)).take(0, 4)) == {
        "pair", "lam"}


def test_the_vmapped_objective_is_the_objective_member_by_member():
    # what the cohort engine does: the same function, vmapped over stacked members
    torch.manual_seed(0)
    nets = [SimpleCNN(1, 28, 11) for _ in range(2)]
    loss = OpenSetLoss(fgsm_steps=2)
    x, y = torch.randn(2, 6, 1, 28, 28), torch.randint(0, 10, (2, 6))
    weight = torch.ones(2, 6)
    drawn = [OpenSetDraws(loss, m, (28, 28)).take(0, 6) for m in range(2)]
    draws = {k: torch.stack([d[k] for d in drawn]) for k in drawn[0]}
    forward = functional_forward(SimpleCNN(1, 28, 11).to("meta"))
    stacked = {n: torch.stack([dict(net.named_parameters())[n].detach() for net in nets]) for n, _ in nets[0].named_parameters()}

    together = vmap(lambda p, xb, yb, wb, d: open_set_objective(forward, p, xb, yb, wb, d, loss, 10))(
        stacked, x, y, weight, draws)

    for m, net in enumerate(nets):
        alone = open_set_objective(functional_forward(net), dict(net.named_parameters()), x[m], y[m], weight[m],
                                   drawn[m], loss, 10)
        torch.testing.assert_close(together[m], alone, rtol=1e-5, atol=1e-6)


def test_the_module_needs_each_steps_draws_and_its_plugin_supplies_them():
    module = OpenSetDetector(SimpleCNN(1, 28, 11), 10, OptimizerConfig("adam", lr=1e-3), OpenSetLoss())
    with pytest.raises(RuntimeError, match="OutlierDraws"):
        module.training_step((torch.randn(4, 1, 28, 28), torch.tensor([0, 1, 2, 3])), 0)
    from types import SimpleNamespace

    from fl_lightning.algorithms.fedov.open_set import open_set_task

    task = open_set_task(0, {}, OptimizerConfig("adam"), 10, OpenSetLoss())
    (made,) = OpenSetClient().fit_callbacks(SimpleNamespace(x=torch.zeros(1, 1, 28, 28)), task, seed=5)
    assert type(made).__name__ == "OutlierDraws" and (made.seed, made.image_size) == (5, (28, 28))


def test_open_set_settings_are_checked():
    for bad, match in (({"pixel_mean": (0.5,), "pixel_std": (0.0,)}, "std > 0"),
                       ({"fgsm_steps": 0}, "FGSM"), ({"fgsm_step_size": -0.1}, "FGSM"),
                       ({"destruction_ops": ("erase", "melt")}, "melt")):
        with pytest.raises(ValueError, match=match):
            OpenSetLoss(**bad)
    OpenSetLoss(fgsm_steps=0, adversarial_weight=0)  # no FGSM, nothing to check
    only_features = torch.nn.Module()
    only_features.features = torch.nn.Identity()
    with pytest.raises(ValueError, match="features/head"):
        OpenSetDetector(only_features, 2, OptimizerConfig())


def test_a_window_of_draws_equals_the_steps_taken_one_by_one():
    loss = OpenSetLoss(dummy_weight=1, mixup_weight=0.01, destruction_ops=("copy_paste", "rotate", "copy_paste"))
    window, single = OpenSetDraws(loss, 4, (28, 28)), OpenSetDraws(loss, 4, (28, 28))
    sizes = [16, 3, 16, 0, 9]
    drawn = window.take_steps(0, sizes, width=16) + window.take_steps(5, [16], width=16)
    for s, n in enumerate(sizes + [16]):
        expected = single.take(s, n, width=16)
        assert drawn[s].keys() == expected.keys()
        assert all(torch.equal(drawn[s][k], expected[k]) for k in expected)
    with pytest.raises(RuntimeError, match="out of turn"):
        window.take_steps(7, [4])
    with pytest.raises(ValueError, match="does not fit a width of 8"):
        window.take_steps(6, [4, 9], width=8)


def test_the_cohort_window_draws_each_member_s_steps_in_order_and_blanks_the_rest():
    from fl_lightning.cohort.members import StepDraws

    loss = OpenSetLoss()
    sources = [OpenSetDraws(loss, m, (28, 28)) for m in range(2)]
    weight = torch.zeros(3, 2, 8)
    weight[:, 0, :8] = 1
    weight[0, 1, :5] = 1  # member 1 steps once (5 samples), then its plan has ended
    active = torch.tensor([[1, 1], [1, 0], [1, 0]])
    window = StepDraws(sources).window(0, weight, active)
    for m, steps in ((0, [8, 8, 8]), (1, [5])):
        again = OpenSetDraws(loss, m, (28, 28))
        for s, n in enumerate(steps):
            expected = again.take(s, n, width=8)
            assert all(torch.equal(window[k][s, m], expected[k]) for k in expected)
    assert not window["op_args"][1:, 1].any() and not window["pair"][1:, 1].any()


@pytest.mark.parametrize("alpha", [1.0, 0.4, 2.0])
def test_lambda_is_torch_s_beta_sample_on_the_client_s_generator(alpha):
    # torch.distributions.Beta samples from the global generator only: lend it the client's state
    client, lent = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    outer = torch.get_rng_state()
    try:
        for _ in range(50):
            torch.set_rng_state(lent.get_state())
            expected = torch.distributions.Beta(alpha, alpha).sample()
            lent.set_state(torch.get_rng_state())
            assert torch.equal(_beta(alpha, client), expected.double())
    finally:
        torch.set_rng_state(outer)
    assert torch.equal(client.get_state(), lent.get_state())
