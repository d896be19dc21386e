"""FedOV's data destruction (Diao, Li & He, ICLR 2023, Section 3.4 and Appendix B.1).

Outliers are made from real images by one intense operation per image, drawn uniformly from
DESTRUCTION_OPS. They keep the low-level statistics of real data (colours, textures, edges) but lose
the global structure that identifies a class, so a classifier that learns to put them in an extra
"unknown" class learns to tell its known classes from anything else.

Randomness is data: ``draw_destruction`` draws, on the CPU from the caller's torch.Generator, which
operation each image gets and that operation's parameters (ARGS numbers per image); ``apply_destruction``
then destroys a batch from those tensors with fixed shapes and no host work — every operation on every
image, the chosen one kept with ``torch.where`` — so the same draws give the same outliers in a client's
own fit, in the vectorised cohort and inside a captured CUDA graph. Each operation is a gather with a
per-image pixel index map, a mask, a grouped convolution or a grid_sample.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor

DESTRUCTION_OPS = ("copy_paste", "swap", "rotate", "erase", "blur", "resized_crop")
ARGS = 4  # parameters per image, the most any operation needs (its layout: each op's draw)
_TAPS = 9  # longest blur kernel; shorter ones are zero-padded to it


class _Columns:
    """Uniforms drawn beforehand for the images of one operation: its draw's j-th ``_rand`` call
    gets column j, the numbers its j-th ``torch.rand`` call on the generator would have drawn."""

    def __init__(self, columns: Sequence[Tensor]) -> None:
        self.columns, self.used = list(columns), 0

    def take(self, n: int) -> Tensor:
        column = self.columns[self.used]
        if len(column) != n:
            raise RuntimeError(f"a column of {len(column)} uniforms for a draw of {n}")
        self.used += 1
        return column


Uniforms = Union[torch.Generator, _Columns]


def _rand(n: int, source: Uniforms, low: float = 0.0, high: float = 1.0) -> Tensor:
    """n uniforms in [low, high), float64 on the CPU (where the generator lives)."""
    u = torch.rand(n, generator=source, dtype=torch.float64) if isinstance(source, torch.Generator) else source.take(n)
    return low + (high - low) * u


def _randint(n: int, high: int | Tensor, source: Uniforms) -> Tensor:
    """n integers uniform in [0, high) on the CPU; `high` may differ per image."""
    return (_rand(n, source) * high).long()


def _columns(*values: Tensor) -> Tensor:
    """(n, ARGS) float64: the given per-image values, zeros after them."""
    n = len(values[0])
    out = torch.zeros(n, ARGS, dtype=torch.float64)
    for j, v in enumerate(values):
        out[:, j] = v.to(torch.float64)
    return out


def _gather(x: Tensor, rows: Tensor, cols: Tensor) -> Tensor:
    """out[b, :, i, j] = x[b, :, rows[b, i, j], cols[b, i, j]] (maps broadcast to (B, H, W))."""
    B, C, H, W = x.shape
    idx = (rows * W + cols).expand(B, H, W).reshape(B, 1, H * W).expand(B, C, H * W)
    return x.reshape(B, C, H * W).gather(2, idx).view(B, C, H, W)


def _remap_one_axis(x: Tensor, on_rows: Tensor, row_source: Tensor, col_source: Tensor) -> Tensor:
    """Rows remapped by ``row_source`` (B, H) where ``on_rows``, else columns by ``col_source`` (B, W)."""
    _, _, H, W = x.shape
    on_rows = on_rows[:, None]
    rows = torch.where(on_rows, row_source, torch.arange(H, device=x.device))
    cols = torch.where(on_rows, torch.arange(W, device=x.device), col_source)
    return _gather(x, rows[:, :, None], cols[:, None, :])


# ---- copy_paste -------------------------------------------------------------------------------

def _paste_pairs(size: int, n: int, generator: Uniforms) -> tuple[Tensor, Tensor]:
    """(source, destination) starts of a pasted half, uniform over the pairs at least a quarter apart.
    The reference re-draws (s, d) until |s - d| >= half / 2; a uniform valid pair is the same law
    (drawing d given s would not be: for odd half some s have no valid d)."""
    half = size // 2
    s, d = torch.meshgrid(torch.arange(half), torch.arange(half), indexing="ij")
    valid = 2 * (s - d).abs() >= half
    pairs = torch.stack([s[valid], d[valid]], 1)
    return pairs[_randint(n, len(pairs), generator)].unbind(1)


def _draw_copy_paste(n: int, H: int, W: int, generator: Uniforms) -> Tensor:
    on_rows = _rand(n, generator) < 0.5
    (rs, rd), (cs, cd) = _paste_pairs(H, n, generator), _paste_pairs(W, n, generator)
    return _columns(on_rows, torch.where(on_rows, rs, cs), torch.where(on_rows, rd, cd))


def _paste_source(size: int, s: Tensor, d: Tensor) -> Tensor:
    half, i = size // 2, torch.arange(size, device=s.device)
    s, d = s[:, None], d[:, None]
    return torch.where((i >= d) & (i < d + half), i - d + s, i)


def _apply_copy_paste(x: Tensor, args: Tensor) -> Tensor:
    """Paste half of the image (rows or columns) over another place at least a quarter away:
    the image now shows a part twice and misses another, breaking its global layout."""
    _, _, H, W = x.shape
    on_rows, s, d = args[:, 0] > 0.5, args[:, 1].long(), args[:, 2].long()
    return _remap_one_axis(x, on_rows, _paste_source(H, s, d), _paste_source(W, s, d))


# ---- swap -------------------------------------------------------------------------------------

def _draw_swap(n: int, H: int, W: int, generator: Uniforms) -> Tensor:
    return _columns(_rand(n, generator) < 0.5)


def _swap_source(size: int, n: int, device: torch.device) -> Tensor:
    half, i = size // 2, torch.arange(size, device=device)
    # First and last `half` exchanged; an odd size keeps its middle line in place.
    return torch.where(i < half, i + size - half, torch.where(i >= size - half, i - (size - half), i)).expand(n, size)


def _apply_swap(x: Tensor, args: Tensor) -> Tensor:
    """Exchange the left and right (or upper and lower) halves: every part survives, but the
    object is split at the border and its parts are in the wrong places."""
    B, _, H, W = x.shape
    return _remap_one_axis(x, args[:, 0] > 0.5, _swap_source(H, B, x.device), _swap_source(W, B, x.device))


# ---- rotate -----------------------------------------------------------------------------------

def _draw_rotate(n: int, H: int, W: int, generator: Uniforms) -> Tensor:
    side = min(H, W) // 2
    p = _randint(n, H - side + 1, generator)
    k = 1 + _randint(n, 3, generator)
    return _columns(p, k)


def _apply_rotate(x: Tensor, args: Tensor) -> Tensor:
    """Rotate two squares of side min(H, W)//2 at a random row offset, one at each side, by the
    same k*90 degrees (k in {1, 2, 3}): local parts keep their texture but lose their orientation."""
    _, _, H, W = x.shape
    n = min(H, W) // 2
    p, k = (args[:, j].long()[:, None, None] for j in (0, 1))
    i, j = torch.arange(H, device=x.device)[:, None], torch.arange(W, device=x.device)
    right = j >= W - n
    u, v, last = i - p, torch.where(right, j - (W - n), j), n - 1  # coordinates inside a square
    inside = (u >= 0) & (u < n) & ((j < n) | right)
    # torch.rot90(square, k) read as a source map: out[u, v] = square[src_u, src_v].
    src_u = torch.where(k == 1, v, torch.where(k == 2, last - u, last - v))
    src_v = torch.where(k == 1, last - u, torch.where(k == 2, last - v, u))
    rows = torch.where(inside, p + src_u, i)
    cols = torch.where(inside, torch.where(right, W - n, 0) + src_v, j)
    return _gather(x, rows, cols)


# ---- erase ------------------------------------------------------------------------------------

def _box_sides(n: int, H: int, W: int, scale: tuple[float, float], ratio: tuple[float, float],
               generator: Uniforms) -> tuple[Tensor, Tensor]:
    """(h, w) with h * w = U(scale) * H * W and h / w = exp(U(log ratio)), float64 on the CPU.
    torchvision re-draws a box that does not fit; we clamp its ratio instead, which keeps the area."""
    area = _rand(n, generator, *scale) * H * W
    r = torch.exp(_rand(n, generator, math.log(ratio[0]), math.log(ratio[1])))
    r = torch.minimum(torch.maximum(r, area / W**2), H**2 / area)
    return (area * r).sqrt(), (area / r).sqrt()


def _draw_erase(n: int, H: int, W: int, generator: Uniforms) -> Tensor:
    h, w = _box_sides(n, H, W, (0.33, 0.5), (0.3, 3.3), generator)
    h, w = h.round().long().clamp(1, H), w.round().long().clamp(1, W)
    top, left = _randint(n, H - h + 1, generator), _randint(n, W - w + 1, generator)
    return _columns(top, left, h, w)


def _apply_erase(x: Tensor, args: Tensor) -> Tensor:
    """Zero a box of 33-50% of the image (torchvision RandomErasing(p=1, scale=(0.33, 0.5),
    ratio=(0.3, 3.3), value=0), but a box that would not fit gets its aspect ratio clamped instead
    of re-drawn): a large part of the object is simply gone."""
    _, _, H, W = x.shape
    top, left, h, w = (args[:, j].long()[:, None, None] for j in range(4))
    i, j = torch.arange(H, device=x.device)[:, None], torch.arange(W, device=x.device)
    box = (i >= top) & (i < top + h) & (j >= left) & (j < left + w)
    return x.masked_fill(box[:, None], 0)


# ---- blur -------------------------------------------------------------------------------------

def _gaussian_blur(x: Tensor, kh: Tensor, kw: Tensor, sigma: Tensor) -> Tensor:
    """Image b blurred by a (kh[b], kw[b]) Gaussian of std sigma[b], as torchvision's gaussian_blur."""
    B, C, H, W = x.shape
    t = torch.arange(_TAPS, device=x.device, dtype=x.dtype) - _TAPS // 2

    def taps(k: Tensor) -> Tensor:
        pdf = torch.exp(-0.5 * (t / sigma[:, None]) ** 2) * (2 * t.abs() < k[:, None])
        return (pdf / pdf.sum(1, keepdim=True)).repeat_interleave(C, 0)

    # Zero taps outside an image's own kernel make the common reflect padding of 4 act as its own.
    y, pad = x.reshape(1, B * C, H, W), _TAPS // 2
    y = F.conv2d(F.pad(y, (0, 0, pad, pad), mode="reflect"), taps(kh).view(B * C, 1, _TAPS, 1), groups=B * C)
    y = F.conv2d(F.pad(y, (pad, pad, 0, 0), mode="reflect"), taps(kw).view(B * C, 1, 1, _TAPS), groups=B * C)
    return y.view(B, C, H, W)


def _draw_blur(n: int, H: int, W: int, generator: Uniforms) -> Tensor:
    big, small = 3 + 2 * _randint(n, 4, generator), 1 + 2 * _randint(n, 3, generator)
    tall = _rand(n, generator) < 0.5
    sigma = _rand(n, generator, 10.0, 100.0)
    return _columns(torch.where(tall, big, small), torch.where(tall, small, big), sigma)


def _apply_blur(x: Tensor, args: Tensor) -> Tensor:
    """Gaussian blur with sigma ~ U(10, 100) and a kernel of 3-9 taps along one axis and 1-5 along
    the other: with such a sigma it is a box filter that smears the edges and fine detail."""
    return _gaussian_blur(x, args[:, 0], args[:, 1], args[:, 2].to(x.dtype))


# ---- resized_crop -----------------------------------------------------------------------------

def _draw_resized_crop(n: int, H: int, W: int, generator: Uniforms) -> Tensor:
    h, w = _box_sides(n, H, W, (0.1, 0.33), (3 / 4, 4 / 3), generator)  # range is its own inverse
    top, left = _rand(n, generator) * (H - h), _rand(n, generator) * (W - w)
    # the crop as affine_grid's theta: x scale, x shift, y scale, y shift
    return _columns(w / W, (2 * left + w) / W - 1, h / H, (2 * top + h) / H - 1)


def _apply_resized_crop(x: Tensor, args: Tensor) -> Tensor:
    """Crop 10-33% of the image (ratio 3/4-4/3) and resize it back to (H, W) bilinearly, as
    torchvision RandomResizedCrop but with a real-valued box: only a fragment of the object remains."""
    _, _, H, W = x.shape
    scale_x, shift_x, scale_y, shift_y = (args[:, j].to(x.dtype)[:, None, None] for j in range(4))
    # F.affine_grid's sampling grid for this axis-aligned theta, written out: its batching rule
    # under vmap is a per-member loop. Pixel centres in [-1, 1] (align_corners=False), as its base grid.
    cols = torch.linspace(-1, 1, W, device=x.device, dtype=x.dtype) * (W - 1) / W
    rows = torch.linspace(-1, 1, H, device=x.device, dtype=x.dtype) * (H - 1) / H
    grid = torch.stack(torch.broadcast_tensors(scale_x * cols + shift_x, scale_y * rows[:, None] + shift_y), -1)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


class _Op(NamedTuple):
    draw: Callable[[int, int, int, Uniforms], Tensor]  # (n, H, W, generator) -> (n, ARGS) float64
    uniforms: int  # the draw's torch.rand calls of n numbers each (its columns)
    apply: Callable[[Tensor, Tensor], Tensor]  # (x, args) -> destroyed x
    neutral: tuple[float, ...]  # args that are valid for any image (a well-defined result, discarded)


_OPS: dict[str, _Op] = {
    "copy_paste": _Op(_draw_copy_paste, 3, _apply_copy_paste, (0, 0, 0, 0)),
    "swap": _Op(_draw_swap, 1, _apply_swap, (0, 0, 0, 0)),
    "rotate": _Op(_draw_rotate, 2, _apply_rotate, (0, 1, 0, 0)),
    "erase": _Op(_draw_erase, 4, _apply_erase, (0, 0, 0, 0)),
    "blur": _Op(_draw_blur, 4, _apply_blur, (1, 1, 1, 0)),
    "resized_crop": _Op(_draw_resized_crop, 4, _apply_resized_crop, (1, 0, 1, 0)),
}


def check_ops(ops: Sequence[str]) -> None:
    bad = [name for name in ops if name not in _OPS]
    if bad or not ops:
        raise ValueError(f"unknown destruction op(s) {bad or '(none given)'}; valid ops: {DESTRUCTION_OPS}")


def distinct_ops(ops: Sequence[str]) -> tuple[str, ...]:
    """``ops`` without repeats, in order: what ``apply_destruction`` computes (a pool that lists an
    operation twice, as the FedOV authors' code does, only draws it twice as often)."""
    return tuple(dict.fromkeys(ops))


def draw_destruction(n: int, H: int, W: int, generator: torch.Generator,
                     ops: Sequence[str] = DESTRUCTION_OPS) -> tuple[Tensor, Tensor]:
    """The random part of destroying n images of H x W: (op, args), op (n,) long indexing
    ``distinct_ops(ops)``, args (n, ARGS) float64, drawn on the CPU from ``generator``: first the
    operation of each image uniformly from ``ops``, then each operation's parameters for the images
    that got it, operation by operation in the order of ``ops``."""
    return draw_destruction_steps([n], H, W, generator, ops)[0]


def draw_destruction_steps(sizes: Sequence[int], H: int, W: int, generator: torch.Generator,
                           ops: Sequence[str] = DESTRUCTION_OPS) -> list[tuple[Tensor, Tensor]]:
    """``draw_destruction`` for batches of ``sizes[s]`` images, one after another, at once: the
    same numbers as drawing them step by step. Only the uniforms are drawn step by step (each
    step's operation choices say how many its parameters take); the arithmetic that turns them
    into parameters runs once per operation over all steps (per image, so batching changes no
    number), which makes a cohort's window of draws cost a few host calls per step, not hundreds."""
    check_ops(ops)
    names, sizes = distinct_ops(ops), [int(n) for n in sizes]
    if not sizes:
        return []
    K, S, T = len(ops), len(sizes), sum(sizes)
    need = torch.tensor([_OPS[name].uniforms for name in ops])
    choices, blocks = [], []
    for n in sizes:  # the generator's stream, in the order one step at a time consumes it
        # one entry: nothing to choose, no choice drawn (destroy(x, g, (op,)) == op(x, g))
        choice = _randint(n, K, generator) if K > 1 else torch.zeros(n, dtype=torch.long)
        counts = torch.bincount(choice, minlength=K)
        blocks.append(torch.rand(int((counts * need).sum()), generator=generator, dtype=torch.float64))
        choices.append(choice)
    choice, uniforms = torch.cat(choices), torch.cat(blocks)
    step = torch.repeat_interleave(torch.arange(S), torch.tensor(sizes, dtype=torch.long))
    key = step * K + choice
    counts = torch.bincount(key, minlength=S * K).view(S, K)
    # A step's block holds entry 0's columns, then entry 1's, ...; a column has one number per
    # image of that entry, the images in their order in the batch.
    taken = counts * need
    step_start = taken.sum(1).cumsum(0) - taken.sum(1)
    entry_start = step_start[:, None] + taken.cumsum(1) - taken
    group_start = counts.flatten().cumsum(0) - counts.flatten()
    order = torch.sort(key, stable=True).indices
    rank = torch.empty_like(key)
    rank[order] = torch.arange(T) - group_start[key[order]]
    op = torch.zeros(T, dtype=torch.long)
    args = torch.zeros(T, ARGS, dtype=torch.float64)
    op_of_entry = torch.tensor([names.index(name) for name in ops])
    for index, name in enumerate(names):  # a pool listing an operation twice: both entries' images in one draw
        picked = (op_of_entry[choice] == index).nonzero().squeeze(1)
        if not len(picked):
            continue
        entry = choice[picked]
        first = entry_start[step[picked], entry] + rank[picked]
        stride = counts[step[picked], entry]
        columns = _Columns([uniforms[first + j * stride] for j in range(_OPS[name].uniforms)])
        op[picked] = index
        args[picked] = _OPS[name].draw(len(picked), H, W, columns)
        if columns.used != len(columns.columns):
            raise RuntimeError(f"{name}'s draw took {columns.used} columns of uniforms, not {len(columns.columns)}")
    return list(zip(op.split(sizes), args.split(sizes)))


def apply_destruction(x: Tensor, op: Tensor, args: Tensor, ops: Sequence[str] = DESTRUCTION_OPS) -> Tensor:
    """x (B, C, H, W) destroyed by the drawn ``op`` (B,) and ``args`` (B, ARGS) (on x's device):
    every distinct operation of ``ops`` runs on every image (fixed shapes, no host sync), each image
    keeps its own; an image's result does not depend on the other images of the batch."""
    out = x
    for k, name in enumerate(distinct_ops(ops)):
        own = op == k
        # filled on the device (no host-to-device copy, which a CUDA graph capture refuses)
        neutral = torch.stack([torch.full((), float(v), dtype=args.dtype, device=args.device)
                               for v in _OPS[name].neutral])
        made = _OPS[name].apply(x, torch.where(own[:, None], args, neutral))
        out = torch.where(own[:, None, None, None], made, out)
    return out


def destroy(x: Tensor, generator: torch.Generator, ops: Sequence[str] = DESTRUCTION_OPS) -> Tensor:
    """One operation drawn uniformly from `ops` for each image (x: (B, C, H, W), H, W >= 8)."""
    B, _, H, W = x.shape
    op, args = draw_destruction(B, H, W, generator, ops)
    return apply_destruction(x, op.to(x.device), args.to(x.device, x.dtype), ops)


def _single(name: str) -> Callable[[Tensor, torch.Generator], Tensor]:
    def destroy_with(x: Tensor, generator: torch.Generator) -> Tensor:
        B, _, H, W = x.shape
        return _OPS[name].apply(x, _OPS[name].draw(B, H, W, generator).to(x.device, x.dtype))

    destroy_with.__name__ = name
    destroy_with.__doc__ = _OPS[name].apply.__doc__
    return destroy_with


copy_paste, swap, rotate, erase, blur, resized_crop = (_single(name) for name in DESTRUCTION_OPS)
