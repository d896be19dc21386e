"""fl_lightning: federated learning on label-skewed data with one-vs-all and open-set detectors."""

__version__ = "0.1.0"
