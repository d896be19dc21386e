"""What travels between the server and a client: a ``ClientTask`` (what to train) and a
``ClientResult`` (what came back). Neither strategies nor client-side modules own them, so
both can import them without importing each other."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from torch import Tensor

from fl_lightning.config import OptimizerConfig

State = dict[str, Tensor]


def prefixed(tensors: State, prefix: str) -> State:
    """The entries of ``tensors`` under ``prefix``, without it (payload and client state keep
    several named groups in one mapping: ``control.conv1.weight`` ...)."""
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}


def with_prefix(tensors: State, prefix: str) -> State:
    return {prefix + k: v for k, v in tensors.items()}


def num_bytes(*parts: State) -> int:
    """What tensors cost on the wire (their storage size)."""
    return sum(t.numel() * t.element_size() for part in parts for t in part.values())


@dataclass
class ClientTask:
    """What the server sends one client for one local fit: tensors and JSON settings, nothing
    else, so an in-process call, a worker process and a Flower SuperNode carry it alike. The
    meaning of ``payload`` and ``settings`` belongs to the client plug-in registered for
    ``kind`` (fl_lightning.plugins), defined beside the module it trains."""

    client_id: int
    kind: str
    params: State
    #: other tensors sent (SCAFFOLD's c, FedDANE's global gradient), counted as communication
    payload: State = field(default_factory=dict)
    #: JSON-serialisable settings: optimizer, classes, epochs, loss weights, ...
    settings: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # JSON-native from the start (tuples become lists), so a task reads the same in any
        # process; a setting that JSON cannot carry is refused here, naming the task's kind
        try:
            self.settings = json.loads(json.dumps(self.settings))
        except TypeError as error:
            raise TypeError(f"client task {self.kind!r}: settings must be JSON-serialisable ({error})") from None

    # Settings every kind may carry, read through these names.
    @property
    def optimizer(self) -> OptimizerConfig:
        return OptimizerConfig(**self.settings.get("optimizer", {}))

    @property
    def classes(self) -> tuple[int, ...]:
        return tuple(self.settings.get("classes", ()))

    @property
    def epochs(self) -> Optional[int]:
        """Local epochs instead of federation.local_epochs (None: the run's)."""
        return self.settings.get("epochs")

    @property
    def upload(self) -> Optional[tuple[str, ...]]:
        """Upload only these parameters (None: all of them)."""
        names = self.settings.get("upload")
        return tuple(names) if names is not None else None

    def sent_bytes(self) -> int:
        """What the server sends: ``params`` (unless the client holds them already, setting
        ``params_held``) and ``payload``."""
        return num_bytes(self.payload, *([] if self.settings.get("params_held") else [self.params]))


def task_settings(optimizer: OptimizerConfig, **settings: Any) -> dict[str, Any]:
    """Settings with the optimizer as JSON (None values left out)."""
    return {"optimizer": asdict(optimizer), **{k: v for k, v in settings.items() if v is not None}}


@dataclass
class ClientResult:
    """What a client returns: its parameters and payload (counted as communication), the
    sample count, classes, loss and steps every aggregation may use, and ``client_state``:
    what the client keeps for its later rounds (SCAFFOLD's c_i), never sent."""

    client_id: int
    params: State
    num_samples: int
    classes: tuple[int, ...] = ()
    train_loss: float = float("nan")
    steps: int = 0
    #: other tensors sent back (SCAFFOLD's delta c_i; a curvature probe's diagonal Fisher)
    payload: State = field(default_factory=dict)
    client_state: State = field(default_factory=dict)

    def sent_bytes(self) -> int:
        """What the client uploads: ``params`` and ``payload``."""
        return num_bytes(self.params, self.payload)
