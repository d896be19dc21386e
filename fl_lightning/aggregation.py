"""Server-side averaging, as pure functions (testable against hand-computed means):
FedAvg, FedOVA's grouped Eq. 5, FedNova's normalised averaging, SCAFFOLD's control variates."""

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


def fednova_norm(steps: int, momentum: float = 0.0) -> float:
    """FedNova's a_i for tau_i local SGD steps (Wang et al. 2020; NIID-Bench): tau_i for
    plain SGD; with momentum rho, (tau_i - rho (1 - rho^tau_i) / (1 - rho)) / (1 - rho), the
    sum of the coefficients with which the tau_i gradients enter the local update."""
    if not 0 <= momentum < 1:
        raise ValueError(f"optimizer.momentum={momentum} must lie in [0, 1) for FedNova")
    if steps < 1:
        raise ValueError(f"FedNova needs at least one local step per client, got {steps}")
    if momentum == 0:
        return float(steps)
    rho = momentum
    return (steps - rho * (1 - rho**steps) / (1 - rho)) / (1 - rho)


def fednova(
    global_state: dict[str, Tensor],
    states: Sequence[dict[str, Tensor]],
    steps: Sequence[int],
    num_samples: Sequence[int],
    momentum: float = 0.0,
    weighted: bool = True,
) -> dict[str, Tensor]:
    """FedNova's server update: d_i = (w - w_i) / a_i, tau_eff = sum_i p_i a_i,
    w <- w - tau_eff * sum_i p_i d_i, with p_i = n_i / sum n (or 1/m unless ``weighted``).
    Applied to every floating tensor (in float64, cast back), as NIID-Bench does; integer
    buffers such as BatchNorm's step counter are averaged as FedAvg does."""
    if not states:
        raise ValueError("cannot aggregate zero states")
    weights = [float(n) if weighted else 1.0 for n in num_samples]
    total = sum(weights)
    p = [w / total for w in weights]
    a = [fednova_norm(t, momentum) for t in steps]
    tau_eff = sum(pi * ai for pi, ai in zip(p, a))
    out = {}
    for name, ref in global_state.items():
        if not ref.is_floating_point():
            out[name] = weighted_mean([{name: s[name]} for s in states], weights)[name]
            continue
        w = ref.double()
        direction = torch.zeros_like(w)
        for state, pi, ai in zip(states, p, a):
            direction += (w - state[name].double()) * (pi / ai)
        out[name] = (w - tau_eff * direction).to(ref.dtype)
    return out


def scaffold_client_delta(
    start: dict[str, Tensor], final: dict[str, Tensor], control: dict[str, Tensor], steps: int, lr: float,
) -> dict[str, Tensor]:
    """SCAFFOLD option II on a client (Karimireddy et al. 2020, Eq. 4):
    c_i+ = c_i - c + (x - y_i) / (K eta), so delta c_i = c_i+ - c_i = (x - y_i) / (K eta) - c,
    for every parameter named in ``control`` (x: the global model the client started from,
    y_i: its model after K local steps of learning rate eta)."""
    if steps < 1:
        raise ValueError(f"SCAFFOLD needs at least one local step per client, got {steps}")
    return {name: ((start[name].double() - final[name].double()) / (steps * lr) - c.double()).to(c.dtype)
            for name, c in control.items()}


def scaffold_server_control(control: dict[str, Tensor], deltas: Sequence[dict[str, Tensor]],
                            num_clients: int) -> dict[str, Tensor]:
    """SCAFFOLD's server update of its control variate (global learning rate 1):
    c <- c + (1/N) sum_i delta c_i over the participating clients (N: all clients). Each
    client updates its own c_i <- c_i + delta c_i itself."""
    new_c = {}
    for name, c in control.items():
        total = torch.zeros_like(c, dtype=torch.float64)
        for delta in deltas:
            total += delta[name].double()
        new_c[name] = (c.double() + total / num_clients).to(c.dtype)
    return new_c
