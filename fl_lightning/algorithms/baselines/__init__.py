"""The baselines: FedAvg (McMahan et al.), FedProx, FedNova, SCAFFOLD (option II), FedDANE,
FedDF; classifier.py holds their client: cross-entropy with FedProx's proximal term, FedDANE's
linear term and SCAFFOLD's gradient correction, its client plug-in and cohort plug-in."""

from fl_lightning.algorithms.baselines.classifier import MultiClassClassifier, classifier_task
from fl_lightning.algorithms.baselines.fedavg import FedAvg
from fl_lightning.algorithms.baselines.feddane import FedDANE
from fl_lightning.algorithms.baselines.feddf import FedDF
from fl_lightning.algorithms.baselines.fednova import FedNova
from fl_lightning.algorithms.baselines.fedprox import FedProx
from fl_lightning.algorithms.baselines.scaffold import SCAFFOLD

__all__ = ["FedAvg", "FedDANE", "FedDF", "FedNova", "FedProx", "MultiClassClassifier", "SCAFFOLD", "classifier_task"]
