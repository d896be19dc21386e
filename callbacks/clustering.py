"""ATHENA-FL's Step 3 after its probe round: the clients' uploaded last layers clustered by
DBSCAN (fl_lightning/algorithms/athena/clustering.py) and one detector per (cluster, class)
created (``AthenaFL.cluster``). Configured by ``AthenaFL.configure_callbacks``."""

from __future__ import annotations

from fl_lightning.callbacks.base import FederatedCallback


class ClientClustering(FederatedCallback):
    def on_clients_end(self, federation, round_index, results):
        strategy = federation.strategy
        if strategy.clustered(federation.state):
            return {}
        federation.state, facts = strategy.cluster(federation.state, results)
        return facts
