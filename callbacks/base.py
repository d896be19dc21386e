from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from fl_lightning.federation import Federation


class FederatedCallback:
    """Hooks of the federated loop (round granularity; Lightning callbacks run inside
    each client's Trainer)."""

    def on_fit_start(self, federation: "Federation") -> None: ...

    def on_clients_start(self, federation: "Federation", round_index: int, total: int) -> None:
        """Before the round's ``total`` clients train."""

    def on_client_epoch(self, federation: "Federation", round_index: int, client_id: int, epoch: int,
                        epochs: int) -> None:
        """After each local epoch of a client's fit (whichever process trains it; not from the
        cohort engine, which reports whole clients through ``on_client_end``)."""

    def on_client_end(self, federation: "Federation", round_index: int, result: Any, done: int, total: int) -> None:
        """After each client's local fit of the round (``done`` of ``total``)."""

    def on_clients_end(self, federation: "Federation", round_index: int, results: list) -> Optional[dict[str, Any]]:
        """After the round's clients returned: a server step on their results (aggregation,
        clustering) that may update ``federation.state``; returns facts to log."""

    def on_round_end(self, federation: "Federation", round_index: int, metrics: dict[str, Any]) -> None: ...

    def on_fit_end(self, federation: "Federation", summary: dict[str, Any]) -> None: ...

    def on_interrupt(self, federation: "Federation", stop: Any) -> None:
        """The run is stopping on a signal (``stop``: fl_lightning.interrupts.RunInterrupted):
        keep what a resume needs; ``stop.kept`` lists what was kept."""
