"""Splitting a training set over K clients. Each partitioner returns one int64 index
array per client (views into the shared tensors) and uses only the generator it is given.

Two random streams draw the splits (``partition.rng``): fl_lightning's own numpy Generator,
and a replay of NIID-Bench's code (``niid_bench``, see ``niid_bench_partition``)."""

from __future__ import annotations

import random
from typing import Callable, Optional, Union

import numpy as np

from fl_lightning.config import PartitionConfig


Stream = Union[np.random.Generator, np.random.RandomState]  # RandomState: NIID-Bench's legacy calls


def iid(labels: np.ndarray, num_clients: int, rng: Stream) -> list[np.ndarray]:
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
    client drew (fewer clients than classes) is left out; NIID-Bench's code stops with an
    error there."""
    classes = np.unique(labels)
    held = _draw_label_sets(classes, num_clients, labels_per_client, lambda: classes[rng.integers(len(classes))])
    return _split_over_holders(labels, classes, held, rng.permutation, permute_unheld=False)


def _draw_label_sets(classes: np.ndarray, num_clients: int, k: int, draw_class: Callable[[], int]) -> list[list]:
    """#C=k's label sets: client i takes class i mod n, then draws classes (``draw_class``),
    keeping the ones it does not hold yet, until it holds k."""
    n = len(classes)
    if not 1 <= k <= n:
        raise ValueError(f"partition.labels_per_client={k} must lie in [1, {n}]")
    held = []
    for i in range(num_clients):
        current = [classes[i % n]]
        while len(current) < k:
            c = draw_class()
            if c not in current:
                current.append(c)
        held.append(current)
    return held


def _split_over_holders(labels: np.ndarray, classes: np.ndarray, held: list[list], permutation: Callable,
                        permute_unheld: bool) -> list[np.ndarray]:
    """Each class, shuffled by ``permutation``, cut into equal parts for its holders in client
    order. ``permute_unheld``: a class nobody holds is shuffled too, as NIID-Bench's loop does
    (the draw moves its stream)."""
    parts: list[list[np.ndarray]] = [[] for _ in held]
    for c in classes:
        holders = [i for i, current in enumerate(held) if c in current]
        if not holders and not permute_unheld:
            continue
        members = permutation(np.flatnonzero(labels == c))
        for i, split in zip(holders, np.array_split(members, max(len(holders), 1))):
            parts[i].append(split)
    return [np.sort(np.concatenate(p)) for p in parts]  # never empty: client i holds class i mod n


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


def dirichlet(labels: np.ndarray, num_clients: int, beta: float, min_samples: int, rng: Stream,
              max_attempts: int = 1000, classes: Optional[np.ndarray] = None) -> list[np.ndarray]:
    """NIID-Bench's Dir(beta) label skew: per class, proportions drawn from Dir(beta) over
    the clients (clients already above the mean size get none); redrawn until every client
    holds at least ``min_samples``. Given a legacy ``RandomState``, its calls are
    NIID-Bench's own, in its order (``permutation`` draws as its ``shuffle`` does).
    ``classes``: the label values to deal, in order (default: those present)."""
    if beta <= 0:
        raise ValueError(f"partition.dirichlet_beta={beta} must be > 0")
    N = len(labels)
    classes = np.unique(labels) if classes is None else classes
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
    if cfg.rng == "niid_bench":
        clients = niid_bench_partition(labels, cfg, seed)
    elif cfg.rng != "numpy":  # pragma: no cover (the config's Literal rejects it first)
        raise ValueError(f"partition.rng={cfg.rng!r} is unknown (numpy | niid_bench)")
    elif cfg.scheme == "iid":
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
    if cfg.share_fraction > 0:  # NIID-Bench has no data sharing: its subset comes from our stream either way
        clients = add_shared_subset(clients, len(labels), cfg.share_fraction, rng)
    empty = [k for k, c in enumerate(clients) if len(c) == 0]
    if empty:
        raise ValueError(
            f"partition.scheme={cfg.scheme} leaves {len(empty)} of {cfg.num_clients} clients with no samples "
            f"(clients {empty[:10]}{' ...' if len(empty) > 10 else ''}); every client needs data: use fewer "
            f"partition.num_clients" + (", a larger partition.min_samples or dirichlet_beta" if cfg.scheme == "dirichlet" else "")
        )
    return [c.astype(np.int64) for c in clients]


def niid_bench_partition(labels: np.ndarray, cfg: PartitionConfig, seed: int) -> list[np.ndarray]:
    """NIID-Bench's partitions drawn from NIID-Bench's random stream: ``seed`` gives the
    clients the classes and samples that its ``experiments.py --init_seed seed`` gives them.

    Its ``experiments.py`` calls ``np.random.seed(seed)`` and ``random.seed(seed)`` (and
    torch's, unused here) right before ``utils.py``'s ``partition_data``, which then draws:
    - ``homo`` (iid): ``np.random.permutation(N)``, cut into K equal parts;
    - ``noniid-#label{k}`` (num_labels): the label sets with Python's ``random.randint``
      (client i holds class i mod n, then draws until it holds k classes), then for every
      class 0..n-1 in turn, held or not, ``np.random.shuffle`` of its indices, cut into
      equal parts for its holders in client order. Its ``num == 10`` branch (every client
      holds all classes) gives the same split without the label draws;
    - ``noniid-labeldir`` (dirichlet): per attempt, per class in turn, ``np.random.shuffle``
      then ``np.random.dirichlet``, until every client has ``min_require_size`` = 10
      samples (``partition.min_samples``); its last per-client shuffles only reorder.
    FedOV's repository carries the same ``partition_data``. Classes are the label values
    0..max (its ``range(K)``); every client's indices come back sorted, as ours do.
    """
    stream = np.random.RandomState(seed)  # NIID-Bench's np.random.* calls, on a private RandomState
    if cfg.scheme == "iid":
        return iid(labels, cfg.num_clients, stream)
    classes = np.arange(labels.max() + 1)  # its range(K): a class with no sample still takes its draws
    if cfg.scheme == "dirichlet":
        return dirichlet(labels, cfg.num_clients, cfg.dirichlet_beta, cfg.min_samples, stream, classes=classes)
    if cfg.scheme == "num_labels":
        draws = random.Random(seed)  # NIID-Bench's random.randint calls
        held = _draw_label_sets(classes, cfg.num_clients, cfg.labels_per_client,
                                lambda: classes[draws.randint(0, len(classes) - 1)])
        return _split_over_holders(labels, classes, held, stream.permutation, permute_unheld=True)
    raise ValueError(f"partition.rng=niid_bench replays NIID-Bench's iid, num_labels and dirichlet partitions; "
                     f"partition.scheme={cfg.scheme} is not one of them (use partition.rng=numpy)")


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
