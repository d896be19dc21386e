"""FedKT (Li, He and Song, IJCAI 2021), FedOV's one-shot baseline.

- knowledge_transfer.py: a party's s x t teachers and s students (its client plug-in), the
  consistent vote.
- cohort.py: a group of parties under the cohort engine: all their teachers in one cohort, then
  all their students.
- strategy.py: the server's vote on the public data, the final model, later FedProx rounds.
"""

from fl_lightning.algorithms.fedkt.knowledge_transfer import KnowledgeTransferConfig, party_task
from fl_lightning.algorithms.fedkt.strategy import FedKT

__all__ = ["FedKT", "KnowledgeTransferConfig", "party_task"]
