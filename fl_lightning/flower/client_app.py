"""The Flower ``ClientApp``: one fl_lightning client on its own SuperNode.

A SuperNode is started with ``--node-config "partition-id=K"`` (and optionally
``config=/path/to/run.yaml`` when the client machine keeps its settings elsewhere). The
ClientApp reads the run's settings, loads the data, keeps client K's partition only, and
answers each TRAIN message with ``fl_lightning.client.guarded_train`` — the very function
the in-process loop runs — or with the reason it failed. A QUERY is answered with the
client's per-class sample counts (its label set for one-vs-all task assignment: counts,
never samples)."""

from __future__ import annotations

import shlex

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from fl_lightning.flower.codec import decode_task, encode_failure, encode_result, run_setting

app = ClientApp()
CLIENT_STATE = "fl_lightning.client_state"
_LOCAL: dict = {}  # this process's own partition, loaded once


def local_client(context: Context):
    """(client id, ClientContext over this client's samples only, their labels)."""
    config = str(context.node_config.get("config") or run_setting(context, "config"))
    overrides = str(context.node_config.get("overrides") or run_setting(context, "overrides", ""))
    client_id = int(context.node_config["partition-id"])
    key = (config, overrides, client_id)
    if key not in _LOCAL:
        from fl_lightning.settings import build_federation
        from fl_lightning.client import ClientContext

        _, _, federation = build_federation(["fit", "--config", config, *shlex.split(overrides)])
        federation.setup()
        indices = torch.from_numpy(federation.client_indices[client_id])
        data = federation._data
        x, y = data.train_x[indices].clone(), data.train_y[indices].clone()
        federation._data = None  # keep nothing of the other clients' samples
        _LOCAL.clear()
        torch.set_num_threads(federation.trainer_cfg.threads or 1)
        _LOCAL[key] = (client_id, ClientContext(x, y, federation.template, federation.federation,
                                                federation.trainer_cfg, federation.seed, federation.public_x), y.numpy(),
                       int(federation.strategy.num_classes))
    return _LOCAL[key]


@app.query()
def describe(msg: Message, context: Context) -> Message:
    client_id, _, labels, num_classes = local_client(context)
    counts = np.bincount(labels, minlength=num_classes).tolist()
    return Message(content=RecordDict({"client": ConfigRecord({"client_id": client_id, "label_counts": counts})}),
                   reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    from fl_lightning.client import ClientFailure, guarded_train

    client_id, ctx, labels, _ = local_client(context)
    try:
        task, round_index = decode_task(msg.content)
        if task.client_id != client_id:
            raise ValueError(f"task for client {task.client_id} sent to the SuperNode of partition-id={client_id}")
        # what this client kept from its earlier rounds (SCAFFOLD's c_i) lives in the node's state
        kept = dict(context.state[CLIENT_STATE].to_torch_state_dict()) if CLIENT_STATE in context.state else {}
        outcome = guarded_train(ctx, task, np.arange(len(labels)), round_index, kept)
        if not isinstance(outcome, ClientFailure) and outcome.client_state:
            context.state[CLIENT_STATE] = ArrayRecord(torch_state_dict=outcome.client_state)
    except Exception as error:  # noqa: BLE001 - reported to the server, which drops this client
        outcome = ClientFailure(client_id, f"{type(error).__name__}: {error}")
    content = (encode_failure(outcome.client_id, outcome.reason) if isinstance(outcome, ClientFailure)
               else encode_result(outcome))
    return Message(content=content, reply_to=msg)
