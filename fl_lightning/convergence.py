"""ATHENA-FL's convergence criterion and communication accounting (Section 5.3).

A model has converged at the first evaluation whose accuracy lies within ``tol`` (relative;
the paper's 0.001 %) of the previous evaluation's. Bytes to convergence follow Eqs. 5-6:
B_ova = T_dec x R x E[e_dec] per client for R detectors, B_cmc = T_cmc x E[e_cmc] for one
multi-class model; the measured totals (every byte the loop counted up to that round, all
clients) are reported beside the formula."""

from __future__ import annotations

from typing import Any, Optional, Sequence

DEFAULT_TOL = 1e-5  # 0.001 %


def has_converged(previous: Optional[float], current: float, tol: float = DEFAULT_TOL) -> bool:
    """|a_t - a_{t-1}| <= tol * a_{t-1} (never at the first evaluation)."""
    return previous is not None and abs(current - previous) <= tol * abs(previous)


def convergence_index(curve: Sequence[float], tol: float = DEFAULT_TOL) -> Optional[int]:
    """0-based position of the first converged evaluation of ``curve``; None if none is."""
    for i in range(1, len(curve)):
        if has_converged(curve[i - 1], curve[i], tol):
            return i
    return None


def multiclass_communication(model_bytes: int, history: list[dict[str, Any]], tol: float = DEFAULT_TOL) -> dict[str, Any]:
    """Eq. 6 for a multi-class model, on its validation accuracy when clients hold a
    validation split (partition.validation_fraction > 0), else on the test accuracy."""
    key = "val/accuracy" if any("val/accuracy" in m for m in history) else "test/accuracy"
    evaluated = [m for m in history if key in m]
    index = convergence_index([m[key] for m in evaluated], tol)
    converged = index is not None
    last = evaluated[index] if converged else (evaluated[-1] if evaluated else None)
    rounds = last["round"] if last else 0
    return {
        "criterion": f"{key} within {tol:.0e} (relative) of the previous evaluation",
        "model_bytes": int(model_bytes),
        "converged": converged,
        "rounds_to_convergence": rounds,
        "accuracy_at_convergence": last.get("test/accuracy") if last else None,
        "bytes_per_client_eq": int(model_bytes * rounds),
        "bytes_measured_to_convergence": int(sum(m["bytes/down"] + m["bytes/up"] for m in history
                                                 if m["round"] <= rounds)),
    }
