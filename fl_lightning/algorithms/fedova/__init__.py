"""FedOVA (Zhu et al., IJCNN 2021), Algorithm 2.

- detectors.py: the client's one-vs-all binary detectors f_i (Eq. 2), trained together with
  summed independent losses; their client plug-in and cohort plug-in.
- strategy.py: the server: n detectors, each averaged over its group G_i (Eq. 5), prediction
  argmax_i f_i(x) (Eq. 3).
"""

from fl_lightning.algorithms.fedova.detectors import BinaryDetector, detector_task
from fl_lightning.algorithms.fedova.strategy import FedOVA

__all__ = ["BinaryDetector", "FedOVA", "detector_task"]
