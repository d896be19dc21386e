"""FIM-based approximate L-BFGS (the FedOVA journal paper, Section IV-A, Algorithm 1) and its
combination with FedOVA (Section IV-B, Algorithm 2).

Round t: the sampled clients receive w_t and return, for the loss on their local data at
w_t, its gradient and its diagonal Fisher (a ``CurvatureProbe``: one pass, no training).
The server forms

    g_t = sum_k n_k g_k / sum_k n_k          (the gradient of the union of their data)
    F_t = (1/|K_t|) sum_k F_k                (Algorithm 1, line 8's 1/K sum)
    p_t = -H_t g_t                           (line 6, two-loop recursion over the last m pairs)
    w_{t+1} = w_t + eta p_t                  (line 7)
    s_t = w_{t+1} - w_t,  y_t = (F_t + lambda) * s_t   (line 8, elementwise: diagonal Fisher)
    push (s_t, y_t), dropping the oldest beyond m, skipping s.y <= 0   (lines 9-13)

The L-BFGS memory lives in the global state next to the model (whose parameters keep their
names): ``lbfgs.s`` and ``lbfgs.y`` (G, m, d) and ``lbfgs.count`` (G,), G = 1 for one model,
n for FedOVA's n detectors. Checkpoints therefore hold it, and resumed runs repeat the
uninterrupted ones.

Communication per client and round: w_t down (d), gradient and Fisher up (2d).
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch
from torch import Tensor

from fl_lightning.config import OptimizerConfig
from fl_lightning.algorithms.fimlbfgs.lbfgs import CURVATURE_EPS, push_pair, two_loop_direction
from fl_lightning.algorithms.fimlbfgs.curvature import FISHER, curvature_task
from fl_lightning.messages import prefixed
from fl_lightning.strategy import ClientResult, ClientTask, ServerContext, State, Strategy
from fl_lightning.algorithms.baselines.fedavg import FedAvg
from fl_lightning.algorithms.fedova.strategy import FedOVA

HISTORY_S, HISTORY_Y, HISTORY_COUNT = "lbfgs.s", "lbfgs.y", "lbfgs.count"
HISTORY_KEYS = (HISTORY_S, HISTORY_Y, HISTORY_COUNT)


class _FIMLBFGSUpdate(Strategy):
    """The server update shared by ``FIMLBFGS`` (one model, G = 1) and ``FedOVAFIMLBFGS`` (n
    detectors, G = n, each updated from its own group with its own history). It comes first
    in their bases, so ``super()`` reaches FedAvg's or FedOVA's model handling."""

    one_vs_all = False

    def __init__(self, step_size: float = 1e-3, damping: float = 1e-3, history: int = 10,
                 max_step_norm: float = 0.0, curvature_eps: float = CURVATURE_EPS,
                 train_accuracy_samples: int = 10_000) -> None:
        super().__init__(weighted=False)  # FedAvg's/FedOVA's averaging is not used
        if step_size <= 0:
            raise ValueError(f"algorithm.step_size={step_size} must be > 0")
        if damping < 0 or max_step_norm < 0 or curvature_eps < 0:
            raise ValueError("algorithm.damping, max_step_norm and curvature_eps must be >= 0")
        if history < 1:
            raise ValueError(f"algorithm.history={history} must be >= 1")
        self.step_size, self.damping, self.history = step_size, damping, history
        self.max_step_norm, self.curvature_eps = max_step_norm, curvature_eps
        if train_accuracy_samples < 0:
            raise ValueError(f"algorithm.train_accuracy_samples={train_accuracy_samples} must be >= 0 (0: off)")
        self.train_accuracy_samples = train_accuracy_samples

    def configure_callbacks(self) -> list:
        """The aggregation, then (Table II's figures read as training accuracy) the new global
        model's accuracy on a fixed subsample of the clients' pooled training data."""
        from fl_lightning.callbacks.training_accuracy import TrainingAccuracy

        callbacks = super().configure_callbacks()
        return callbacks + [TrainingAccuracy(self.train_accuracy_samples)] if self.train_accuracy_samples else callbacks

    # ---- layout ----------------------------------------------------------------------------
    def setup(self, template: torch.nn.Module, num_classes: int, optimizer: OptimizerConfig, stacking: str,
              context: Optional[ServerContext] = None) -> None:
        super().setup(template, num_classes, optimizer, stacking, context)
        buffers = [name for name, _ in template.named_buffers()]
        if buffers:
            raise ValueError(f"FIM-L-BFGS updates parameters only; the architecture has buffers {buffers}")
        self.shapes = {name: p.shape for name, p in template.named_parameters()}
        self.dim = sum(int(np.prod(s)) for s in self.shapes.values())
        self.groups = num_classes if self.one_vs_all else 1

    def initial_state(self, generator: torch.Generator) -> State:
        state = super().initial_state(generator)
        dtype = next(iter(state.values())).dtype
        state[HISTORY_S] = torch.zeros(self.groups, self.history, self.dim, dtype=dtype)
        state[HISTORY_Y] = torch.zeros(self.groups, self.history, self.dim, dtype=dtype)
        state[HISTORY_COUNT] = torch.zeros(self.groups, dtype=torch.long)
        return state

    @staticmethod
    def model(state: State) -> State:
        return {k: v for k, v in state.items() if k not in HISTORY_KEYS}

    def _flat(self, tensors: State, group: Optional[int] = None) -> Tensor:
        """One model's (or one detector's) parameters as a float64 vector of length d."""
        return torch.cat([(tensors[n] if group is None else tensors[n][group]).double().reshape(-1)
                          for n in self.shapes])

    def _unflat(self, vector: Tensor) -> dict[str, Tensor]:
        parts = vector.split([int(np.prod(s)) for s in self.shapes.values()])
        return {n: part.reshape(s) for (n, s), part in zip(self.shapes.items(), parts)}

    # ---- the round ---------------------------------------------------------------------------
    def configure_client(self, state: State, client_id: int, labels: np.ndarray) -> Optional[ClientTask]:
        """Algorithm 1, line 4 (ClientUpdate(k, w_t)): the model — for FedOVA only the detectors
        of the labels the client holds — goes to a gradient-and-Fisher probe."""
        task = super().configure_client(self.model(state), client_id, labels)
        return None if task is None else curvature_task(client_id, task.params, task.classes, fisher=True)

    def _contributions(self, result: ClientResult) -> list[tuple[int, State, State]]:
        """(group, gradient, Fisher) of one client: group 0, or one per detector it probed."""
        fisher = prefixed(result.payload, FISHER)
        if not self.one_vs_all:
            return [(0, result.params, fisher)]
        return [(int(c), {n: t[row] for n, t in result.params.items()}, {n: t[row] for n, t in fisher.items()})
                for row, c in enumerate(result.classes)]

    def aggregate(self, state: State, results: list[ClientResult]) -> tuple[State, dict[str, Any]]:
        members: dict[int, list[tuple[Tensor, Tensor, int]]] = {}
        for r in results:
            for group, gradient, fisher in self._contributions(r):
                members.setdefault(group, []).append((self._flat(gradient), self._flat(fisher), r.num_samples))
        new = {k: v.clone() for k, v in state.items()}
        stats: dict[str, list[float]] = {"grad_norm": [], "step_norm": [], "fisher_mean": [], "descent_cos": []}
        skipped = clipped = 0
        for group, ms in sorted(members.items()):
            grads, fishers, counts = zip(*ms)
            n = torch.tensor(counts, dtype=torch.float64)
            g_t = (torch.stack(grads) * (n / n.sum()).unsqueeze(1)).sum(0)  # sample-weighted mean
            f_t = torch.stack(fishers).mean(0)  # (1/|K_t|) sum_k F_k
            count = int(new[HISTORY_COUNT][group])
            s_hist, y_hist = new[HISTORY_S][group], new[HISTORY_Y][group]
            p_t = two_loop_direction(g_t, s_hist[:count], y_hist[:count])  # line 6
            step = self.step_size * p_t  # line 7
            norm = float(torch.linalg.vector_norm(step))
            if self.max_step_norm > 0 and norm > self.max_step_norm:
                step *= self.max_step_norm / norm
                clipped += 1
            index = None if not self.one_vs_all else group
            w_t = self._flat(new, index)
            for name, value in self._unflat(w_t + step).items():
                target = new[name] if index is None else new[name][group]
                target.copy_(value.to(target.dtype))
            s_t = self._flat(new, index) - w_t  # line 8, as stored (float32)
            y_t = (f_t + self.damping) * s_t  # B_t s_t with B_t = diag(F_t) + lambda I
            s_hist, y_hist, count, accepted = push_pair(s_hist, y_hist, count, s_t, y_t, self.curvature_eps)
            new[HISTORY_S][group], new[HISTORY_Y][group], new[HISTORY_COUNT][group] = s_hist, y_hist, count
            skipped += not accepted
            stats["grad_norm"].append(float(torch.linalg.vector_norm(g_t)))
            stats["step_norm"].append(float(torch.linalg.vector_norm(s_t)))
            stats["fisher_mean"].append(float(f_t.mean()))
            stats["descent_cos"].append(float(-torch.dot(p_t.double(), g_t) /
                                              (torch.linalg.vector_norm(p_t) * torch.linalg.vector_norm(g_t) + 1e-30)))
        facts: dict[str, Any] = {f"lbfgs/{k}": float(np.mean(v)) for k, v in stats.items() if v}
        facts.update({"lbfgs/pairs": float(new[HISTORY_COUNT].double().mean()), "lbfgs/skipped": skipped,
                      "lbfgs/clipped": clipped})
        if self.one_vs_all:
            facts.update({f"group_size/{c}": len(ms) for c, ms in sorted(members.items())})
        return new, facts

    def predict_logits(self, state: State, x: Tensor) -> Tensor:
        return super().predict_logits(self.model(state), x)

    def extra_metrics(self, state: State, x: Tensor, y: Tensor, scores: Tensor) -> dict[str, float]:
        return super().extra_metrics(self.model(state), x, y, scores)


class FIMLBFGS(_FIMLBFGSUpdate, FedAvg):
    """FIM-based approximate L-BFGS (Algorithm 1) on one n-class model. Clients do not train:
    each returns the gradient of its local loss at w_t averaged over its local data (one pass
    in mini-batches of ``federation.batch_size``, whatever ``federation.local_epochs``) and
    the diagonal Fisher, the mean of its squared per-sample gradients; the server takes one
    L-BFGS step per round. ``optimizer`` settings are unused.

    Args:
        step_size: eta, the server's step along the L-BFGS direction (Algorithm 1, line 7).
            Defaults (eta = lambda = 1e-3): the best of a short search on IID Fashion-MNIST with
            FashionCNN (configs/fimlbfgs_fmnist.yaml).
        damping: lambda, added to the diagonal Fisher in y_t = (F_t + lambda) s_t. Many
            diagonal-Fisher entries are tiny or exactly zero (dead ReLUs, rarely active
            weights); undamped, the curvature along them is ~0, so the inverse H (through
            gamma = s.y / y.y and the pairs) is huge there and the step explodes. lambda bounds
            the inverse curvature by 1/lambda: with F_t << lambda, H -> I / lambda and the step
            becomes plain gradient descent with step eta / lambda.
        history: m, the number of (s, y) pairs kept (the paper: generally 10).
        max_step_norm: if > 0, a step eta p_t longer than this is scaled down to it (a trust
            region for early rounds, when the first pairs can make gamma large); 0: off.
        curvature_eps: a pair with s.y <= curvature_eps ||s|| ||y|| is skipped (keeps H
            positive definite; with lambda > 0 every pair passes, since s.y = sum (F + lambda) s^2).
        train_accuracy_samples: each round, log ``train/accuracy``, the new model's accuracy on
            this many samples of the clients' pooled training data, fixed for the run (Table II's
            figures read as training accuracy); 0: off.
    """

    name = "fimlbfgs"


class FedOVAFIMLBFGS(_FIMLBFGSUpdate, FedOVA):
    """FedOVA (Algorithm 2) trained by FIM-L-BFGS (Algorithm 1): n binary detectors stacked
    (n, ...) as in FedOVA (one logit each, binary cross-entropy on y == class; prediction
    argmax_i f_i(x)). A client probes only the detectors of the labels it holds (gradient and
    diagonal Fisher of each at w_t^i, one pass); each detector's group P_i (the sampled
    clients holding label i) makes its own L-BFGS step with its own history; a detector
    nobody probed keeps its parameters and history.

    Args:
        step_size: eta, the server's step along the L-BFGS direction (Algorithm 1, line 7).
        damping: lambda, added to the diagonal Fisher in y_t = (F_t + lambda) s_t (tiny or
            zero Fisher entries would otherwise make the inverse curvature huge; see FIMLBFGS).
        history: m, the number of (s, y) pairs kept per detector.
        max_step_norm: if > 0, each detector's step is scaled down to at most this length; 0: off.
        curvature_eps: a pair with s.y <= curvature_eps ||s|| ||y|| is skipped.
        train_accuracy_samples: as FIMLBFGS's (``train/accuracy`` each round; 0: off).
    """

    name = "fedova_fimlbfgs"
    one_vs_all = True
