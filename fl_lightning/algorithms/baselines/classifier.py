"""The multi-class classifier trained by FedAvg and its variants."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fl_lightning.aggregation import scaffold_client_delta
from fl_lightning.cohort.batch_norm import has_batch_norm, normalisable
from fl_lightning.cohort.dropout import drawn_dropout
from fl_lightning.cohort.members import CohortPlugin, Member
from fl_lightning.config import OptimizerConfig
from fl_lightning.functional import Forward, functional_forward, weighted_mean
from fl_lightning.messages import ClientResult, ClientTask, prefixed, task_settings, with_prefix
from fl_lightning.modules.learner import LocalLearner
from fl_lightning.plugins import ClientPlugin, register_client_plugin


def classifier_sample_losses(forward: Forward, params: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
    """Each sample's cross-entropy (B,): the FedAvg family's data loss, whose per-sample gradients
    make FIM-L-BFGS's diagonal Fisher (without FedProx's and FedDANE's terms, which are not data)."""
    return F.cross_entropy(forward(params, x).float(), y, reduction="none")


def classifier_objective(forward: Forward, params: dict[str, Tensor], consts: dict[str, Tensor], x: Tensor,
                         y: Tensor, weight: Tensor) -> Tensor:
    """The FedAvg family's local loss, written once for both engines: cross-entropy over the
    batch's real samples, plus FedProx's proximal term mu/2 ||w - w_start||^2 (``consts["mu"]``,
    ``consts["start.<name>"]``) and FedDANE's linear term <c, w - w_start> (``consts["linear.<name>"]``)."""
    loss = weighted_mean(classifier_sample_losses(forward, params, x, y), weight)
    if "mu" in consts:
        distance = sum(((p - consts[f"start.{n}"]) ** 2).sum() for n, p in params.items())
        loss = loss + consts["mu"] / 2 * distance
    if any(k.startswith("linear.") for k in consts):
        loss = loss + sum((consts[f"linear.{n}"] * (p - consts[f"start.{n}"])).sum() for n, p in params.items())
    return loss


def classifier_consts(params: dict[str, Tensor], prox_mu: float, linear: Optional[dict[str, Tensor]]) -> dict[str, Tensor]:
    """The constants ``classifier_objective`` reads: the starting point and mu (FedProx, FedDANE)
    and FedDANE's coefficients; none for plain FedAvg."""
    consts: dict[str, Tensor] = {}
    if prox_mu > 0 or linear is not None:
        consts.update({f"start.{n}": t.detach().clone() for n, t in params.items()})
        consts["mu"] = torch.tensor(float(prox_mu))
    if linear is not None:
        consts.update({f"linear.{n}": t for n, t in linear.items()})
    return consts


class MultiClassClassifier(LocalLearner):
    """Cross-entropy on all n classes (FedAvg's ClientUpdate, Algorithm 1); with
    ``prox_mu`` > 0, FedProx's proximal term mu/2 ||w - w_start||^2 is added.

    ``linear`` (FedDANE): c = grad f(w_t) - grad F_k(w_t) per parameter name; with ``prox_mu``
    = mu the client minimises FedDANE's local problem F_k(w) + <c, w> + mu/2 ||w - w_t||^2
    (w_t = w_start). The linear term is added as <c, w - w_t>: the paper's <c, w> less the
    constant <c, w_t>, so the same gradients and minimiser, while the recorded training loss
    (this whole objective, as FedProx's includes its term) starts at F_k(w_t) instead of
    carrying an arbitrary offset.

    ``control`` (SCAFFOLD): c - c_i per parameter name; every optimizer step then uses the
    corrected gradient g + c - c_i. It is added to ``.grad`` just before the step rather
    than as a loss term <w, c - c_i> (whose gradient is the same): the correction is then
    exact in any precision (no autocast, no loss scaling), costs no autograd graph, and
    the recorded training loss stays the cross-entropy, comparable with FedAvg's."""

    def __init__(self, network: nn.Module, optimizer: OptimizerConfig, prox_mu: float = 0.0,
                 control: Optional[dict[str, Tensor]] = None, linear: Optional[dict[str, Tensor]] = None) -> None:
        super().__init__(optimizer)
        # NHWC, like the inputs (LocalLearner.on_after_batch_transfer): mixed layouts make
        # oneDNN convert every activation back and forth.
        self.network = network.to(memory_format=torch.channels_last)
        self.prox_mu = prox_mu
        self._batch_norm = has_batch_norm(network)
        # dropout masks drawn from the client's generator (callbacks/dropout.py), as the cohort draws them
        self.dropout = drawn_dropout(self.network)
        self.functional = functional_forward(self.network)
        if control is not None:
            names = {name for name, _ in self.network.named_parameters()}
            if set(control) != names:
                raise ValueError(f"control variates {sorted(set(control) ^ names)} do not match the parameters")
        self.control = control
        if linear is not None:
            names = {name for name, _ in self.network.named_parameters()}
            if set(linear) != names:
                raise ValueError(f"FedDANE's linear term {sorted(set(linear) ^ names)} does not match the parameters")
        self.linear = linear
        self.consts = classifier_consts(dict(self.network.named_parameters()), prox_mu, linear)
        # FIM-L-BFGS's client-side reading: every step needs the batch's diagonal Fisher besides
        # the closure, which Lightning's automatic optimisation cannot pass
        self.automatic_optimization = optimizer.name != "fim_lbfgs"

    def forward(self, x: Tensor) -> Tensor:
        return self.network(x)

    def trains_on(self, samples: int) -> bool:
        """Whether a batch of ``samples`` is trained on (not skipped)."""
        return not self._batch_norm or bool(normalisable(samples))

    def configure_optimizers(self):
        if self.optimizer_cfg.name != "fim_lbfgs":
            return super().configure_optimizers()
        from fl_lightning.algorithms.fimlbfgs.optimizer import FIMLBFGSOptimizer

        cfg = self.optimizer_cfg
        return FIMLBFGSOptimizer(self.network.parameters(), lr=cfg.lr, history=cfg.history, damping=cfg.damping,
                                 max_step_norm=cfg.max_step_norm)

    def training_step(self, batch, batch_idx):
        x, y = batch
        if not self.trains_on(len(x)):
            return None  # batch norm cannot normalise a lone sample: skip it, as drop_last would
        if not self.automatic_optimization:
            return self._fim_lbfgs_step(x, y)
        return self.objective(x, y)

    def _fim_lbfgs_step(self, x: Tensor, y: Tensor) -> Tensor:
        """One FIM-based L-BFGS step (Algorithm 2 on the client): the diagonal empirical Fisher
        of this batch's cross-entropy, then the two-loop direction from the closure's gradient."""
        from fl_lightning.algorithms.fimlbfgs.per_sample import batch_fisher_of

        optimizer = self.optimizers()
        params = {n: p.detach() for n, p in self.network.named_parameters()}
        fisher = batch_fisher_of(lambda p, xb, yb: classifier_sample_losses(self.functional, p, xb, yb), params, x, y)
        fisher = [fisher[n] for n in params]  # the optimizer's (parameters') order

        def closure():
            optimizer.zero_grad()
            loss = self.objective(x, y)
            self.manual_backward(loss)
            return loss

        return optimizer.step(closure=closure, fisher=fisher).detach()

    def objective(self, x: Tensor, y: Tensor) -> Tensor:
        """The local loss, ``classifier_objective`` on this module's parameters."""
        return classifier_objective(self.functional, dict(self.network.named_parameters()), self.consts, x, y,
                                    torch.ones(len(y), device=x.device))

    def on_fit_start(self) -> None:
        if self.control is not None:  # once, not at every step
            self.control = {k: v.to(self.device) for k, v in self.control.items()}
        self.consts = {k: v.to(self.device) for k, v in self.consts.items()}

    def on_before_optimizer_step(self, optimizer) -> None:
        # Lightning calls this after backward (and after unscaling with 16-mixed), just
        # before optimizer.step(): SGD then steps along g + c - c_i.
        if self.control is None:
            return
        for name, p in self.network.named_parameters():
            correction = self.control[name].to(device=p.device, dtype=p.dtype)
            if p.grad is None:
                p.grad = correction.clone()
            else:
                p.grad.add_(correction)

    def flat_state(self) -> dict[str, Tensor]:
        return {k: v.detach().cpu().clone() for k, v in self.network.state_dict().items()}


CONTROL = "control."  # payload: SCAFFOLD's c; client state: the client's own c_i
GLOBAL_GRADIENT = "global_gradient."  # payload: FedDANE's grad f(w_t)
LOCAL_GRADIENT = "local_gradient."  # client state: FedDANE's grad F_k(w_t), kept from the gradient phase


def classifier_task(client_id: int, params: dict[str, Tensor], optimizer: OptimizerConfig, *, prox_mu: float = 0.0,
                    control: Optional[dict[str, Tensor]] = None, global_gradient: Optional[dict[str, Tensor]] = None,
                    params_held: bool = False, architecture: Optional[str] = None, num_outputs: Optional[int] = None,
                    classes: tuple[int, ...] = (), epochs: Optional[int] = None,
                    upload: Optional[tuple[str, ...]] = None) -> ClientTask:
    """A multi-class client task (FedAvg's ClientUpdate and its variants).

    ``prox_mu``: FedProx's proximal term; ``control``: SCAFFOLD's server control variate c
    (sent; the client keeps its own c_i); ``global_gradient``: FedDANE's grad f(w_t) (sent; the
    client kept grad F_k(w_t) from the gradient phase), with ``params_held`` when the client
    still holds w_t from that phase; ``architecture``/``num_outputs``: train another
    architecture than the run's (ATHENA-FL's probe), built on the client from its name."""
    payload = {**with_prefix(control or {}, CONTROL), **with_prefix(global_gradient or {}, GLOBAL_GRADIENT)}
    settings = task_settings(optimizer, prox_mu=prox_mu or None, params_held=params_held or None,
                             architecture=architecture, num_outputs=num_outputs, classes=list(classes) or None,
                             epochs=epochs, upload=list(upload) if upload is not None else None)
    return ClientTask(client_id, "classifier", params, payload, settings)


def _difference(minuend: dict[str, Tensor], subtrahend: dict[str, Tensor], what: str) -> Optional[dict[str, Tensor]]:
    """minuend - subtrahend per tensor; None when the task carries neither."""
    if not minuend:
        return None
    if set(subtrahend) != set(minuend):
        raise ValueError(f"a {what} task needs both terms of its correction (missing {sorted(set(minuend) - set(subtrahend))})")
    return {k: v - subtrahend[k] for k, v in minuend.items()}


def scaffold_correction(task: ClientTask, client_state: dict[str, Tensor]) -> Optional[dict[str, Tensor]]:
    """SCAFFOLD: c - c_i, added to every local gradient (None without a control variate);
    a client that never trained has c_i = 0."""
    control = prefixed(task.payload, CONTROL)
    own = prefixed(client_state, CONTROL) or {k: torch.zeros_like(v) for k, v in control.items()}
    return _difference(control, own, "SCAFFOLD (server and client control variates)")


def feddane_correction(task: ClientTask, client_state: dict[str, Tensor]) -> Optional[dict[str, Tensor]]:
    """FedDANE: grad f(w_t) - grad F_k(w_t), the linear term's coefficient (None otherwise)."""
    return _difference(prefixed(task.payload, GLOBAL_GRADIENT), prefixed(client_state, LOCAL_GRADIENT),
                       "FedDANE (global and local gradients)")


def task_architecture(ctx, task: ClientTask, device: str = "meta") -> nn.Module:
    """The architecture ``task`` trains: the run's (``ctx.template`` itself), or the task's own
    by name (ATHENA-FL's probe), built on ``device`` (meta: its code and shapes, no arithmetic)."""
    from fl_lightning.models import build_architecture

    name = task.settings.get("architecture")
    if name is None:
        return ctx.template
    with torch.device(device):
        return build_architecture(name, ctx.x.shape[1], tuple(ctx.x.shape[2:]), task.settings["num_outputs"])


def client_network(ctx, task: ClientTask) -> nn.Module:
    """The run's architecture, or the task's own (by name), holding the task's parameters."""
    import copy

    network = task_architecture(ctx, task, device="cpu")
    network = copy.deepcopy(network) if network is ctx.template else network
    network.load_state_dict(task.params)
    return network


def scaffold_client_state(task: ClientTask, client_state: dict[str, Tensor], params: dict[str, Tensor],
                          steps: int) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """SCAFFOLD option II after the local fit: (delta c_i to send, the client's new state with
    c_i+ = c_i + delta c_i); nothing without a control variate."""
    control = prefixed(task.payload, CONTROL)
    if not control:
        return {}, client_state
    delta = scaffold_client_delta(task.params, params, control, steps, task.optimizer.lr)
    own = prefixed(client_state, CONTROL) or {k: torch.zeros_like(v) for k, v in control.items()}
    kept = {k: (own[k].double() + delta[k].double()).to(own[k].dtype) for k in control}
    return with_prefix(delta, CONTROL), {**client_state, **with_prefix(kept, CONTROL)}


class ClassifierClient(ClientPlugin):
    def build(self, ctx, task, client_state):
        return MultiClassClassifier(client_network(ctx, task), task.optimizer, prox_mu=task.settings.get("prox_mu", 0.0),
                                    control=scaffold_correction(task, client_state),
                                    linear=feddane_correction(task, client_state))

    def fit_callbacks(self, ctx, task, seed):
        from fl_lightning.callbacks.dropout import DropoutDraws

        return [DropoutDraws(seed, tuple(ctx.x.shape[1:]))]

    def result(self, task, module, num_samples, steps, loss, client_state):
        params = module.flat_state()
        payload, kept = scaffold_client_state(task, client_state, params, steps)
        return ClientResult(task.client_id, params, num_samples, task.classes, loss, steps, payload, kept)




class ClassifierCohort(CohortPlugin):
    """The FedAvg family's client in the cohort engine: one member per client, trained by
    ``classifier_objective`` (``MultiClassClassifier``'s own loss) with SCAFFOLD's c - c_i added
    to every gradient (as the module adds it before each optimizer step). Its loss runs the
    network on the batch alone, so networks with batch norm and dropout (MobileNet: the
    FedAvg-MobileNet baseline, ATHENA-FL's probe) stack too."""

    batch_norm_and_dropout = True
    gives_sample_losses = True  # fim_lbfgs stacks too (on networks without batch norm and dropout)

    def network(self, ctx, task):
        return task_architecture(ctx, task)

    def stack_key(self, task):
        # another architecture than the run's (ATHENA-FL's probe) stacks with its own kind only
        return (task.settings.get("architecture"), task.settings.get("num_outputs"),
                "prox" if task.settings.get("prox_mu") else "",
                "linear" if prefixed(task.payload, GLOBAL_GRADIENT) else "",
                "control" if prefixed(task.payload, CONTROL) else "")

    def member_count(self, task):
        return 1

    def member_slices(self, task):
        return [None]

    def members(self, task, client_state):
        consts = classifier_consts(task.params, task.settings.get("prox_mu", 0.0), feddane_correction(task, client_state))
        return [Member(dict(task.params), consts, scaffold_correction(task, client_state))]

    def loss(self, forward, params, consts, x, y, weight):
        return classifier_objective(forward, params, consts, x, y, weight)

    def sample_losses(self, forward, params, consts, x, y):
        return classifier_sample_losses(forward, params, x, y)

    def result(self, task, params, losses, steps, num_samples, client_state):
        (state,) = params
        payload, kept = scaffold_client_state(task, client_state, state, steps)
        return ClientResult(task.client_id, state, num_samples, task.classes, losses[0], steps, payload, kept)


ClassifierClient.cohort = ClassifierCohort()
register_client_plugin("classifier", ClassifierClient())
