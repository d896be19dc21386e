"""FIM-based distributed L-BFGS (FedOVA's journal version), Algorithms 1 and 2.

- curvature.py: ClientUpdate (Algorithm 1, line 4): the local gradient and the diagonal
  empirical Fisher at w_t, one pass, no training; curvature_cohort.py: the same, vectorised
  across clients in the cohort engine.
- lbfgs.py: the two-loop recursion and the (s, y = F s) pair memory with its curvature check.
- strategy.py: the server step (Algorithm 1, lines 5-9), for one model or FedOVA's detectors.
- per_sample.py: per-sample gradients of a data loss: the batch's diagonal Fisher, the probe's sums.
- optimizer.py: the client-side reading: a torch.optim.Optimizer taking FIM-based L-BFGS steps.
- stacked.py: the same steps for the cohort engine's members (``optimizer.name: fim_lbfgs``).
"""

from fl_lightning.algorithms.fimlbfgs import curvature_cohort, stacked  # noqa: F401 (the cohort engine's parts)
from fl_lightning.algorithms.fimlbfgs.curvature import CurvatureProbe, curvature_task
from fl_lightning.algorithms.fimlbfgs.strategy import FIMLBFGS, FedOVAFIMLBFGS

__all__ = ["CurvatureProbe", "FIMLBFGS", "FedOVAFIMLBFGS", "curvature_task"]
