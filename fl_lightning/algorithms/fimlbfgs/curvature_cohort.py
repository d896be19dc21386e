"""How curvature probes stack in the cohort engine (``trainer.engine: cohort``): FIM-L-BFGS's
ClientUpdate (a model's gradient and diagonal Fisher at w_t; FedOVA's detectors, each its own)
and FedDANE's gradient phase (the gradient alone), vectorised across clients.

Every probed network (a client's model, or each detector it probes) is a member at the task's
parameters; one pass over the client's batches, where each step updates nothing and adds the
batch's sums over the member's real samples to ``GradientSums`` (curvature.py's ``probe_sums``,
the sums ``CurvatureProbe.training_step`` adds); the result divides them by the client's sample
count, as the probe does. Precision as per client: the probed loss, its per-sample gradients and
the sums run in float32 with autocast off (curvature.py's note), whatever the Trainer's precision.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from fl_lightning.algorithms.fimlbfgs.curvature import (CurvatureClient, probe_result, probe_sample_losses,
                                                        probe_sums)
from fl_lightning.cohort.members import CohortPlugin, Member
from fl_lightning.cohort.optim import MemberOptimizer, per_member
from fl_lightning.functional import weighted_mean

GRADIENT_SUM, SQUARE_SUM = "gradient_sum.", "square_sum."  # GradientSums' outputs


class GradientSums(MemberOptimizer):
    """The probe's step in the cohort engine: no update; each member adds its batch's sums over
    its real samples, sum_i grad f_i and (``squares``) sum_i (grad f_i)^2 of the plug-in's
    ``sample_losses`` (``probe_sums``, as ``CurvatureProbe.training_step`` adds them), and
    hands them back beside its parameters (``outputs``). A member whose mask is 0 adds nothing."""

    uses_sample_losses = True
    uses_gradient = False  # the sums come from per-sample gradients (or the summed loss's), not the mean loss's

    def __init__(self, squares: bool, params: Sequence[Tensor], lr: Optional[Sequence[float]] = None) -> None:
        super().__init__(squares, params, lr)
        self.squares = squares
        self.gradient = [torch.zeros_like(p) for p in params]
        self.square = [torch.zeros_like(p) for p in params] if squares else []

    @staticmethod
    def shared_settings(settings: bool) -> bool:
        return settings

    def tensors(self) -> list[Tensor]:
        return self.gradient + self.square

    def batch_statistic(self, sample_losses, params, x, y, weight) -> list[Tensor]:
        gradient, squares, _ = probe_sums(sample_losses, params, x, y, weight, self.squares)  # the plug-in's probe losses
        return [gradient[n] for n in params] + [squares[n] for n in squares]

    @torch.no_grad()
    def step(self, params: Sequence[Tensor], grads: Sequence[Tensor], mask: Tensor,
             statistic: Sequence[Tensor] = ()) -> None:
        for total, batch in zip(self.gradient + self.square, statistic):
            total.add_(torch.where(per_member(mask, batch) > 0, batch, torch.zeros_like(batch)))

    def outputs(self, names: Sequence[str]) -> dict[str, Tensor]:
        return {**{GRADIENT_SUM + n: t for n, t in zip(names, self.gradient)},
                **{SQUARE_SUM + n: t for n, t in zip(names, self.square)}}


class CurvatureCohort(CohortPlugin):
    """The probe in the cohort engine: one member per probed network (the client's model, or each
    detector it probes, its class the member's constant), stepping with ``GradientSums``."""

    gives_sample_losses = True

    def stack_key(self, task):
        return ("detectors" if task.classes else "model", bool(task.settings["fisher"]))

    def member_count(self, task):
        return max(len(task.classes), 1)

    def members(self, task, client_state):
        if not task.classes:
            return [Member(dict(task.params))]
        return [Member({name: t[g] for name, t in task.params.items()}, {"target": torch.tensor(c)})
                for g, c in enumerate(task.classes)]

    def optimizer(self, task):
        return GradientSums, bool(task.settings["fisher"])

    def loss(self, forward, params, consts, x, y, weight):
        # only evaluated: the local loss at w_t, reported as the probe reports it (its batches' mean)
        return weighted_mean(probe_sample_losses(forward, params, consts, x, y), weight)

    def sample_losses(self, forward, params, consts, x, y):
        return probe_sample_losses(forward, params, consts, x, y)

    def result(self, task, params, losses, steps, num_samples, client_state):
        def means(prefix: str) -> dict[str, Tensor]:  # (1/N) sum_i, per network; detectors stacked (G, ...)
            names = [n[len(prefix):] for n in params[0] if n.startswith(prefix)]
            rows = [{n: p[prefix + n] / num_samples for n in names} for p in params]
            return rows[0] if not task.classes else {n: torch.stack([r[n] for r in rows]) for n in names}

        fisher = means(SQUARE_SUM) if task.settings["fisher"] else None
        # no optimizer step: the per-client Trainer counts none either
        return probe_result(task, means(GRADIENT_SUM), fisher, num_samples, float(sum(losses)), 0, client_state)


CurvatureClient.cohort = CurvatureCohort()
