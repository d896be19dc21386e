"""A strategy says what the federated loop trains and how the server combines it.

Flower's shape (configure / aggregate / evaluate), with the client side expressed as
a picklable ``ClientTask`` that builds a LightningModule, so tasks can be sent to
worker processes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np
import torch
from torch import Tensor, nn

from fl_lightning.config import OptimizerConfig

State = dict[str, Tensor]


@dataclass
class ClientTask:
    """Everything a client needs for one local fit (sent to a worker as is)."""

    client_id: int
    kind: str  # "detectors" | "classifier" | "open_set" | "curvature"
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
    num_classes: int = 0  # "open_set": the index of "unknown"
    fisher: bool = False  # "curvature": also return the diagonal Fisher (FIM-L-BFGS), not only the gradient
    # "classifier", FedDANE: the global gradient grad f(w_t) (sent, counted in bytes/down) and
    # the client's own grad F_k(w_t) from this round's gradient phase (it already has it: not
    # counted); the local loss gains <grad f(w_t) - grad F_k(w_t), w>.
    global_gradient: Optional[State] = None
    local_gradient: Optional[State] = None
    # True when the client still holds ``params`` from this round's gradient phase (FedDANE's
    # second phase): they are not sent, so not counted, again.
    params_cached: bool = False

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


@dataclass
class ServerContext:
    """What a strategy may use on the server besides the global state.

    ``make_model(num_outputs)`` builds the run's architecture with another output size (a
    distillation student); ``public_x`` is unlabelled public data for strategies that
    declare ``uses_public_data`` (the first half of the test set, as in FedDF and FedOV)."""

    num_clients: int = 1
    make_model: Optional[Callable[[int], nn.Module]] = None
    public_x: Optional[Tensor] = None
    accelerator: str = "cpu"
    seed: int = 0


class Strategy(ABC):
    """Server-side logic of one algorithm, plugged into the single federated loop."""

    #: a short name for logs and summaries
    name: str = "strategy"
    #: evaluate on the second half of the test set, the first half being public data
    uses_public_data: bool = False

    def setup(self, template: nn.Module, num_classes: int, optimizer: OptimizerConfig, stacking: str,
              context: Optional[ServerContext] = None) -> None:
        self.template, self.num_classes, self.optimizer, self.stacking = template, num_classes, optimizer, stacking
        self.context = context or ServerContext()

    def num_outputs(self, num_classes: int) -> int:
        """Output size of the architecture the clients train."""
        return num_classes

    @abstractmethod
    def initial_state(self, generator: torch.Generator) -> State:
        """The global parameters before round 1."""

    def fresh_models(self, generator: torch.Generator, count: int) -> list[nn.Module]:
        """``count`` independently initialised copies of the architecture, drawn from the
        run's initialisation generator only (the global torch RNG is left as it was)."""
        import copy

        with torch.random.fork_rng():
            torch.manual_seed(int(torch.randint(2**31 - 1, (1,), generator=generator)))
            models = [copy.deepcopy(self.template) for _ in range(count)]
            for model in models:
                for module in model.modules():
                    if hasattr(module, "reset_parameters"):
                        module.reset_parameters()
        return models

    @abstractmethod
    def configure_client(self, state: State, client_id: int, labels: np.ndarray) -> Optional[ClientTask]:
        """What this client trains this round (None: nothing to train)."""

    @abstractmethod
    def aggregate(self, state: State, results: list[ClientResult]) -> tuple[State, dict[str, Any]]:
        """New global state and aggregation facts to log."""

    @abstractmethod
    def predict_logits(self, state: State, x: Tensor) -> Tensor:
        """Scores (batch, n_classes) of the global model; argmax is the prediction."""

    def extra_metrics(self, state: State, x: Tensor, y: Tensor, scores: Tensor) -> dict[str, float]:
        return {}

    def gradient_phase(self, state: State, client_ids: list[int]) -> Optional[list[ClientTask]]:
        """Optional first client phase of a round, before ``configure_client``: tasks for the
        sampled clients (those holding data), run like any other tasks, whose results go to
        ``receive_gradients``. None (the default): the round has one client phase.
        FedDANE gathers the global gradient grad f(w_t) this way."""
        return None

    def receive_gradients(self, results: list[ClientResult]) -> None:
        """The results of ``gradient_phase``'s tasks, before this round's ``configure_client``."""

    def state_num_bytes(self, state: State) -> int:
        return sum(t.numel() * t.element_size() for t in state.values())
