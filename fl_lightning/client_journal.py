"""Client results saved as they arrive (``run.checkpoint_clients``), so a run stopped in the
middle of a round resumes without retraining the clients that had finished.

The federation's checkpoint is written between rounds. A one-shot method (FedOV, FedKT, ...)
has one round, and at the paper's E = 200 local epochs its ten clients train for hours on a
CPU: without this, a run stopped at client 9 starts again at client 1.

Each successful result goes, atomically, to ``<run.dir>/checkpoints/clients/round-<r>/``, named
by a fingerprint of everything the client's training reads: the run's settings (those a resume
may not change), the round, the task the server sent (kind, settings, tensors), the client's
sample indices and the state it kept from earlier rounds. A resumed run reuses a saved result
only for the task it is about to send with the same fingerprint, and trains the rest; so the
results are the ones an uninterrupted run computes (client training is seeded by run seed,
round and client). Other rounds' folders go when a round starts, and the whole folder when
the fit ends.

The fingerprint covers settings and data, not code: each result also records the git commit
that trained it, and a resume that reuses results of another commit (or of a checkout with
uncommitted changes) says so, since a change to client training in between would mix two
versions of the code in one round.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from fl_lightning.checkpoint import save_atomic
from fl_lightning.messages import ClientResult, ClientTask, State
from fl_lightning.provenance import git_state

FOLDER = Path("checkpoints") / "clients"


def _digest_tensors(hasher, tensors: State, cache: dict[int, bytes]) -> None:
    for name in sorted(tensors):
        t = tensors[name]
        key = id(t)
        if key not in cache:  # FedAvg sends every client the same tensors: hash them once a round
            flat = t.detach().reshape(-1).contiguous().cpu()
            cache[key] = hashlib.sha256(flat.view(torch.uint8).numpy().tobytes()).digest() + \
                f"{t.dtype}{tuple(t.shape)}".encode()
        hasher.update(name.encode() + b"\0" + cache[key])


class ClientJournal:
    """The saved results of one run directory."""

    def __init__(self, run_dir: str | Path, run_key: str) -> None:
        self.root = Path(run_dir) / FOLDER
        self.run_key = run_key  # the run's settings that a resume may not change, as JSON
        self.code = git_state()  # {"commit", "dirty"} of the code this process runs

    def folder(self, round_index: int) -> Path:
        return self.root / f"round-{round_index:04d}"

    def fingerprint(self, task: ClientTask, indices: np.ndarray, round_index: int,
                    kept: Optional[State], cache: dict[int, bytes]) -> str:
        hasher = hashlib.sha256()
        hasher.update(json.dumps([self.run_key, round_index, task.client_id, task.kind, task.settings]).encode())
        for part in (task.params, task.payload, kept or {}):
            hasher.update(b"\1")
            _digest_tensors(hasher, part, cache)
        hasher.update(np.ascontiguousarray(indices, dtype=np.int64).tobytes())
        return hasher.hexdigest()

    def path(self, round_index: int, client_id: int, fingerprint: str) -> Path:
        return self.folder(round_index) / f"client-{client_id}-{fingerprint[:32]}.pt"

    def save(self, round_index: int, fingerprint: str, result: ClientResult) -> None:
        save_atomic({"fingerprint": fingerprint, "round": round_index, "client_id": result.client_id,
                     "params": result.params, "num_samples": result.num_samples, "classes": list(result.classes),
                     "train_loss": result.train_loss, "steps": result.steps, "payload": result.payload,
                     "client_state": result.client_state, "code": self.code},
                    self.path(round_index, result.client_id, fingerprint))

    def load(self, round_index: int, client_id: int, fingerprint: str) -> Optional[tuple[ClientResult, dict]]:
        """The saved result for exactly this task and the code state that trained it, or None
        (never saved, or unreadable: a file cut short by a crash is only a client to train again)."""
        path = self.path(round_index, client_id, fingerprint)
        if not path.is_file():
            return None
        try:
            saved = torch.load(path, map_location=None if torch.cuda.is_available() else "cpu", weights_only=True)
        except Exception:  # noqa: BLE001 - any unreadable file: train the client again
            return None
        if saved.get("fingerprint") != fingerprint:
            return None
        result = ClientResult(client_id=saved["client_id"], params=saved["params"], num_samples=saved["num_samples"],
                              classes=tuple(saved["classes"]), train_loss=saved["train_loss"], steps=saved["steps"],
                              payload=saved["payload"], client_state=saved["client_state"])
        return result, saved.get("code") or {"commit": None, "dirty": None}

    def count(self, round_index: int) -> int:
        """How many client results of ``round_index`` are saved."""
        folder = self.folder(round_index)
        return len(list(folder.glob("client-*.pt"))) if folder.is_dir() else 0

    def keep_only(self, round_index: int) -> None:
        """Drop the folders of other rounds (finished rounds, or a run resumed from an earlier
        checkpoint)."""
        if self.root.is_dir():
            for folder in self.root.iterdir():
                if folder != self.folder(round_index):
                    shutil.rmtree(folder, ignore_errors=True)

    def clear(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _describe(code: dict) -> str:
    if code.get("commit") is None:
        return "code of unknown commit"
    return f"commit {code['commit'][:10]}" + (" with uncommitted changes" if code.get("dirty") else "")


class JournaledExecutor:
    """An executor (in process, workers, cohorts, Flower) whose successful results are saved
    as they arrive and whose saved results are reused: same ``run`` and ``close`` as the one
    it wraps, results in job order."""

    def __init__(self, executor, journal: ClientJournal) -> None:
        self.executor, self.journal = executor, journal

    def run(self, jobs: Sequence[tuple[ClientTask, np.ndarray]], round_index: int,
            on_result: Optional[Callable[[ClientResult, int, int], None]] = None,
            client_states: Optional[dict[int, State]] = None):
        self.journal.keep_only(round_index)
        states = client_states or {}
        cache: dict[int, bytes] = {}
        prints = [self.journal.fingerprint(task, indices, round_index, states.get(task.client_id), cache)
                  for task, indices in jobs]
        saved, other_code = {}, {}
        for position, ((task, _), fingerprint) in enumerate(zip(jobs, prints)):
            loaded = self.journal.load(round_index, task.client_id, fingerprint)
            if loaded is not None:
                saved[position], code = loaded
                if code != self.journal.code or code.get("dirty"):
                    other_code.setdefault(_describe(code), []).append(task.client_id)
                if on_result is not None:
                    on_result(saved[position], len(saved), len(jobs))
        if saved:
            print(f"round {round_index}: reusing the saved results of clients "
                  f"{sorted(r.client_id for r in saved.values())} (run.checkpoint_clients)", file=sys.stderr)
        for code, clients in other_code.items():
            print(f"round {round_index}: clients {sorted(clients)} were trained by {code}, this run is "
                  f"{_describe(self.journal.code)}: if client training changed in between, start afresh "
                  f"(without --ckpt_path)", file=sys.stderr)
        todo = [p for p in range(len(jobs)) if p not in saved]
        print_of = {jobs[p][0].client_id: prints[p] for p in todo}

        def arrived(result: ClientResult, done: int, total: int) -> None:
            self.journal.save(round_index, print_of[result.client_id], result)
            if on_result is not None:
                on_result(result, done + len(saved), len(jobs))

        results, failures = (self.executor.run([jobs[p] for p in todo], round_index, arrived, client_states)
                             if todo else ([], []))
        by_client = {r.client_id: r for r in results}
        merged = [saved[p] if p in saved else by_client.get(jobs[p][0].client_id) for p in range(len(jobs))]
        return [r for r in merged if r is not None], failures

    def close(self) -> None:
        self.executor.close()

    def terminate(self) -> None:
        getattr(self.executor, "terminate", self.executor.close)()
