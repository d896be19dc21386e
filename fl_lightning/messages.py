"""What travels between the server and a client: a ``ClientTask`` (what to train) and a
``ClientResult`` (what came back). Neither strategies nor client-side modules own them, so
both can import them without importing each other."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from torch import Tensor, nn

from fl_lightning.config import OptimizerConfig

State = dict[str, Tensor]


@dataclass
class ClientTask:
    """Everything a client needs for one local fit (sent to a worker as is)."""

    client_id: int
    kind: str  # "detectors" | "classifier" | "open_set" | "curvature" | "knowledge_transfer"
    params: State
    # "detectors": the classes of the stacked detectors in ``params``; "curvature": the same
    # for one-vs-all probes (empty: one multi-class model)
    classes: tuple[int, ...] = ()
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    stacking: str = "loop"
    prox_mu: float = 0.0  # "classifier": FedProx's proximal term
    # "classifier", SCAFFOLD: the server's control variate c, per parameter name (sent with
    # the model, so counted in bytes/down) ...
    control: Optional[State] = None
    # ... and the client's own c_i: client state that the simulation keeps on the server
    # between rounds (a real client keeps it), so it is not counted as communication.
    client_control: Optional[State] = None
    open_set: Any = None  # "open_set": its OpenSetLoss
    num_classes: int = 0  # "open_set": the index of "unknown"; "knowledge_transfer": n
    # "knowledge_transfer" (FedKT's party): its KnowledgeTransferConfig (s, t, student epochs)
    knowledge_transfer: Any = None
    fisher: bool = False  # "curvature": also return the diagonal Fisher (FIM-L-BFGS), not only the gradient
    # "classifier", FedDANE: the global gradient grad f(w_t) (sent, counted in bytes/down) and
    # the client's own grad F_k(w_t) from this round's gradient phase (it already has it: not
    # counted); the local loss gains <grad f(w_t) - grad F_k(w_t), w>.
    global_gradient: Optional[State] = None
    local_gradient: Optional[State] = None
    # True when the client still holds ``params`` from this round's gradient phase (FedDANE's
    # second phase): they are not sent, so not counted, again.
    params_cached: bool = False
    # "classifier": an architecture to train instead of the run's (ATHENA-FL's multi-class
    # probe while the run's architecture is a detector); its code ships with the client, so
    # only ``params`` count as sent.
    network: Optional[nn.Module] = None
    epochs: Optional[int] = None  # local epochs instead of federation.local_epochs
    # upload only these parameters (ATHENA-FL's probe: the last layer); None: all of them
    upload: Optional[tuple[str, ...]] = None

    def sent_bytes(self) -> int:
        """What the server sends for this task: the parameters (unless the client holds them
        already), SCAFFOLD's c and FedDANE's global gradient."""
        parts = [self.control or {}, self.global_gradient or {}] + ([] if self.params_cached else [self.params])
        return sum(t.numel() * t.element_size() for part in parts for t in part.values())


@dataclass
class ClientResult:
    client_id: int
    params: State
    num_samples: int
    classes: tuple[int, ...] = ()
    train_loss: float = float("nan")
    steps: int = 0
    #: what a client returns besides its model, counted in bytes/up (SCAFFOLD: delta c_i;
    #: a "curvature" probe returns its gradient as ``params`` and its diagonal Fisher here)
    extras: State = field(default_factory=dict)

    def sent_bytes(self) -> int:
        """What the client uploads: ``params`` and ``extras``."""
        return sum(t.numel() * t.element_size() for part in (self.params, self.extras) for t in part.values())
