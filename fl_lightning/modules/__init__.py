"""What every client-side LightningModule shares: the local optimizer (learner.py) and G
stacked copies of one architecture (stacking.py). The modules of each algorithm live in its
package under fl_lightning/algorithms/."""

from fl_lightning.modules.learner import LocalLearner, build_optimizer
from fl_lightning.modules.stacking import StackedModel, stack_models

__all__ = ["LocalLearner", "StackedModel", "build_optimizer", "stack_models"]
