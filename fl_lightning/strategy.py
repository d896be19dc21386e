"""A strategy says what the federated loop trains and how the server combines it.

Flower's shape (configure / aggregate / evaluate), with the client side expressed as
a picklable ``ClientTask`` that builds a LightningModule, so tasks can be sent to
worker processes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from fl_lightning.config import OptimizerConfig
from fl_lightning.messages import ClientResult, ClientTask, State  # noqa: F401  (re-exported)


def sample_clients(generator: torch.Generator, num_clients: int, fraction: float) -> list[int]:
    """max(1, round(C*K)) distinct clients of ``num_clients``, from the sampler's own generator."""
    if not 0 < fraction <= 1:
        raise ValueError(f"federation.client_fraction={fraction} must lie in (0, 1]")
    m = max(1, int(round(fraction * num_clients)))
    return sorted(torch.randperm(num_clients, generator=generator)[:m].tolist())


def model_logits(template: nn.Module, params: State, x: Tensor) -> Tensor:
    """``template``'s forward with ``params`` (one model's state dict), NHWC like the clients, in
    evaluation mode: batch norm normalises with the model's running statistics (in training mode it
    would use the batch's and update ``params``' statistics in place) and dropout keeps every unit."""
    from torch.func import functional_call

    template = template.to(device=x.device, memory_format=torch.channels_last)
    training = template.training
    template.eval()
    try:
        return functional_call(template, {k: v.to(x.device) for k, v in params.items()}, (x,))
    finally:
        template.train(training)


@dataclass
class ServerContext:
    """What a strategy may use on the server besides the global state.

    ``make_model(num_outputs)`` builds the run's architecture with another output size (a
    distillation student); ``public_x`` is unlabelled public data for strategies that
    declare ``uses_public_data`` (the first half of the test set, as in FedDF and FedOV)."""

    num_clients: int = 1
    make_model: Optional[Callable[..., nn.Module]] = None
    public_x: Optional[Tensor] = None
    accelerator: str = "cpu"
    seed: int = 0
    #: the pooled local validation splits (x, y) of the given clients: in a deployment each
    #: client evaluates on its own split and reports correct/total, which sums to the same
    #: accuracy (partition.validation_fraction > 0; otherwise None)
    client_validation: Optional[Callable[[Sequence[int]], tuple[Tensor, Tensor]]] = None
    run_dir: str = "."
    input_shape: tuple[int, ...] = ()  # one sample's (C, H, W)
    #: the data's per-channel standardisation of [0, 1] pixels (FederatedDataset.pixel_mean/std)
    pixel_mean: tuple[float, ...] = ()
    pixel_std: tuple[float, ...] = ()


class Strategy(ABC):
    """Server-side logic of one algorithm, plugged into the single federated loop."""

    #: a short name for logs and summaries
    name: str = "strategy"
    #: evaluate on the second half of the test set, the first half being public data
    uses_public_data: bool = False

    #: the client optimizers (optimizer.name) its clients can train with
    client_optimizers: tuple[str, ...] = ("sgd", "adam")

    def setup(self, template: nn.Module, num_classes: int, optimizer: OptimizerConfig, stacking: str,
              context: Optional[ServerContext] = None) -> None:
        if optimizer.name not in self.client_optimizers:
            raise ValueError(f"optimizer.name={optimizer.name} is not available for {type(self).__name__} "
                             f"(choose {' or '.join(self.client_optimizers)})")
        self.template, self.num_classes, self.optimizer, self.stacking = template, num_classes, optimizer, stacking
        self.context = context or ServerContext()

    def configure_callbacks(self) -> list:
        """The server-side steps this algorithm runs after its clients return, as federated
        callbacks (as a LightningModule's ``configure_callbacks``): by default the aggregation
        (callbacks/aggregation.py, which calls ``aggregate``)."""
        from fl_lightning.callbacks.aggregation import Aggregation

        return [Aggregation()]

    def num_outputs(self, num_classes: int) -> int:
        """Output size of the architecture the clients train."""
        return num_classes

    @abstractmethod
    def initial_state(self, generator: torch.Generator) -> State:
        """The global parameters before round 1."""

    def fresh_models(self, generator: torch.Generator, count: int) -> list[nn.Module]:
        """``count`` independently initialised copies of the architecture, drawn from the
        run's initialisation generator only (the global torch RNG is left as it was)."""
        from fl_lightning.models import reinitialised

        with torch.random.fork_rng():
            torch.manual_seed(int(torch.randint(2**31 - 1, (1,), generator=generator)))
            return [reinitialised(self.template) for _ in range(count)]

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

    def select_clients(self, state: State, generator: torch.Generator, num_clients: int, fraction: float) -> list[int]:
        """K_t, the clients of this round: max(1, round(C*K)) distinct clients drawn from
        ``generator`` (the run's sampler, checkpointed with the state)."""
        return sample_clients(generator, num_clients, fraction)

    def is_finished(self, state: State) -> bool:
        """True ends the run before federation.rounds (ATHENA-FL: every detector converged)."""
        return False

    def communication_report(self, state: State, history: list[dict[str, Any]]) -> dict[str, Any]:
        """Rounds to convergence and the bytes they cost (ATHENA-FL Eq. 6 for one multi-class
        model: B = T x E[e]); fl_lightning.convergence has the criterion."""
        from fl_lightning.convergence import multiclass_communication

        return multiclass_communication(self.state_num_bytes(state), history)

    def state_num_bytes(self, state: State) -> int:
        return sum(t.numel() * t.element_size() for t in state.values())
