from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from fl_lightning.callbacks.base import FederatedCallback


class PartitionStatistics(FederatedCallback):
    """Logs the clients x classes count table at start (a digest on the console, the whole
    table as ``partition.csv`` in the run directory)."""

    def __init__(self, stream=None, rows: int = 5) -> None:
        self.stream, self.rows = stream or sys.stderr, rows

    def on_fit_start(self, federation) -> None:
        table = federation.partition_counts
        path = Path(federation.run_dir) / "partition.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        header = "client," + ",".join(f"class_{c}" for c in range(table.shape[1]))
        np.savetxt(path, np.column_stack([np.arange(len(table)), table]), fmt="%d", delimiter=",",
                   header=header, comments="")
        labels_held = (table > 0).sum(1)
        sizes = table.sum(1)
        lines = [
            f"partition {federation.partition.scheme}: {len(table)} clients, samples/client "
            f"min {sizes.min()} mean {sizes.mean():.1f} max {sizes.max()}, labels/client "
            f"min {labels_held.min()} max {labels_held.max()}, distinct label sets "
            f"{len({tuple(np.flatnonzero(r)) for r in table})} (table: {path})",
            "client " + " ".join(f"{c:>5}" for c in range(table.shape[1])),
        ]
        lines += [f"{k:>6} " + " ".join(f"{v:>5}" for v in table[k]) for k in range(min(self.rows, len(table)))]
        print("\n".join(lines), file=self.stream, flush=True)
