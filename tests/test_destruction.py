import pytest
import torch
from torchvision.transforms.functional import gaussian_blur

from fl_lightning.algorithms.fedov.destruction import DESTRUCTION_OPS, destroy
from fl_lightning.algorithms.fedov.voting import CODE_DESTRUCTION_OPS
from fl_lightning.algorithms.fedov import destruction as D

SHAPES = [(16, 1, 28, 28), (8, 3, 32, 32), (8, 1, 20, 28)]
OPS = {name: getattr(D, name) for name in DESTRUCTION_OPS} | {"destroy": destroy}


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def batch(shape, seed=0) -> torch.Tensor:
    """Uniform in [-1, 1] (so erase's 0 lies inside the range); the 3-channel one is channels_last."""
    x = torch.rand(shape, generator=gen(seed)) * 2 - 1
    return x.contiguous(memory_format=torch.channels_last) if shape[1] == 3 else x


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", list(OPS))
def test_every_op_changes_every_image_within_range_reproducibly(name, shape):
    op, x = OPS[name], batch(shape)
    before = x.clone()
    out = op(x, gen(1))

    assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device
    assert torch.equal(x, before)  # input untouched
    assert (out != x).flatten(1).any(1).all()  # each image really changed
    assert out.min() >= x.min() - 1e-6 and out.max() <= x.max() + 1e-6
    assert torch.equal(op(x, gen(1)), out)
    assert not torch.equal(op(x, gen(2)), out)


def swap_halves(img, dim):
    size = img.shape[dim]
    half = size // 2
    first, middle, last = img.split([half, size - 2 * half, half], dim)
    return torch.cat([last, middle, first], dim)


@pytest.mark.parametrize("shape", [(16, 1, 28, 28), (8, 2, 9, 11)])
def test_swap_exchanges_the_two_halves_of_rows_or_columns(shape):
    x = batch(shape)
    out = D.swap(x, gen(1))
    axes = []
    for img, res in zip(x, out):
        assert torch.equal(img.flatten().sort().values, res.flatten().sort().values)  # a permutation
        axes += [dim for dim in (1, 2) if torch.equal(res, swap_halves(img, dim))]
    assert len(axes) == len(x) and set(axes) == {1, 2}


@pytest.mark.parametrize("shape", [(16, 1, 28, 28), (8, 1, 20, 28)])
def test_copy_paste_copies_half_to_a_place_at_least_a_quarter_away_and_keeps_the_rest(shape):
    x = batch(shape)
    out = D.copy_paste(x, gen(1))
    axes = set()
    for img, res in zip(x, out):
        matches = []
        for dim in (1, 2):
            half = img.shape[dim] // 2
            for s in range(half):
                for d in range(half):
                    expected = img.clone()
                    expected.narrow(dim, d, half).copy_(img.narrow(dim, s, half))
                    if torch.equal(res, expected):
                        matches.append((dim, s, d))
        assert len(matches) == 1
        dim, s, d = matches[0]
        assert abs(s - d) >= img.shape[dim] // 2 / 2
        axes.add(dim)
    assert axes == {1, 2}


@pytest.mark.parametrize("shape", [(16, 1, 28, 28), (8, 1, 20, 28), (8, 1, 28, 20)])
def test_rotate_turns_two_side_squares_at_one_row_offset_by_the_same_quarter_turns(shape):
    x = batch(shape)
    out = D.rotate(x, gen(1))
    _, _, H, W = shape
    n = min(H, W) // 2
    turns = set()
    for img, res in zip(x, out):
        assert torch.equal(img.flatten().sort().values, res.flatten().sort().values)  # a permutation
        matches = []
        for p in range(H - n + 1):
            for k in (1, 2, 3):
                expected = img.clone()
                for c in (0, W - n):
                    expected[:, p:p + n, c:c + n] = torch.rot90(img[:, p:p + n, c:c + n], k, (1, 2))
                if torch.equal(res, expected):
                    matches.append(k)
        assert matches
        turns.update(matches)
    assert turns == {1, 2, 3}


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_erase_zeroes_one_box_of_a_third_to_a_half_and_keeps_the_rest(shape):
    x = batch(shape)
    out = D.erase(x, gen(1))
    _, C, H, W = shape
    zero = out == 0
    assert torch.equal(zero, zero[:, :1].expand_as(zero))  # all channels alike
    assert torch.equal(out[~zero], x[~zero])
    slack = (0.5 * (H + W) + 0.25) / (H * W)  # rounding h and w to integers
    for mask in zero[:, 0]:
        rows, cols = mask.any(1).nonzero(), mask.any(0).nonzero()
        assert mask[rows.min():rows.max() + 1, cols.min():cols.max() + 1].all()  # a box
        assert 0.33 - slack <= mask.float().mean() <= 0.5 + slack


def test_blur_matches_torchvision_gaussian_blur_per_image():
    x = batch((3, 2, 20, 28))
    kh, kw = torch.tensor([9, 1, 5]), torch.tensor([3, 7, 1])
    sigma = torch.tensor([10.0, 50.0, 0.8])  # the small sigma makes the kernel's shape matter
    out = D._gaussian_blur(x, kh, kw, sigma)
    for b in range(3):
        expected = gaussian_blur(x[b], [int(kw[b]), int(kh[b])], [float(sigma[b])] * 2)
        torch.testing.assert_close(out[b], expected, atol=1e-5, rtol=0)


def test_resized_crop_is_a_bilinear_zoom_on_a_box_of_a_tenth_to_a_third():
    H, W = 28, 28
    ramps = torch.stack(torch.meshgrid(torch.arange(H), torch.arange(W), indexing="ij")).float()
    x = 1 + ramps.expand(256, 2, H, W)  # channel 0 = 1 + row index, channel 1 = 1 + column index
    out = D.resized_crop(x, gen(1)) - 1
    assert out.min() >= 0  # the image border is repeated, not padded with zeros
    # A bilinear zoom of a ramp is a ramp, with slope crop size / image size (off the border).
    h = out[:, 0, 1:-1, W // 2].diff(dim=1) * H
    w = out[:, 1, H // 2, 1:-1].diff(dim=1) * W
    torch.testing.assert_close(h, h[:, :1].expand_as(h), atol=1e-3, rtol=0)
    torch.testing.assert_close(w, w[:, :1].expand_as(w), atol=1e-3, rtol=0)
    h, w = h[:, 0], w[:, 0]
    # Output pixel centre i samples the input at top + (i + 0.5) * h / H - 0.5.
    top = out[:, 0, H // 2, W // 2] - (H // 2 + 0.5) * h / H + 0.5
    left = out[:, 1, H // 2, W // 2] - (W // 2 + 0.5) * w / W + 0.5
    eps = 1e-3
    assert ((top >= -eps) & (top + h <= H + eps) & (left >= -eps) & (left + w <= W + eps)).all()
    assert ((h * w / (H * W) >= 0.1 - eps) & (h * w / (H * W) <= 0.33 + eps)).all()
    assert ((w / h >= 3 / 4 - eps) & (w / h <= 4 / 3 + eps)).all()


def test_destroy_with_one_op_is_that_op():
    x = batch((8, 3, 32, 32))
    assert torch.equal(destroy(x, gen(5), ("erase",)), D.erase(x, gen(5)))


def test_destroy_applies_the_chosen_op_to_each_image_and_chooses_every_op(monkeypatch):
    for k, name in enumerate(DESTRUCTION_OPS):
        monkeypatch.setitem(D._OPS, name, D._OPS[name]._replace(apply=lambda x, args, v=float(k): torch.full_like(x, v)))
    out = destroy(batch((256, 1, 8, 8)), gen(3))
    chosen, _ = D.draw_destruction(256, 8, 8, gen(3))
    assert torch.equal(out, chosen.float()[:, None, None, None].expand_as(out))
    assert set(chosen.tolist()) == set(range(len(DESTRUCTION_OPS)))


def test_the_fixed_shape_destruction_equals_each_op_on_its_own_images():
    # apply_destruction runs every op on every image and keeps each image's own: the same as
    # running each op on the images that drew it, whatever the rest of the batch holds
    x = batch((64, 3, 32, 32))
    op, args = D.draw_destruction(64, 32, 32, gen(7))
    out = D.apply_destruction(x, op, args.float())
    for k, name in enumerate(DESTRUCTION_OPS):
        own = (op == k).nonzero().squeeze(1)
        assert len(own), name
        torch.testing.assert_close(out[own], D._OPS[name].apply(x[own], args[own].float()), rtol=0, atol=1e-6)
    half = D.apply_destruction(x[:32], op[:32], args[:32].float())
    torch.testing.assert_close(out[:32], half, rtol=0, atol=1e-6)


def test_a_pool_listing_an_op_twice_draws_it_twice_as_often():
    # the FedOV authors' code lists some operations twice: our draw over the listed pool gives their law
    pool = ("swap", "rotate", "rotate")
    op, _ = D.draw_destruction(30000, 28, 28, gen(2), pool)
    assert D.distinct_ops(pool) == ("swap", "rotate")
    assert float((op == 1).float().mean()) == pytest.approx(2 / 3, abs=0.01)


def test_destruction_runs_under_vmap_as_member_by_member():
    from torch.func import vmap

    x = batch((3 * 8, 1, 28, 28)).view(3, 8, 1, 28, 28)
    drawn = [D.draw_destruction(8, 28, 28, gen(m)) for m in range(3)]
    op, args = torch.stack([d[0] for d in drawn]), torch.stack([d[1] for d in drawn]).float()
    one_by_one = torch.stack([D.apply_destruction(x[m], op[m], args[m]) for m in range(3)])
    torch.testing.assert_close(vmap(D.apply_destruction)(x, op, args), one_by_one, rtol=0, atol=0)


def test_unknown_op_is_rejected_by_name():
    with pytest.raises(ValueError, match="bogus") as info:
        destroy(batch((2, 1, 8, 8)), gen(0), ("swap", "bogus"))
    assert "resized_crop" in str(info.value)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_gives_the_cpu_result():
    x = batch((16, 3, 32, 32))
    torch.testing.assert_close(destroy(x.cuda(), gen(4)).cpu(), destroy(x, gen(4)), atol=1e-5, rtol=0)


def _draw_step_by_step(n, H, W, generator, ops):
    """The per-step order written out on the generator itself: each image's operation, then each
    entry of the pool's parameters for the images that got it, entry by entry."""
    op, args = torch.zeros(n, dtype=torch.long), torch.zeros(n, D.ARGS, dtype=torch.float64)
    if len(ops) == 1:
        args[:] = D._OPS[ops[0]].draw(n, H, W, generator)
        return op, args
    choice = (torch.rand(n, generator=generator, dtype=torch.float64) * len(ops)).long()
    for k, name in enumerate(ops):
        picked = (choice == k).nonzero().squeeze(1)
        if len(picked):
            op[picked] = D.distinct_ops(ops).index(name)
            args[picked] = D._OPS[name].draw(len(picked), H, W, generator)
    return op, args


@pytest.mark.parametrize("ops", [DESTRUCTION_OPS, CODE_DESTRUCTION_OPS, ("erase",), ("blur", "resized_crop")])
@pytest.mark.parametrize("H, W", [(28, 28), (32, 32), (9, 13)])
def test_a_window_of_steps_draws_what_the_steps_draw_one_by_one(ops, H, W):
    # the cohort engine draws a window of steps at once: the same numbers, and the generator
    # left where the steps one by one leave it
    sizes = [64, 17, 0, 1, 64, 2, 33, 64]
    at_once, one_by_one = gen(5), gen(5)
    window = D.draw_destruction_steps(sizes, H, W, at_once, ops)
    for n, (op, args) in zip(sizes, window):
        expected_op, expected_args = _draw_step_by_step(n, H, W, one_by_one, ops)
        assert torch.equal(op, expected_op) and torch.equal(args, expected_args)
    assert torch.equal(at_once.get_state(), one_by_one.get_state())
    assert D.draw_destruction_steps([], H, W, at_once, ops) == []
