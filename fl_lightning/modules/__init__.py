from fl_lightning.modules.classifier import MultiClassClassifier
from fl_lightning.modules.curvature import CurvatureProbe
from fl_lightning.modules.detectors import BinaryDetector
from fl_lightning.modules.learner import LocalLearner, build_optimizer
from fl_lightning.modules.open_set import OpenSetDetector, OpenSetLoss
from fl_lightning.modules.stacking import StackedModel, stack_models

__all__ = ["BinaryDetector", "CurvatureProbe", "LocalLearner", "MultiClassClassifier", "OpenSetDetector", "OpenSetLoss",
           "StackedModel", "build_optimizer", "stack_models"]
