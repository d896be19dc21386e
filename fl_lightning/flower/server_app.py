"""The Flower ``ServerApp``: fl_lightning's own federated loop (fl_lightning.federation),
whose client phase goes to the SuperNodes through Flower's Grid instead of local workers.

Run config (``flwr run --run-config``): ``config`` (the run's YAML, as for
``python -m fl_lightning fit``), ``overrides`` (extra command-line settings, one string),
``wait-nodes-s`` (how long to wait for every SuperNode to connect), ``cwd`` (the folder
relative paths in the config resolve against)."""

from __future__ import annotations

import shlex
import sys
import time
from typing import Callable, Optional, Sequence

import numpy as np
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.serverapp import Grid, ServerApp

from fl_lightning.client import ClientFailure, checked, collect
from fl_lightning.flower.codec import decode_reply, encode_task, run_setting

app = ServerApp()
POLL_S = 0.2  # how often replies are pulled (Flower's send_and_receive waits 3 s between pulls)


def exchange(grid: Grid, messages: list, timeout: Optional[float]) -> list:
    """``grid.send_and_receive`` with a short poll: a round ends as soon as its last reply
    is in, not up to 3 s later."""
    pending = set(grid.push_messages(messages))
    end = None if timeout is None else time.monotonic() + timeout
    replies: list = []
    while pending:
        got = list(grid.pull_messages(pending))
        replies += got
        pending -= {m.metadata.reply_to_message_id for m in got}
        if not pending or (end is not None and time.monotonic() >= end):
            break
        time.sleep(POLL_S)
    return replies


class FlowerExecutor:
    """Sends a round's client tasks to the SuperNodes of those clients and collects the
    replies. A client whose reply is an error, a reported failure or missing after
    ``timeout`` seconds (disconnected, killed, too slow) becomes a ``ClientFailure``."""

    def __init__(self, grid: Grid, num_clients: int, timeout: Optional[float], wait_s: float = 300.0) -> None:
        self.grid, self.timeout = grid, timeout
        deadline = time.monotonic() + wait_s
        while len(list(grid.get_node_ids())) < num_clients:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(list(grid.get_node_ids()))} of partition.num_clients={num_clients} "
                                   f"SuperNodes connected within {wait_s:g} s")
            time.sleep(0.2)
        nodes = sorted(grid.get_node_ids())
        replies = exchange(grid, [Message(content=RecordDict({"ask": ConfigRecord({"what": "describe"})}),
                                          message_type=MessageType.QUERY, dst_node_id=n) for n in nodes], wait_s)
        self.node_of: dict[int, int] = {}
        self.label_counts: dict[int, np.ndarray] = {}
        for reply in replies:
            if reply.has_error():
                raise RuntimeError(f"SuperNode {reply.metadata.src_node_id} failed to describe itself: {reply.error.reason}")
            record = reply.content["client"]
            k = int(record["client_id"])
            if k in self.node_of:
                raise ValueError(f"two SuperNodes claim partition-id={k}")
            self.node_of[k] = reply.metadata.src_node_id
            self.label_counts[k] = np.asarray(record["label_counts"], dtype=np.int64)
        missing = sorted(set(range(num_clients)) - set(self.node_of))
        if missing:
            raise ValueError(f"no SuperNode serves partition-id {missing} (of partition.num_clients={num_clients})")

    def run(self, jobs: Sequence, round_index: int, on_result: Optional[Callable] = None, client_states=None):
        """``client_states`` is not sent: each SuperNode keeps its own client's state."""
        messages = [Message(content=encode_task(task, round_index), message_type=MessageType.TRAIN,
                            dst_node_id=self.node_of[task.client_id]) for task, _ in jobs]
        replies = {}
        for reply in exchange(self.grid, messages, self.timeout):
            replies[reply.metadata.src_node_id] = reply
        return collect((self._outcome(task, replies.get(self.node_of[task.client_id])) for task, _ in jobs),
                       len(jobs), on_result)

    def _outcome(self, task, reply):
        """A reply as the in-process executor's outcome: a checked result, or the failure."""
        if reply is None:
            return ClientFailure(task.client_id, f"no reply within federation.client_timeout={self.timeout} s "
                                                 f"(disconnected or too slow)")
        if reply.has_error():
            return ClientFailure(task.client_id, f"Flower error: {reply.error.reason}")
        result, reason = decode_reply(reply.content)
        return ClientFailure(task.client_id, reason) if result is None else checked(result)

    def close(self) -> None:
        pass


@app.main()
def main(grid: Grid, context: Context) -> None:
    from fl_lightning.settings import build_federation

    import os

    if run_setting(context, "cwd", ""):  # where `flwr run` was started: relative paths resolve there
        os.chdir(str(run_setting(context, "cwd")))
    config = str(run_setting(context, "config"))
    overrides = shlex.split(str(run_setting(context, "overrides", "")))
    _, _, federation = build_federation(["fit", "--config", config, *overrides])
    federation.setup()
    executor = FlowerExecutor(grid, federation.partition.num_clients, federation.federation.client_timeout,
                              float(run_setting(context, "wait-nodes-s", 300)))
    federation.use_reported_label_counts(executor.label_counts)
    summary = federation.fit(executor=executor)
    print(f"final accuracy {summary['final_accuracy']}; summary: {federation.run_dir}/summary.json", file=sys.stderr)
