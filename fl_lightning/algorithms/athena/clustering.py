"""ATHENA-FL's Step 3: clients clustered by DBSCAN on the vectors they upload (the last
layer of the probe they trained), with scikit-learn doing the clustering.

Choices the paper leaves open, all settings of ``DBSCANClustering``:
- eps: a number, or "auto" — the largest multiplicative gap in the sorted pairwise distances,
  which separates distances within groups of similar clients from those between groups (the
  paper's d = 0.0279 belongs to its Keras weights and does not transfer). ``auto_eps`` also
  returns the k-distance curve for inspection (Ester et al.'s heuristic).
- scaling: "l2" (each client's vector to unit norm, the default: clients with more data move
  their weights further, which should not split a group), "standard" (z-score per feature)
  or "none".
- noise points (clients DBSCAN assigns to no cluster): "singleton" (each becomes its own
  cluster and trains its detectors alone, the default: no client is left without detectors
  and no cluster is polluted), or "nearest" (joins the cluster of the nearest clustered client).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Union

import numpy as np


@dataclass
class DBSCANClustering:
    """Attributes:
    eps: DBSCAN's neighbourhood radius, or "auto" (largest gap of the pairwise distances).
    min_samples: DBSCAN's min_samples (the paper: 2 clients per group at least).
    metric: any metric scikit-learn's DBSCAN accepts (euclidean, cosine, ...).
    scaling: l2 | standard | none, applied to the vectors before clustering.
    noise: singleton | nearest (see the module docstring).
    """

    eps: Union[float, Literal["auto"]] = "auto"
    min_samples: int = 2
    metric: str = "euclidean"
    scaling: Literal["l2", "standard", "none"] = "l2"
    noise: Literal["singleton", "nearest"] = "singleton"

    def __post_init__(self) -> None:
        if self.eps != "auto" and not float(self.eps) > 0:
            raise ValueError(f"clustering.eps={self.eps} must be > 0 or 'auto'")
        if self.min_samples < 1:
            raise ValueError(f"clustering.min_samples={self.min_samples} must be >= 1")

    def scale(self, vectors: np.ndarray) -> np.ndarray:
        v = np.asarray(vectors, dtype=np.float64)
        if self.scaling == "l2":
            return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
        if self.scaling == "standard":
            return (v - v.mean(0)) / np.maximum(v.std(0), 1e-12)
        return v

    def fit(self, vectors: np.ndarray) -> tuple[np.ndarray, dict]:
        """Cluster ids 0..G-1 per client, and facts to log (eps used, noise count)."""
        from threadpoolctl import threadpool_limits

        # scikit-learn's distance computations call BLAS inside their own OpenMP loops: a
        # multi-threaded OpenBLAS there warned "Detect OpenMP Loop" once per client (the BLAS
        # calls are on G x d vectors: one thread is all they need)
        with threadpool_limits(1, user_api="blas"):
            return self._fit(vectors)

    def _fit(self, vectors: np.ndarray) -> tuple[np.ndarray, dict]:
        from sklearn.cluster import DBSCAN

        v = self.scale(vectors)
        eps = auto_eps(v, self.metric) if self.eps == "auto" else float(self.eps)
        labels = DBSCAN(eps=eps, min_samples=self.min_samples, metric=self.metric).fit_predict(v)
        noise = labels < 0
        if noise.any():
            if self.noise == "nearest" and (~noise).any():
                from sklearn.metrics import pairwise_distances

                d = pairwise_distances(v[noise], v[~noise], metric=self.metric)
                labels[noise] = labels[~noise][d.argmin(1)]
            else:
                labels[noise] = labels.max() + 1 + np.arange(noise.sum())
        return relabel(labels), {"eps": eps, "noise_clients": int(noise.sum())}

    def assign(self, known: np.ndarray, known_labels: np.ndarray, vector: np.ndarray) -> int:
        """A new client (Section 4.2's last sentence): the cluster of its nearest known client
        when it lies within eps of it, else a new cluster of its own."""
        from sklearn.metrics import pairwise_distances

        v = self.scale(np.vstack([known, vector[None]]))
        d = pairwise_distances(v[-1:], v[:-1], metric=self.metric)[0]
        eps = auto_eps(v[:-1], self.metric) if self.eps == "auto" else float(self.eps)
        nearest = int(d.argmin())
        return int(known_labels[nearest]) if d[nearest] <= eps else int(known_labels.max()) + 1


def relabel(labels: np.ndarray) -> np.ndarray:
    """Cluster ids renumbered 0..G-1 in order of first appearance (deterministic)."""
    mapping: dict[int, int] = {}
    return np.array([mapping.setdefault(int(c), len(mapping)) for c in labels], dtype=np.int64)


def auto_eps(vectors: np.ndarray, metric: str = "euclidean", min_gap_ratio: float = 1.5) -> float:
    """The geometric midpoint of the largest ratio between consecutive sorted pairwise
    distances (zero distances skipped): below it, distances within groups; above, between.
    When no ratio reaches ``min_gap_ratio`` the clients show no group structure (IID data)
    and eps covers every distance: one cluster."""
    from sklearn.metrics import pairwise_distances

    d = pairwise_distances(vectors, metric=metric)
    values = np.unique(d[np.triu_indices(len(d), k=1)])
    values = values[values > 1e-12]
    if len(values) < 2:
        return float(values[0]) * 1.5 if len(values) else 1.0
    ratios = values[1:] / values[:-1]
    i = int(ratios.argmax())
    if ratios[i] < min_gap_ratio:
        return float(values[-1]) * 1.01
    return float(np.sqrt(values[i] * values[i + 1]))


def k_distances(vectors: np.ndarray, k: int, metric: str = "euclidean") -> np.ndarray:
    """Each point's distance to its k-th nearest other point, sorted (Ester et al.'s plot)."""
    from sklearn.metrics import pairwise_distances

    d = np.sort(pairwise_distances(vectors, metric=metric), axis=1)
    return np.sort(d[:, min(k, len(d) - 1)])


def label_set_ids(label_sets: list[tuple[int, ...]]) -> np.ndarray:
    """Ground-truth cluster ids in simulation: clients with the same set of labels."""
    return relabel(np.array([hash(tuple(sorted(s))) for s in label_sets]))
