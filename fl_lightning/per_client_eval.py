"""Per-client and per-class evaluation (``federation.per_client_eval``, the summary's ``test_classes``), as pure functions.

ATHENA-FL reports "the mean accuracy over clients with a 95 % confidence interval": every
client measures the global model on test data drawn like its own. Here client k's test
distribution is the test samples of the classes it holds, weighted like its training data:

    acc_k = sum_c (n_kc / n_k) a_c,

where a_c is the global model's accuracy on the test samples of class c and n_kc the number
of client k's training samples of class c. This is the accuracy client k would measure on
a test set of its own label proportions, with every class's test samples standing in for
that class. Classes without test samples (a ``data.test_subset`` that misses them) are left
out and the client's weights renormalised over the rest; a client none of whose classes
has test samples, or with no training data, is left out.

Over the K evaluated clients: mean, sample standard deviation (ddof 1) and the 95 %
Student-t interval mean +- t_{0.975, K-1} s / sqrt(K) (the clients are the sample; with one
client there is no interval, NaN).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

LEVEL = 0.95
INTERVAL = "95 % Student-t interval over clients: mean ± t(0.975, K-1) · s / √K"


def class_accuracy(predictions: Sequence[int], labels: Sequence[int], num_classes: int) -> np.ndarray:
    """a_c: the fraction of class c's test samples predicted c; NaN for a class without any."""
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    total = np.bincount(labels, minlength=num_classes).astype(np.float64)
    correct = np.bincount(labels[predictions == labels], minlength=num_classes).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, correct / total, np.nan)


def class_report(round_index: int, confusion) -> dict:
    """The summary's ``test_classes``: the last test evaluation's confusion matrix (rows the
    true class, columns the predicted one) and a_c per class (None for a class without test
    samples). Under label skew the mean hides which classes a method gives up."""
    matrix = np.asarray(confusion, dtype=np.int64)
    total = matrix.sum(1)
    return {"round": int(round_index),
            "accuracy": [float(matrix[c, c] / total[c]) if total[c] else None for c in range(len(matrix))],
            "confusion": matrix.tolist(), "confusion_rows": "true class", "confusion_columns": "predicted class"}


def client_accuracies(per_class: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(acc_k for the evaluated clients, their ids): ``counts`` (K, C) holds n_kc."""
    counts = np.asarray(counts, dtype=np.float64)
    known = ~np.isnan(per_class)
    weights = counts * known  # classes without test samples drop out
    totals = weights.sum(1)
    ids = np.flatnonzero(totals > 0)
    acc = (weights[ids] * np.where(known, per_class, 0.0)).sum(1) / totals[ids]
    return acc, ids


def mean_interval(values: Sequence[float], level: float = LEVEL) -> dict[str, float]:
    """mean, std (ddof 1), half_width = t_{(1+level)/2, K-1} s / sqrt(K), low, high, clients."""
    from scipy.stats import t

    v = np.asarray(values, dtype=np.float64)
    k = len(v)
    if k == 0:
        return {"mean": float("nan"), "std": float("nan"), "half_width": float("nan"), "low": float("nan"),
                "high": float("nan"), "clients": 0}
    mean = float(v.mean())
    std = float(v.std(ddof=1)) if k > 1 else float("nan")
    half = float(t.ppf((1 + level) / 2, k - 1) * std / np.sqrt(k)) if k > 1 else float("nan")
    return {"mean": mean, "std": std, "half_width": half, "low": mean - half, "high": mean + half, "clients": k}


def per_client_metrics(predictions: Sequence[int], labels: Sequence[int], counts: np.ndarray) -> dict[str, float]:
    """The per-round metrics (without the split prefix): client_accuracy (the mean over
    clients), client_accuracy_ci95 (the interval's half width), client_accuracy_std,
    clients_evaluated."""
    counts = np.asarray(counts)
    acc, _ = client_accuracies(class_accuracy(predictions, labels, counts.shape[1]), counts)
    s = mean_interval(acc)
    return {"client_accuracy": s["mean"], "client_accuracy_ci95": s["half_width"], "client_accuracy_std": s["std"],
            "clients_evaluated": s["clients"]}


# the ATHENA-FL authors' interval (src/generate-figures/figure.py:88-89): numpy's std (ddof 0) over
# the clients' accuracies, times 1.96, over √10 whatever the number of clients
AUTHORS_Z, AUTHORS_SQRT_N = 1.96, 10 ** 0.5


def local_split_metrics(correct: Sequence[bool], owners: Sequence[int], num_clients: int) -> dict[str, float]:
    """``federation.local_split: athena_code``'s per-round metrics (without the split prefix):
    each client's accuracy on its own local test split (its correct predictions over its
    samples; ``owners`` gives each sample's client), the plain mean over the clients that have
    one (client_accuracy_local), the authors' interval half width 1.96 · std / √10
    (client_accuracy_local_ci95), the std (ddof 0) and clients_evaluated_local."""
    correct, owners = np.asarray(correct, dtype=np.float64), np.asarray(owners, dtype=np.int64)
    total = np.bincount(owners, minlength=num_clients)
    hits = np.bincount(owners, weights=correct, minlength=num_clients)
    acc = hits[total > 0] / total[total > 0]
    mean = float(acc.mean()) if len(acc) else float("nan")
    std = float(acc.std()) if len(acc) else float("nan")
    return {"client_accuracy_local": mean, "client_accuracy_local_ci95": AUTHORS_Z * std / AUTHORS_SQRT_N,
            "client_accuracy_local_std": std, "clients_evaluated_local": int(len(acc))}


def client_accuracy_summary(history: Sequence[dict], final_window: int) -> dict | None:
    """summary.json's ``client_accuracy``, from the per-round metrics: the last evaluation's
    mean over clients and its 95 % interval (``round``, ``mean``, ``half_width``, ``low``,
    ``high``, ``std``, ``clients``), and ``final``, the mean of the per-round means over the
    last ``final_window`` evaluations (as ``final_accuracy`` is for the global accuracy).
    None when no round was evaluated per client."""
    evaluated = [m for m in history if m.get("test/client_accuracy") is not None]
    if not evaluated:
        return None
    last = evaluated[-1]
    mean, half = float(last["test/client_accuracy"]), float(last["test/client_accuracy_ci95"])
    window = [float(m["test/client_accuracy"]) for m in evaluated][-final_window:]
    return {"interval": INTERVAL, "round": int(last["round"]), "mean": mean, "half_width": half,
            "low": mean - half, "high": mean + half, "std": float(last["test/client_accuracy_std"]),
            "clients": int(last["test/clients_evaluated"]), "final": float(np.mean(window)),
            "final_window": len(window)}
