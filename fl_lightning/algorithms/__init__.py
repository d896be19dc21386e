"""One package per paper; each one's ``__init__`` says which paper and which equations it
implements, and registers its client plug-ins on import.

- fedova/    FedOVA (IJCNN 2021): one-vs-all detectors, grouped averaging (Eqs. 2-5)
- fimlbfgs/  FIM-based distributed L-BFGS (FedOVA's journal version, Algorithms 1-2)
- athena/    ATHENA-FL: probe clustering (DBSCAN), per-cluster detectors, detector database
- fedov/     FedOV (ICLR 2023): open-set voting, PROSER, data destruction, FGSM enhancement
- fedkt/     FedKT (IJCAI 2021): two-tier knowledge transfer, FedOV's one-shot baseline
- baselines/ FedAvg, FedProx, FedNova, SCAFFOLD, FedDANE, FedDF (close-set voting is in fedov/)
"""

from fl_lightning.algorithms.athena import AthenaFL
from fl_lightning.algorithms.baselines import SCAFFOLD, FedAvg, FedDANE, FedDF, FedNova, FedProx
from fl_lightning.algorithms.fedkt import FedKT
from fl_lightning.algorithms.fedov import CloseSetVoting, FedOV
from fl_lightning.algorithms.fedova import FedOVA
from fl_lightning.algorithms.fimlbfgs import FIMLBFGS, FedOVAFIMLBFGS

__all__ = ["AthenaFL", "CloseSetVoting", "FIMLBFGS", "FedAvg", "FedDANE", "FedDF", "FedKT", "FedNova", "FedOV", "FedOVA",
           "FedOVAFIMLBFGS", "FedProx", "SCAFFOLD"]
