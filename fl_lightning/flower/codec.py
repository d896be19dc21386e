"""ClientTask / ClientResult <-> Flower ``RecordDict``: tensors travel as ``ArrayRecord``s,
everything else as one JSON string in a ``ConfigRecord`` (no pickles cross the network)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Optional

import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from fl_lightning.config import OptimizerConfig
from fl_lightning.knowledge_transfer import KnowledgeTransferConfig
from fl_lightning.strategies.base import ClientResult, ClientTask

_TENSOR_FIELDS = ("params", "control", "client_control", "global_gradient", "local_gradient")
_PLAIN_FIELDS = ("client_id", "kind", "classes", "stacking", "prox_mu", "num_classes", "fisher", "params_cached",
                 "epochs", "upload")


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
    if task.network is not None or task.open_set is not None:
        raise ValueError(f"client task kind {task.kind!r} carries a Python object (network/open_set) that the Flower "
                         f"runner does not ship; run this algorithm in process (python -m fl_lightning fit)")
    meta = {name: getattr(task, name) for name in _PLAIN_FIELDS}
    meta.update(round=round_index, optimizer=asdict(task.optimizer),
                knowledge_transfer=asdict(task.knowledge_transfer) if task.knowledge_transfer is not None else None)
    content = RecordDict({"meta": ConfigRecord({"json": json.dumps(meta)})})
    for name in _TENSOR_FIELDS:
        value = getattr(task, name)
        if value is not None:
            content[name] = _arrays(value)
    return content


def decode_task(content: RecordDict) -> tuple[ClientTask, int]:
    meta = json.loads(content["meta"]["json"])
    round_index = meta.pop("round")
    optimizer = OptimizerConfig(**meta.pop("optimizer"))
    transfer = meta.pop("knowledge_transfer", None)
    meta["knowledge_transfer"] = KnowledgeTransferConfig(**transfer) if transfer is not None else None
    meta["classes"] = tuple(meta["classes"])
    meta["upload"] = tuple(meta["upload"]) if meta["upload"] is not None else None
    tensors = {name: _tensors(content[name]) for name in _TENSOR_FIELDS if name in content}
    return ClientTask(optimizer=optimizer, **meta, **tensors), round_index


def encode_result(result: ClientResult) -> RecordDict:
    meta = {"client_id": result.client_id, "num_samples": result.num_samples, "classes": list(result.classes),
            "train_loss": result.train_loss, "steps": result.steps}
    return RecordDict({"meta": ConfigRecord({"json": json.dumps(meta)}), "params": _arrays(result.params),
                       "extras": _arrays(result.extras)})


def encode_failure(client_id: int, reason: str) -> RecordDict:
    return RecordDict({"failure": ConfigRecord({"client_id": client_id, "reason": reason})})


def decode_reply(content: RecordDict) -> tuple[Optional[ClientResult], Optional[str]]:
    """(result, None) or (None, the client's failure reason)."""
    if "failure" in content:
        return None, str(content["failure"]["reason"])
    meta = json.loads(content["meta"]["json"])
    meta["classes"] = tuple(meta["classes"])
    return ClientResult(params=_tensors(content["params"]), extras=_tensors(content["extras"]), **meta), None
