"""FIM-based distributed L-BFGS (FedOVA's journal version), Algorithms 1 and 2.

- curvature.py: ClientUpdate (Algorithm 1, line 4): the local gradient and the diagonal
  empirical Fisher at w_t, one pass, no training.
- lbfgs.py: the two-loop recursion and the (s, y = F s) pair memory with its curvature check.
- strategy.py: the server step (Algorithm 1, lines 5-9), for one model or FedOVA's detectors.
- optimizer.py: the client-side reading: a torch.optim.Optimizer taking FIM-based L-BFGS steps.
"""

from fl_lightning.algorithms.fimlbfgs.curvature import CurvatureProbe, curvature_task
from fl_lightning.algorithms.fimlbfgs.strategy import FIMLBFGS, FedOVAFIMLBFGS

__all__ = ["CurvatureProbe", "FIMLBFGS", "FedOVAFIMLBFGS", "curvature_task"]
