"""Server-side callbacks of the federated loop: logging, checkpoints, statistics."""

from callbacks.base import FederatedCallback
from callbacks.checkpointing import Checkpointing
from callbacks.logging import ConsoleProgress, MetricsLogger
from callbacks.partition_stats import PartitionStatistics

__all__ = ["Checkpointing", "ConsoleProgress", "FederatedCallback", "MetricsLogger", "PartitionStatistics"]
