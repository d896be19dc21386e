"""Server-side callbacks of the federated loop: logging, checkpoints, statistics."""

from fl_lightning.callbacks.base import FederatedCallback
from fl_lightning.callbacks.checkpointing import Checkpointing
from fl_lightning.callbacks.logging import ConsoleProgress, MetricsLogger
from fl_lightning.callbacks.partition_stats import PartitionStatistics

__all__ = ["Checkpointing", "ConsoleProgress", "FederatedCallback", "MetricsLogger", "PartitionStatistics"]
