"""One fit at a time per run directory.

``Federation.fit`` holds ``<run.dir>/.fit.lock`` while it runs: a file locked with a POSIX
record lock (``fcntl.lockf``) that names its owner (PID, host, start time, command). A
second fit into the same run.dir is refused with a message naming the directory and that
process, instead of both overwriting each other's checkpoints and summary.

The kernel drops the lock when its process ends, however it ends (SIGKILL included), so a
lock file left by a dead process blocks nothing: the next fit takes it over. A POSIX lock
is not inherited by forked worker processes either, so orphaned workers of a killed run do
not hold it. The file is removed when its fit ends. Within one process (a sweep, a test)
POSIX locks do not conflict, so this module also remembers the directories it holds.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from fl_lightning.errors import RunDirInUseError

LOCK_NAME = ".fit.lock"
_held: dict[str, dict] = {}  # lock files this process holds -> their owner


@contextmanager
def run_dir_lock(run_dir: str | Path) -> Iterator[Path]:
    """Hold ``run_dir``'s lock for the block (the folder is created if need be); raises
    ``RunDirInUseError`` naming the other fit when it is held elsewhere."""
    path = Path(run_dir).resolve() / LOCK_NAME
    if str(path) in _held:
        raise RunDirInUseError(_in_use(run_dir, _held[str(path)], "another fit in this process"))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, _held[str(path)] = _acquire(path, run_dir)
    try:
        yield path
    finally:
        del _held[str(path)]
        path.unlink(missing_ok=True)  # while still locked: a waiting fit then locks a fresh file
        os.close(fd)  # releases the lock


def _acquire(path: Path, run_dir) -> tuple[int, dict]:
    """(the locked file's descriptor, the owner written into it)."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            owner = os.pread(fd, 4096, 0)
            os.close(fd)
            raise RunDirInUseError(_in_use(run_dir, _parse(owner), "another fit")) from None
        try:
            current = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            current = False
        if current:  # else its owner removed it between our open and lock: lock the new one
            break
        os.close(fd)
    owner = _owner()
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(owner).encode(), 0)
    return fd, owner


def _owner() -> dict:
    command = " ".join(["python", *getattr(sys, "orig_argv", sys.argv)[1:]])
    return {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": command if len(command) <= 300 else command[:299] + "…"}


def _parse(data: bytes) -> dict:
    try:
        owner = json.loads(data.decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return owner if isinstance(owner, dict) else {}


def _in_use(run_dir, owner: dict, who: str) -> str:
    if owner.get("pid") is None:  # locked, its owner not written yet
        holder = f"{who} (process not yet named in {Path(run_dir) / LOCK_NAME})"
    else:
        holder = (f"{who}: process {owner['pid']} on {owner.get('host', '?')}, started {owner.get('started', '?')}"
                  + (f" ({owner['command']})" if owner.get("command") else ""))
    return (f"run.dir={str(run_dir)!r} is in use by {holder}; wait for it to end, stop it, "
            f"or choose another run.dir")
