"""A SuperExec whose ClientApp processes start warm:

    flower-supernode ... --isolation process --port 9094
    python -m fl_lightning.flower.warm_superexec --runtime-api-address 127.0.0.1:9094 --insecure

Flower runs every message in a fresh ``flwr-clientapp`` process (its isolation model), and each
one imports torch and Lightning before it trains: 5-7 s of CPU per message, more than a small
client's training. This SuperExec keeps Flower's model (one process per message, nothing shared
between messages) but starts each process by ``fork`` from a *zygote* that imported torch,
Lightning and fl_lightning once: the child runs Flower's own ``run_clientapp`` and exits.

The zygote is forked before the SuperExec starts any thread, and forks its children from a
single thread (forking a threaded process can leave locks held in the child). Task types other
than ClientApp are started as Flower's SubprocessExecutor starts them.
"""

from __future__ import annotations

import argparse
import os
import json
import signal
import struct
import sys
from typing import Optional

WARM_IMPORTS = ("torch", "lightning.pytorch", "fl_lightning.flower.client_app", "fl_lightning.flower.server_app",
                "fl_lightning.settings")


def _read_exact(fd: int, n: int) -> Optional[bytes]:
    data = b""
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _run_app(request: dict) -> None:
    """What ``flwr-clientapp`` / ``flwr-serverapp`` run after parsing their arguments."""
    certificates = None
    if request["root_certificates_path"]:
        from flwr.supercore.tls import validate_and_resolve_root_certificates

        certificates = validate_and_resolve_root_certificates(request["root_certificates_path"], request["insecure"])
    common = dict(runtime_api_address=request["runtime_api_address"], token=request["token"],
                  insecure=request["insecure"], certificates=certificates, parent_pid=request["parent_pid"],
                  runtime_dependency_install=request["runtime_dependency_install"])
    if request["task_type"] == "clientapp":
        from flwr.supernode.runtime.run_clientapp import run_clientapp

        run_clientapp(**common)
        return
    from queue import Queue

    from flwr.superlink.runtime.run_serverapp import run_serverapp
    from flwr.supercore.logger import mirror_output_to_queue, restore_output

    log_queue: Queue = Queue()  # the ServerApp's output streams to `flwr run --stream` from it
    mirror_output_to_queue(log_queue)
    try:
        run_serverapp(log_queue=log_queue, **common)
    finally:
        restore_output()


def zygote(requests_fd: int) -> None:
    """Import once, then read launch requests; fork one child per request that runs the app
    and exits (requests sent meanwhile wait in the pipe)."""
    import importlib

    for name in WARM_IMPORTS:  # every child starts with these imported
        importlib.import_module(name)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    while True:
        header = _read_exact(requests_fd, 4)
        if header is None:  # the SuperExec is gone
            os._exit(0)
        request = json.loads(_read_exact(requests_fd, struct.unpack("!I", header)[0]))
        if os.fork() == 0:
            os.close(requests_fd)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            code = 0
            try:
                _run_app(request)
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else 1
            except BaseException:  # noqa: BLE001 - reported like a crashed flwr-clientapp process
                import traceback

                traceback.print_exc()
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)


class ForkExecutor:
    """Flower's executor protocol: ClientApps and ServerApps from the zygote, other task types
    as subprocesses."""

    def __init__(self, requests_fd: int) -> None:
        from flwr.supercore.superexec.executor.subprocess_executor import SubprocessExecutor

        self.requests_fd, self.fallback = requests_fd, SubprocessExecutor()

    def get_eligible_capacity(self, supported_task_types, **kwargs):
        return self.fallback.get_eligible_capacity(supported_task_types, **kwargs)

    def wait_for_capacity(self, task_type=None, **kwargs) -> None:
        self.fallback.wait_for_capacity(task_type, **kwargs)

    def launch(self, spec):
        from flwr.supercore.constant import TaskType
        from flwr.supercore.superexec.executor.types import LaunchResult

        if spec.task_type not in (TaskType.CLIENT_APP, TaskType.SERVER_APP):
            return self.fallback.launch(spec)
        kind = "clientapp" if spec.task_type == TaskType.CLIENT_APP else "serverapp"
        request = json.dumps({"task_type": kind, **{k: getattr(spec, k) for k in (
            "runtime_api_address", "token", "insecure", "root_certificates_path", "parent_pid",
            "runtime_dependency_install")}}).encode()
        try:
            os.write(self.requests_fd, struct.pack("!I", len(request)) + request)
        except OSError as error:
            return LaunchResult.failed(f"the warm ClientApp zygote is gone: {error}")
        return LaunchResult.accepted()

    def close(self) -> None:
        self.fallback.close()

    def reconcile(self) -> None:
        self.fallback.reconcile()


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runtime-api-address", required=True,
                        help="the SuperNode's Runtime API, host:port (its --host and --port)")
    parser.add_argument("--insecure", action="store_true")
    parser.add_argument("--root-certificates", default=None)
    parser.add_argument("--parent-pid", type=int, default=None, help="stop when this process exits")
    args = parser.parse_args(argv)
    read_fd, write_fd = os.pipe()
    if os.fork() == 0:  # before Flower starts any thread here
        os.close(write_fd)
        zygote(read_fd)
    os.close(read_fd)

    from flwr.supercore.superexec import run_superexec as flower

    flower.get_executor = lambda *a, **k: ForkExecutor(write_fd)  # Flower's main loop, our launcher
    flower.run_superexec(runtime_api_address=args.runtime_api_address, insecure=args.insecure,
                         root_certificates_path=args.root_certificates, parent_pid=args.parent_pid)


if __name__ == "__main__":
    main()
