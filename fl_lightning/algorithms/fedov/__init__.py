"""FedOV (Diao et al., ICLR 2023): one-shot open-set voting.

- open_set.py: the client's (n + 1)-way loss (Algorithm 1: PROSER's dummy and mixup terms,
  data-destruction and FGSM-enhanced outliers as "unknown") and its client plug-in.
- open_set_cohort.py: the same loss for one member of the cohort engine, with each client's
  random outliers and mixup pairs drawn as its own fit draws them.
- destruction.py: the six data-destruction operations (Section 3.4), batched.
- voting.py: open-set voting (Eq. 4), top-k, close-set voting, Distilled FedOV.
- distillation.py: distilling an ensemble on public data (Distilled FedOV, FedDF, FedKT).
The FGSM and destruction steps run in a client fit through callbacks/outliers.py.
"""

from fl_lightning.algorithms.fedov import open_set_cohort  # noqa: F401 - gives the open-set client its cohort plug-in
from fl_lightning.algorithms.fedov.open_set import OpenSetDetector, OpenSetLoss, open_set_task
from fl_lightning.algorithms.fedov.voting import CloseSetVoting, FedOV

__all__ = ["CloseSetVoting", "FedOV", "OpenSetDetector", "OpenSetLoss", "open_set_task"]
