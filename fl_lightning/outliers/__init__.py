"""Outlier generation for open-set training (FedOV)."""

from fl_lightning.outliers.destruction import DESTRUCTION_OPS, destroy

__all__ = ["DESTRUCTION_OPS", "destroy"]
