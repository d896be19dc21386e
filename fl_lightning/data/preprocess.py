"""Steps between loading a data set and training on it: resizing images, and holding
out each client's local validation split."""

from __future__ import annotations

import numpy as np
import torch.nn.functional as F

from fl_lightning.data.datasets import FederatedDataset


def resize_images(data: FederatedDataset, size: int) -> FederatedDataset:
    """Both splits resized to size x size (bilinear, on the standardised images), as
    ATHENA-FL extends 28x28 MNIST/FMNIST to 32x32."""
    if size < 1:
        raise ValueError(f"data.image_size={size} must be >= 1")
    if data.train_x.dim() != 4:
        raise ValueError(f"data.image_size applies to images; {data.name} samples have shape {tuple(data.train_x.shape[1:])}")
    if tuple(data.train_x.shape[-2:]) != (size, size):
        resize = lambda x: F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False).contiguous()
        data.train_x, data.test_x = resize(data.train_x), resize(data.test_x)
    return data


def hold_out_validation(clients: list[np.ndarray], fraction: float, seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each client's indices split into (train, validation): round(fraction x n_k) random
    samples held out (at least one training sample stays), from the split's own stream."""
    if not 0 <= fraction < 1:
        raise ValueError(f"partition.validation_fraction={fraction} must lie in [0, 1)")
    rng = np.random.default_rng([seed, 0x7A11])
    train, val = [], []
    for indices in clients:
        count = min(int(round(fraction * len(indices))), max(len(indices) - 1, 0))
        held = rng.permutation(len(indices))[:count]
        mask = np.zeros(len(indices), dtype=bool)
        mask[held] = True
        train.append(indices[~mask])
        val.append(indices[mask])
    return train, val
