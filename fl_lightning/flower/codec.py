"""ClientTask / ClientResult <-> Flower ``RecordDict``: tensors travel as ``ArrayRecord``s,
everything else as one JSON string in a ``ConfigRecord`` (no pickles cross the network)."""

from __future__ import annotations

import json
from typing import Optional

import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from fl_lightning.messages import ClientResult, ClientTask

def run_setting(context, key: str, default=None):
    """A run-config value (``flwr run --run-config``), else the environment variable
    FL_LIGHTNING_FLOWER_<KEY> (the simulation runner's way in: run_simulation takes no run
    config), else ``default``."""
    import os

    value = context.run_config.get(key)
    if value in (None, ""):
        value = os.environ.get("FL_LIGHTNING_FLOWER_" + key.upper().replace("-", "_"), default)
    if value is None:
        raise ValueError(f"Flower run config lacks {key!r} (flwr run --run-config \"{key}='...'\")")
    return value


def _arrays(tensors: dict[str, torch.Tensor]) -> ArrayRecord:
    return ArrayRecord(torch_state_dict={k: v.detach().cpu().contiguous() for k, v in tensors.items()})


def _tensors(record: ArrayRecord) -> dict[str, torch.Tensor]:
    return dict(record.to_torch_state_dict())


def encode_task(task: ClientTask, round_index: int) -> RecordDict:
    """Any kind alike: params and payload as ArrayRecords, the settings as JSON."""
    meta = {"client_id": task.client_id, "kind": task.kind, "round": round_index, "settings": task.settings}
    return RecordDict({"meta": ConfigRecord({"json": json.dumps(meta)}), "params": _arrays(task.params),
                       "payload": _arrays(task.payload)})


def decode_task(content: RecordDict) -> tuple[ClientTask, int]:
    meta = json.loads(content["meta"]["json"])
    task = ClientTask(meta["client_id"], meta["kind"], _tensors(content["params"]), _tensors(content["payload"]),
                      meta["settings"])
    return task, meta["round"]


def encode_result(result: ClientResult) -> RecordDict:
    """What the client sends back; its ``client_state`` stays on the SuperNode."""
    meta = {"client_id": result.client_id, "num_samples": result.num_samples, "classes": list(result.classes),
            "train_loss": result.train_loss, "steps": result.steps}
    return RecordDict({"meta": ConfigRecord({"json": json.dumps(meta)}), "params": _arrays(result.params),
                       "payload": _arrays(result.payload)})


def encode_failure(client_id: int, reason: str) -> RecordDict:
    return RecordDict({"failure": ConfigRecord({"client_id": client_id, "reason": reason})})


def decode_reply(content: RecordDict) -> tuple[Optional[ClientResult], Optional[str]]:
    """(result, None) or (None, the client's failure reason)."""
    if "failure" in content:
        return None, str(content["failure"]["reason"])
    meta = json.loads(content["meta"]["json"])
    meta["classes"] = tuple(meta["classes"])
    return ClientResult(params=_tensors(content["params"]), payload=_tensors(content["payload"]), **meta), None
