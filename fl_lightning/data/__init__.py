from fl_lightning.data.batches import ClientBatches
from fl_lightning.data.datasets import (DataFormatError, DataNotFoundError, FederatedDataset, load_dataset,
                                       synthetic_dataset)
from fl_lightning.data.partition import partition_clients, partition_table

__all__ = [
    "ClientBatches",
    "DataFormatError",
    "DataNotFoundError",
    "FederatedDataset",
    "load_dataset",
    "partition_clients",
    "partition_table",
    "synthetic_dataset",
]
