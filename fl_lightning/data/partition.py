"""Splitting a training set over K clients. Each partitioner returns one int64 index
array per client (views into the shared tensors) and uses only the generator it is given."""

from __future__ import annotations

import numpy as np

from fl_lightning.config import PartitionConfig


def iid(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    return [np.sort(part) for part in np.array_split(rng.permutation(len(labels)), num_clients)]


def non_iid_l(labels: np.ndarray, num_clients: int, labels_per_client: int, rng: np.random.Generator) -> list[np.ndarray]:
    """FedOVA's non-IID-l (Section IV-A): group the data by label, divide each label group
    into l*K/n shards, and give every client l shards of l *different* labels.

    Which labels meet on a client is random: each client draws its labels without
    replacement, weighted by the shards each label has left. A label whose remaining
    shards equal the number of clients still to serve must be taken now, which makes the
    draw always completable (every label is then spread over exactly l*K/n clients).
    """
    classes = np.unique(labels)
    n, K, l = len(classes), num_clients, labels_per_client
    if not 1 <= l <= n:
        raise ValueError(f"partition.labels_per_client={l} must lie in [1, {n}] (the number of classes)")
    if (l * K) % n:
        raise ValueError(
            f"non_iid_l needs l*K/n shards per label to be whole: partition.labels_per_client={l} x "
            f"partition.num_clients={K} is not divisible by {n} classes"
        )
    shards_per_label = l * K // n
    shards = {}
    for c in classes:
        members = rng.permutation(np.flatnonzero(labels == c))
        if len(members) < shards_per_label:
            raise ValueError(f"class {c} has {len(members)} samples, fewer than its {shards_per_label} shards")
        shards[c] = np.array_split(members, shards_per_label)
    remaining = {c: shards_per_label for c in classes}
    clients = []
    for k in range(K):
        clients_left = K - k
        forced = [c for c in classes if remaining[c] == clients_left]
        free = np.array([c for c in classes if 0 < remaining[c] < clients_left])
        chosen = list(forced)
        if len(chosen) < l:
            weights = np.array([remaining[c] for c in free], dtype=float)
            chosen += list(rng.choice(free, size=l - len(chosen), replace=False, p=weights / weights.sum()))
        parts = []
        for c in chosen:
            remaining[c] -= 1
            parts.append(shards[c][remaining[c]])
        clients.append(np.sort(np.concatenate(parts)))
    return clients


def num_labels(labels: np.ndarray, num_clients: int, labels_per_client: int, rng: np.random.Generator) -> list[np.ndarray]:
    """NIID-Bench's #C=k (used by FedOV): client i holds class i mod n plus k-1 other
    random classes; each class is split equally over the clients holding it. A class no
    client drew is left out (NIID-Bench does the same)."""
    classes = np.unique(labels)
    n, k = len(classes), labels_per_client
    if not 1 <= k <= n:
        raise ValueError(f"partition.labels_per_client={k} must lie in [1, {n}]")
    held = []
    for i in range(num_clients):
        current = [classes[i % n]]
        while len(current) < k:
            c = classes[rng.integers(n)]
            if c not in current:
                current.append(c)
        held.append(current)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in classes:
        holders = [i for i in range(num_clients) if c in held[i]]
        if not holders:
            continue
        for i, split in zip(holders, np.array_split(rng.permutation(np.flatnonzero(labels == c)), len(holders))):
            parts[i].append(split)
    return [np.sort(np.concatenate(p)) for p in parts]


def label_groups(labels: np.ndarray, num_clients: int, labels_per_client: int, rng: np.random.Generator) -> list[np.ndarray]:
    """ATHENA-FL's non-IID scenarios (Section 5.2; Problem Formulation 4.1: clients of one
    cluster hold the same classes): the n classes are cut into n/l disjoint groups of l
    consecutive classes ({0,1}, {2,3}, ... for l = 2), client k belongs to group k mod (n/l),
    and each class is split equally over the clients of its group. The true clusters are
    then known: the groups."""
    classes = np.unique(labels)
    n, l = len(classes), labels_per_client
    if not 1 <= l <= n or n % l:
        raise ValueError(f"label_groups needs partition.labels_per_client={l} to divide the {n} classes")
    num_groups = n // l
    if num_clients < num_groups:
        raise ValueError(f"label_groups needs partition.num_clients={num_clients} >= {num_groups} groups")
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for g in range(num_groups):
        members = list(range(g, num_clients, num_groups))
        for c in classes[g * l:(g + 1) * l]:
            for k, split in zip(members, np.array_split(rng.permutation(np.flatnonzero(labels == c)), len(members))):
                parts[k].append(split)
    return [np.sort(np.concatenate(p)) for p in parts]


def dirichlet(labels: np.ndarray, num_clients: int, beta: float, min_samples: int, rng: np.random.Generator,
              max_attempts: int = 1000) -> list[np.ndarray]:
    """NIID-Bench's Dir(beta) label skew: per class, proportions drawn from Dir(beta) over
    the clients (clients already above the mean size get none); redrawn until every client
    holds at least ``min_samples``."""
    if beta <= 0:
        raise ValueError(f"partition.dirichlet_beta={beta} must be > 0")
    N, classes = len(labels), np.unique(labels)
    if min_samples * num_clients > N:
        raise ValueError(f"partition.min_samples={min_samples} x {num_clients} clients exceeds the {N} samples")
    for _ in range(max_attempts):
        batches: list[list[int]] = [[] for _ in range(num_clients)]
        for c in classes:
            members = rng.permutation(np.flatnonzero(labels == c))
            p = rng.dirichlet(np.full(num_clients, beta))
            p = np.array([pi * (len(b) < N / num_clients) for pi, b in zip(p, batches)])
            p = p / p.sum()
            cuts = (np.cumsum(p) * len(members)).astype(int)[:-1]
            for b, split in zip(batches, np.split(members, cuts)):
                b.extend(split.tolist())
        if min(len(b) for b in batches) >= min_samples:
            return [np.sort(np.asarray(b, dtype=np.int64)) for b in batches]
    raise ValueError(f"dirichlet: no draw gave every client partition.min_samples={min_samples} samples in "
                     f"{max_attempts} attempts; lower min_samples or raise partition.dirichlet_beta={beta}")


def partition_clients(labels, cfg: PartitionConfig, seed: int) -> list[np.ndarray]:
    """The configured partition, plus the data-sharing subset when share_fraction > 0."""
    labels = np.asarray(labels)
    if cfg.num_clients < 1:
        raise ValueError(f"partition.num_clients={cfg.num_clients} must be >= 1")
    if cfg.num_clients > len(labels):
        raise ValueError(f"partition.num_clients={cfg.num_clients} exceeds the {len(labels)} training samples")
    rng = np.random.default_rng([seed, 0x9A27])  # the partition's own stream
    if cfg.scheme == "iid":
        clients = iid(labels, cfg.num_clients, rng)
    elif cfg.scheme == "non_iid_l":
        clients = non_iid_l(labels, cfg.num_clients, cfg.labels_per_client, rng)
    elif cfg.scheme == "num_labels":
        clients = num_labels(labels, cfg.num_clients, cfg.labels_per_client, rng)
    elif cfg.scheme == "label_groups":
        clients = label_groups(labels, cfg.num_clients, cfg.labels_per_client, rng)
    elif cfg.scheme == "dirichlet":
        clients = dirichlet(labels, cfg.num_clients, cfg.dirichlet_beta, cfg.min_samples, rng)
    else:  # pragma: no cover
        raise ValueError(f"partition.scheme={cfg.scheme!r} is unknown")
    if cfg.share_fraction < 0:
        raise ValueError(f"partition.share_fraction={cfg.share_fraction} must be >= 0")
    if cfg.share_fraction > 0:
        clients = add_shared_subset(clients, len(labels), cfg.share_fraction, rng)
    empty = [k for k, c in enumerate(clients) if len(c) == 0]
    if empty:
        raise ValueError(
            f"partition.scheme={cfg.scheme} leaves {len(empty)} of {cfg.num_clients} clients with no samples "
            f"(clients {empty[:10]}{' ...' if len(empty) > 10 else ''}); every client needs data: use fewer "
            f"partition.num_clients" + (", a larger partition.min_samples or dirichlet_beta" if cfg.scheme == "dirichlet" else "")
        )
    return [c.astype(np.int64) for c in clients]


def add_shared_subset(clients: list[np.ndarray], num_samples: int, fraction: float, rng: np.random.Generator):
    """Data sharing (Zhao et al. 2018, FedOVA Table II): one random global subset D_s with
    |D_s| = fraction * |D_k| (|D_k| the mean client size) is appended to every client."""
    mean_size = num_samples / len(clients)
    shared = rng.choice(num_samples, size=max(1, int(round(fraction * mean_size))), replace=False)
    return [np.concatenate([c, np.sort(shared)]) for c in clients]


def partition_table(labels, clients: list[np.ndarray], num_classes: int) -> np.ndarray:
    """Clients x classes sample counts."""
    labels = np.asarray(labels)
    return np.stack([np.bincount(labels[c], minlength=num_classes) for c in clients])
