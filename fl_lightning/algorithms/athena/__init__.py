"""ATHENA-FL: clients clustered by DBSCAN on a probe's last layer, per-cluster one-vs-all
detectors, a detector database, composition from any cluster.

- strategy.py: the probe round (Steps 1-2), clustering (Step 3), per-cluster detector rounds
  (Eq. 4 averaging) and the Section 5.3 convergence estimate.
- clustering.py: scaling, DBSCAN with automatic eps, noise handling, ARI.
- detector_db.py, composition.py, compose_cli.py: the database, composing a classifier from
  stored detectors, and its command line.
"""

from fl_lightning.algorithms.athena.strategy import AthenaFL

__all__ = ["AthenaFL"]
