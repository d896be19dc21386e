"""FedOV's data destruction (Diao, Li & He, ICLR 2023, Section 3.4 and Appendix B.1).

Outliers are made from real images by one intense operation per image, drawn uniformly from
DESTRUCTION_OPS. They keep the low-level statistics of real data (colours, textures, edges) but lose
the global structure that identifies a class, so a classifier that learns to put them in an extra
"unknown" class learns to tell its known classes from anything else.

Everything is batched and reproducible on any device: per-image random parameters are drawn on the
CPU from the caller's torch.Generator and moved to x.device; each op is then a gather with a
per-image pixel index map, a mask, a grouped convolution or a grid_sample.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

DESTRUCTION_OPS = ("copy_paste", "swap", "rotate", "erase", "blur", "resized_crop")
_TAPS = 9  # longest blur kernel; shorter ones are zero-padded to it


def _rand(n: int, generator: torch.Generator, low: float = 0.0, high: float = 1.0) -> Tensor:
    """n uniforms in [low, high), float64 on the CPU (where the generator lives)."""
    return low + (high - low) * torch.rand(n, generator=generator, dtype=torch.float64)


def _randint(n: int, high: int | Tensor, generator: torch.Generator) -> Tensor:
    """n integers uniform in [0, high) on the CPU; `high` may differ per image."""
    return (_rand(n, generator) * high).long()


def _gather(x: Tensor, rows: Tensor, cols: Tensor) -> Tensor:
    """out[b, :, i, j] = x[b, :, rows[b, i, j], cols[b, i, j]] (maps broadcast to (B, H, W))."""
    B, C, H, W = x.shape
    idx = (rows * W + cols).expand(B, H, W).reshape(B, 1, H * W).expand(B, C, H * W)
    return x.reshape(B, C, H * W).gather(2, idx).view(B, C, H, W)


def _along_random_axis(x: Tensor, generator: torch.Generator, source: Callable[..., Tensor]) -> Tensor:
    """Remap the rows or (prob 1/2 per image) the columns; source(size, n, generator, device) -> (n, size)."""
    B, _, H, W = x.shape
    on_rows = (_rand(B, generator) < 0.5).to(x.device)[:, None]
    rows = torch.where(on_rows, source(H, B, generator, x.device), torch.arange(H, device=x.device))
    cols = torch.where(on_rows, torch.arange(W, device=x.device), source(W, B, generator, x.device))
    return _gather(x, rows[:, :, None], cols[:, None, :])


def _paste_source(size: int, n: int, generator: torch.Generator, device: torch.device) -> Tensor:
    half = size // 2
    s, d = torch.meshgrid(torch.arange(half), torch.arange(half), indexing="ij")
    # The reference re-draws (s, d) until |s - d| >= half / 2; a uniform valid pair is the same law
    # (drawing d given s would not be: for odd half some s have no valid d).
    valid = 2 * (s - d).abs() >= half
    pairs = torch.stack([s[valid], d[valid]], 1)
    s, d = pairs[_randint(n, len(pairs), generator)].to(device)[:, :, None].unbind(1)
    i = torch.arange(size, device=device)
    return torch.where((i >= d) & (i < d + half), i - d + s, i)


def _swap_source(size: int, n: int, generator: torch.Generator, device: torch.device) -> Tensor:
    half, i = size // 2, torch.arange(size, device=device)
    # First and last `half` exchanged; an odd size keeps its middle line in place.
    return torch.where(i < half, i + size - half, torch.where(i >= size - half, i - (size - half), i)).expand(n, size)


def copy_paste(x: Tensor, generator: torch.Generator) -> Tensor:
    """Paste half of the image (rows or columns) over another place at least a quarter away:
    the image now shows a part twice and misses another, breaking its global layout."""
    return _along_random_axis(x, generator, _paste_source)


def swap(x: Tensor, generator: torch.Generator) -> Tensor:
    """Exchange the left and right (or upper and lower) halves: every part survives, but the
    object is split at the border and its parts are in the wrong places."""
    return _along_random_axis(x, generator, _swap_source)


def rotate(x: Tensor, generator: torch.Generator) -> Tensor:
    """Rotate two squares of side min(H, W)//2 at a random row offset, one at each side, by the
    same k*90 degrees (k in {1, 2, 3}): local parts keep their texture but lose their orientation."""
    B, _, H, W = x.shape
    n = min(H, W) // 2
    p = _randint(B, H - n + 1, generator).to(x.device)[:, None, None]
    k = (1 + _randint(B, 3, generator)).to(x.device)[:, None, None]
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


def _box_sides(n: int, H: int, W: int, scale: tuple[float, float], ratio: tuple[float, float],
               generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """(h, w) with h * w = U(scale) * H * W and h / w = exp(U(log ratio)), float64 on the CPU.
    torchvision re-draws a box that does not fit; we clamp its ratio instead, which keeps the area."""
    area = _rand(n, generator, *scale) * H * W
    r = torch.exp(_rand(n, generator, math.log(ratio[0]), math.log(ratio[1])))
    r = torch.minimum(torch.maximum(r, area / W**2), H**2 / area)
    return (area * r).sqrt(), (area / r).sqrt()


def erase(x: Tensor, generator: torch.Generator) -> Tensor:
    """Zero a box of 33-50% of the image (torchvision RandomErasing(p=1, scale=(0.33, 0.5),
    ratio=(0.3, 3.3), value=0), but a box that would not fit gets its aspect ratio clamped instead
    of re-drawn): a large part of the object is simply gone."""
    B, _, H, W = x.shape
    h, w = _box_sides(B, H, W, (0.33, 0.5), (0.3, 3.3), generator)
    h, w = h.round().long().clamp(1, H), w.round().long().clamp(1, W)
    top, left = _randint(B, H - h + 1, generator), _randint(B, W - w + 1, generator)
    top, left, h, w = (t.to(x.device)[:, None, None] for t in (top, left, h, w))
    i, j = torch.arange(H, device=x.device)[:, None], torch.arange(W, device=x.device)
    box = (i >= top) & (i < top + h) & (j >= left) & (j < left + w)
    return x.masked_fill(box[:, None], 0)


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


def blur(x: Tensor, generator: torch.Generator) -> Tensor:
    """Gaussian blur with sigma ~ U(10, 100) and a kernel of 3-9 taps along one axis and 1-5 along
    the other: with such a sigma it is a box filter that smears the edges and fine detail."""
    B = x.shape[0]
    big, small = 3 + 2 * _randint(B, 4, generator), 1 + 2 * _randint(B, 3, generator)
    tall = _rand(B, generator) < 0.5
    sigma = _rand(B, generator, 10.0, 100.0)
    kh, kw = torch.where(tall, big, small), torch.where(tall, small, big)
    return _gaussian_blur(x, kh.to(x.device), kw.to(x.device), sigma.to(x.device, x.dtype))


def resized_crop(x: Tensor, generator: torch.Generator) -> Tensor:
    """Crop 10-33% of the image (ratio 3/4-4/3) and resize it back to (H, W) bilinearly, as
    torchvision RandomResizedCrop but with a real-valued box: only a fragment of the object remains."""
    B, C, H, W = x.shape
    h, w = _box_sides(B, H, W, (0.1, 0.33), (3 / 4, 4 / 3), generator)  # range is its own inverse
    top, left = _rand(B, generator) * (H - h), _rand(B, generator) * (W - w)
    theta = torch.zeros(B, 2, 3, dtype=torch.float64)
    theta[:, 0, 0], theta[:, 0, 2] = w / W, (2 * left + w) / W - 1
    theta[:, 1, 1], theta[:, 1, 2] = h / H, (2 * top + h) / H - 1
    grid = F.affine_grid(theta.to(x.device, x.dtype), [B, C, H, W], align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


_OPS: dict[str, Callable[[Tensor, torch.Generator], Tensor]] = {
    "copy_paste": copy_paste, "swap": swap, "rotate": rotate,
    "erase": erase, "blur": blur, "resized_crop": resized_crop,
}


def _choose_ops(n: int, num_ops: int, generator: torch.Generator) -> Tensor:
    """Index into `ops` of the operation for each of n images (CPU)."""
    return _randint(n, num_ops, generator)


def destroy(x: Tensor, generator: torch.Generator, ops: Sequence[str] = DESTRUCTION_OPS) -> Tensor:
    """One operation drawn uniformly from `ops` for each image (x: (B, C, H, W), H, W >= 8)."""
    bad = [name for name in ops if name not in _OPS]
    if bad or not ops:
        raise ValueError(f"unknown destruction op(s) {bad or '(none given)'}; valid ops: {DESTRUCTION_OPS}")
    if len(ops) == 1:  # nothing to choose, so destroy(x, g, (op,)) == op(x, g)
        return _OPS[ops[0]](x, generator)
    choice = _choose_ops(x.shape[0], len(ops), generator)
    out = torch.empty_like(x)
    for k, name in enumerate(ops):
        picked = (choice == k).nonzero().squeeze(1)
        if len(picked):  # decided on the CPU, so no device sync
            idx = picked.to(x.device)
            out[idx] = _OPS[name](x[idx], generator)
    return out
