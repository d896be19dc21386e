"""FedOV's open-set client in the cohort engine (``trainer.engine: cohort``): one member per
client, trained by objective.py's ``open_set_objective`` (the module's own loss) on a padded
batch, with each member's outliers and mixup pairs drawn by ``OpenSetDraws`` from its client's
own generators — the draws its fit alone makes, step by step."""

from __future__ import annotations

import json

from fl_lightning.algorithms.fedov.draws import OpenSetDraws
from fl_lightning.algorithms.fedov.objective import open_set_objective
from fl_lightning.algorithms.fedov.open_set import OpenSetClient, task_loss
from fl_lightning.cohort.members import CohortPlugin, Member, StepDraws
from fl_lightning.messages import ClientResult


class OpenSetCohort(CohortPlugin):
    def stack_key(self, task):
        if task.settings.get("architecture") is not None:
            return None
        return json.dumps({"open_set": task.settings["open_set"], "num_classes": task.settings["num_classes"]},
                          sort_keys=True)

    def member_count(self, task):
        return 1

    def members(self, task, client_state):
        return [Member(dict(task.params))]

    def member_slices(self, task):
        return [None]

    def step_draws(self, ctx, tasks, seeds, member_tasks):
        loss = task_loss(tasks[0])  # one stack key: one loss for the cohort
        image_size = tuple(ctx.x.shape[-2:])
        return StepDraws([OpenSetDraws(loss, seeds[t], image_size) for t in member_tasks],
                         {"loss": loss, "unknown": int(tasks[0].settings["num_classes"])})

    def loss(self, forward, params, consts, x, y, weight, *, loss, unknown, **draws):
        return open_set_objective(forward, params, x, y, weight, draws, loss, unknown)

    def result(self, task, params, losses, steps, num_samples, client_state):
        return ClientResult(task.client_id, params[0], num_samples, task.classes, losses[0], steps)


OpenSetClient.cohort = OpenSetCohort()
