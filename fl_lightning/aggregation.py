"""Server-side averaging, as pure functions (testable against hand-computed means)."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor


def weighted_mean(states: Sequence[dict[str, Tensor]], weights: Sequence[float]) -> dict[str, Tensor]:
    """sum_k w_k * state_k / sum_k w_k, per tensor (computed in float64, cast back)."""
    if not states:
        raise ValueError("cannot average zero states")
    total = float(sum(weights))
    out = {}
    for name, ref in states[0].items():
        acc = torch.zeros_like(ref, dtype=torch.float64)
        for state, w in zip(states, weights):
            acc += state[name].double() * (w / total)
        out[name] = acc.to(ref.dtype)
    return out


def fedavg(states: Sequence[dict[str, Tensor]], num_samples: Sequence[int], weighted: bool) -> dict[str, Tensor]:
    """FedAvg (Algorithm 1, line 8): the plain mean over the sampled clients, or weighted
    by their sample counts (McMahan et al.'s n_k/n)."""
    return weighted_mean(states, num_samples if weighted else [1.0] * len(states))


def one_vs_all_groups(
    current: dict[str, Tensor],
    updates: Sequence[tuple[Sequence[int], dict[str, Tensor], int]],
    weighted: bool,
) -> tuple[dict[str, Tensor], dict[int, int]]:
    """FedOVA's Eq. (5): w_i <- mean of w_{i,k} over the group G_i of clients that trained
    classifier i. ``current`` holds all n classifiers stacked (n, ...); each update is
    (classes, their stacked parameters (len(classes), ...), client sample count).
    A classifier no client trained keeps its parameters. Returns the new stack and the
    group size of each class."""
    groups: dict[int, list[tuple[dict[str, Tensor], float]]] = {}
    for classes, stacked, num_samples in updates:
        for row, c in enumerate(classes):
            slice_c = {name: t[row] for name, t in stacked.items()}
            groups.setdefault(int(c), []).append((slice_c, float(num_samples) if weighted else 1.0))
    new = {name: t.clone() for name, t in current.items()}
    for c, members in groups.items():
        mean = weighted_mean([m for m, _ in members], [w for _, w in members])
        for name in new:
            new[name][c] = mean[name]
    return new, {c: len(m) for c, m in groups.items()}
