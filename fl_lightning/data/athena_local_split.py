"""ATHENA-FL's client data as the authors' code builds them (``federation.local_split: athena_code``).

The paper reports "the average accuracy obtained among all the clients and a 95% confidence
interval"; the authors' code (GTA-UFRJ/ATHENA-FL @ 8472ac5) measures it on data built like this
(docs/reproduction_readings.md, "ATHENA-FL's evaluation", has every file and line):

1. every class of the training set and, separately, of the test set is quadrupled, image by
   image in the data set's order: flipped upside down, rotated by 5π/3 (tfa.image.rotate:
   nearest neighbour, zero fill), and with N(0, 1) noise added to the 0-255 pixels and cast
   back to uint8 (numpy's cast: truncated, wrapped modulo 256), these three in turn for each
   image, then the originals after all of them (``augment_class``,
   src/dataset-process/IMAGE_DATASETS/augment_data.py);
2. each client takes a contiguous slice of every augmented class it holds, from the training
   and from the test arrays alike, and pools them (per class: training slice, then test slice);
3. the pool is shuffled (sklearn's ``shuffle(random_state=47527)``, the same permutation for
   every client and run) and cut 80/20: the client trains on the first 80 % and reports its
   accuracy on the other 20 % (load_federated_data.py, client.py).

So the test set's images are in the clients' training data, and the three views of one image
are shuffled across a client's 80/20 cut. Which clients hold which classes and how many of
their samples stay ours (``partition``): a client's slice of class c has the length its
partition share of c gives (the authors' code cuts every class into equal slices).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

ROTATION = 5 * math.pi / 3  # augment_data.py:79, tfa.image.rotate's angle (radians, counterclockwise)
NOISE_STD = 1.0  # augment_data.py:101, on the 0-255 pixels
SHUFFLE_STATE = 47527  # load_federated_data.py:64, sklearn.utils.shuffle(X, Y, random_state=47527)
TRAIN_FRACTION = 0.8  # client.py:53, trPer
IMAGE_SETS = ("mnist", "fashion_mnist", "cifar10", "svhn")  # the data sets whose pixels it augments


def flip_up_down(images: Tensor) -> Tensor:
    """tf.image.flip_up_down: rows reversed. ``images``: (N, C, H, W)."""
    return images.flip(-2)


def rotation_source(height: int, width: int, angle: float = ROTATION) -> tuple[Tensor, Tensor]:
    """(flat source index, inside) per output pixel of tfa.image.rotate(image, angle): output
    (x, y) reads input (cos·x − sin·y + x0, sin·x + cos·y + y0), the offsets turning about the
    centre, in float32 as TensorFlow computes it; nearest neighbour is std::round (half away
    from zero); a source outside the image reads the fill value 0."""
    a = torch.tensor(angle, dtype=torch.float32)
    cos, sin = torch.cos(a), torch.sin(a)
    h, w = torch.tensor(float(height)), torch.tensor(float(width))
    x0 = ((w - 1) - (cos * (w - 1) - sin * (h - 1))) / 2.0
    y0 = ((h - 1) - (sin * (w - 1) + cos * (h - 1))) / 2.0
    y, x = torch.meshgrid(torch.arange(height, dtype=torch.float32), torch.arange(width, dtype=torch.float32),
                          indexing="ij")
    src_x, src_y = cos * x - sin * y + x0, sin * x + cos * y + y0
    half_away = lambda v: torch.sign(v) * torch.floor(v.abs() + 0.5)  # noqa: E731
    col, row = half_away(src_x).long(), half_away(src_y).long()
    inside = (row >= 0) & (row < height) & (col >= 0) & (col < width)
    return (row.clamp(0, height - 1) * width + col.clamp(0, width - 1)).flatten(), inside.flatten()


def rotate(images: Tensor, angle: float = ROTATION) -> Tensor:
    """tfa.image.rotate(image, angle) of every image (nearest, zero fill). ``images``: (N, C, H, W)."""
    n, c, h, w = images.shape
    source, inside = rotation_source(h, w, angle)
    flat = images.reshape(n, c, h * w)[:, :, source]
    return (flat * inside.to(flat.dtype)).reshape(n, c, h, w)


def to_uint8_as_numpy(values: Tensor) -> Tensor:
    """``np.asarray(values, dtype=np.uint8)`` of floats on x86-64: truncated toward zero, then
    wrapped modulo 256 (−0.4 → 0, −1.2 → 255, 256.3 → 0)."""
    return torch.remainder(torch.trunc(values).long(), 256).to(torch.uint8)


def add_noise(images: Tensor, generator: torch.Generator, std: float = NOISE_STD) -> Tensor:
    """augment_data.py:101-102: image + N(0, std²) per pixel, cast back to uint8 as numpy casts."""
    noise = torch.randn(images.shape, generator=generator, dtype=torch.float32) * std
    return to_uint8_as_numpy(images.to(torch.float32) + noise)


def augment_class(images: Tensor, generator: torch.Generator) -> Tensor:
    """augment_data.py's ``augment_dataset`` on one class's uint8 images (N, C, H, W): for each
    image in turn its flipped, rotated and noisy copies, then all the originals: 4N images,
    [f(x0), r(x0), n(x0), f(x1), ..., x0, x1, ...]."""
    if images.dtype != torch.uint8:
        raise ValueError(f"augment_class takes uint8 pixels, not {images.dtype}")
    views = torch.stack([flip_up_down(images), rotate(images), add_noise(images, generator)], dim=1)
    return torch.cat([views.reshape(-1, *images.shape[1:]), images])


def slice_bounds(length: int, shares: np.ndarray) -> list[tuple[int, int]]:
    """Contiguous slices of ``length`` items in proportion to ``shares``, cut as
    load_federated_data.py:36-39 cuts (``int(len / parts * j)``): at ``int(length · cumulative
    share)``; equal shares give the code's equal slices."""
    shares = np.asarray(shares, dtype=np.float64)
    cuts = [0] + [int(length * s) for s in np.cumsum(shares)[:-1] / shares.sum()] + [length]
    return list(zip(cuts[:-1], cuts[1:]))


def authors_shuffle(n: int) -> np.ndarray:
    """sklearn.utils.shuffle(X, Y, random_state=47527)'s order: RandomState(47527) shuffling arange(n)."""
    return np.random.RandomState(SHUFFLE_STATE).permutation(n)


@dataclass
class LocalSplit:
    """Every client's pool, as indices into ``images``/``labels`` (the augmented classes,
    training then test arrays of each class in turn): ``train`` the 80 % each client trains
    on, ``test`` the 20 % it reports its accuracy on."""

    images: Tensor  # uint8 (M, C, H, W)
    labels: Tensor  # int64 (M,)
    train: list[np.ndarray]
    test: list[np.ndarray]


def build_local_split(train_images: Tensor, train_labels: Tensor, test_images: Tensor, test_labels: Tensor,
                      counts: np.ndarray, seed: int) -> LocalSplit:
    """The authors' client data (module docstring) for the clients whose training samples per
    class are ``counts`` (K, classes; our partition's). The noise is drawn from ``seed``; the
    80/20 shuffle is the authors' fixed one."""
    counts = np.asarray(counts)
    generator = torch.Generator().manual_seed(seed)
    parts: list[list[np.ndarray]] = [[] for _ in range(len(counts))]
    blocks, block_labels, offset = [], [], 0
    for c in range(counts.shape[1]):
        holders = np.flatnonzero(counts[:, c])
        if not len(holders):
            continue
        for images, labels in ((train_images, train_labels), (test_images, test_labels)):
            members = images[labels == c]  # the data set's order, as split_by_class.py keeps it
            if not len(members):
                continue
            augmented = augment_class(members, generator)
            blocks.append(augmented)
            block_labels.append(torch.full((len(augmented),), c, dtype=torch.long))
            for k, (begin, end) in zip(holders, slice_bounds(len(augmented), counts[holders, c])):
                parts[k].append(np.arange(offset + begin, offset + end))
            offset += len(augmented)
    train, test = [], []
    for pieces in parts:
        pool = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
        pool = pool[authors_shuffle(len(pool))]
        cut = int(len(pool) * TRAIN_FRACTION)  # load_federated_data.py:66
        train.append(pool[:cut].astype(np.int64))
        test.append(pool[cut:].astype(np.int64))
    return LocalSplit(torch.cat(blocks), torch.cat(block_labels), train, test)


def pixels(images: Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> Tensor:
    """The uint8 pixels of images standardised by ``datasets._standardise`` (exact: rounded)."""
    m, s = torch.tensor(mean).view(1, -1, 1, 1), torch.tensor(std).view(1, -1, 1, 1)
    return (images * s + m).mul_(255.0).round_().clamp_(0, 255).to(torch.uint8)


def use_local_split(data, clients: list[np.ndarray], seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``federation.local_split: athena_code`` on a loaded image set, before any resizing (the
    authors augment the stored images, then resize): ``data``'s training set becomes the
    clients' pools (standardised as before; its test set stays), and the result is (each
    client's 80 %, each client's 20 %) as indices into it. ``clients``: our partition."""
    from fl_lightning.data.datasets import _standardise
    from fl_lightning.data.partition import partition_table

    if not data.pixel_mean:
        raise ValueError(f"federation.local_split=athena_code augments 0-255 image pixels; data.name={data.name} "
                         f"holds no such images (mnist, fashion_mnist, cifar10 or svhn)")
    counts = partition_table(data.train_y.cpu().numpy(), clients, data.num_classes)
    split = build_local_split(pixels(data.train_x, data.pixel_mean, data.pixel_std), data.train_y,
                              pixels(data.test_x, data.pixel_mean, data.pixel_std), data.test_y, counts, seed)
    data.train_x, data.train_y = _standardise(split.images, data.pixel_mean, data.pixel_std), split.labels
    return split.train, split.test
