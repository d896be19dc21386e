"""Aggregation after the clients return: the strategy's ``aggregate``, i.e. its paper's
averaging (FedAvg's weighted mean, FedOVA's Eq. 5 per detector group, FedNova's normalised
update, SCAFFOLD's control variate, ... in fl_lightning/aggregation.py and each algorithm's
package). Every strategy configures it (``Strategy.configure_callbacks``)."""

from __future__ import annotations

from fl_lightning.callbacks.base import FederatedCallback


class Aggregation(FederatedCallback):
    def on_clients_end(self, federation, round_index, results):
        federation.state, facts = federation.strategy.aggregate(federation.state, results)
        return facts
