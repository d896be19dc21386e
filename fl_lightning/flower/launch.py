"""Start a whole Flower federation on this machine and run fl_lightning on it:

    python -m fl_lightning.flower.launch --config configs/flower_fedova_fmnist.yaml --clients 5

One SuperLink, ``--clients`` SuperNodes (``partition-id`` 0..N-1, one process each), then
``flwr run deploy/flower`` with the config; the processes are stopped at the end. On
several machines, start the same three commands by hand (docs/flower.md)."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]
APP_DIR = ROOT / "deploy" / "flower"


class LocalFederation:
    """A SuperLink and N SuperNodes on localhost, as subprocesses (a context manager)."""

    def __init__(self, clients: int, port: int = 19091, workdir: Optional[str] = None, threads: int = 1,
                 warm: bool = True) -> None:
        self.clients, self.port, self.threads, self.warm = clients, port, threads, warm
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="fl_lightning_flower_")).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.home = self.workdir / "flwr_home"
        self.superlink: Optional[subprocess.Popen] = None
        self.supernodes: list[subprocess.Popen] = []
        self.superexecs: list[subprocess.Popen] = []  # warm: one per SuperNode

    def env(self) -> dict:
        env = dict(os.environ, FLWR_HOME=str(self.home), OMP_NUM_THREADS=str(self.threads),
                   FLWR_TELEMETRY_ENABLED="0", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
        return env

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "w")
        return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=self.env(), cwd=self.workdir,
                                start_new_session=True)  # own process group: a kill takes its ClientApps too

    def start(self) -> "LocalFederation":
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "local-deployment"\n\n[superlink.local-deployment]\n'
            f'address = "127.0.0.1:{self.port}"\ninsecure = true\n')
        bin_dir = Path(sys.executable).parent
        self.superlink = self._spawn("superlink", [str(bin_dir / "flower-superlink"), "--insecure",
                                                   "--host", "127.0.0.1", "--port", str(self.port),
                                                   *(["--isolation", "process"] if self.warm else [])])
        if self.warm:
            self.superexecs.append(self._warm_superexec("superexec_superlink", self.port, self.superlink))
        self._wait_for_superlink(timeout=120)
        for k in range(self.clients):
            runtime_port = self.port + 10 + k
            self.supernodes.append(self._spawn(f"supernode{k}", [
                str(bin_dir / "flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{self.port}",
                "--port", str(runtime_port), "--node-config", f"partition-id={k}",
                *(["--isolation", "process"] if self.warm else [])]))
            if self.warm:
                self.superexecs.append(self._warm_superexec(f"superexec{k}", runtime_port, self.supernodes[-1]))
        return self

    def _warm_superexec(self, name: str, runtime_port: int, owner: subprocess.Popen) -> subprocess.Popen:
        """Our SuperExec beside a SuperLink or SuperNode started with ``--isolation process``:
        its app processes are forked from a zygote that imported torch and Lightning once."""
        return self._spawn(name, [sys.executable, "-m", "fl_lightning.flower.warm_superexec", "--insecure",
                                  "--runtime-api-address", f"127.0.0.1:{runtime_port}", "--parent-pid", str(owner.pid)])

    def _wait_for_superlink(self, timeout: float) -> None:
        """Until the SuperLink accepts connections (``flwr run`` before that fails at once)."""
        import socket

        deadline = time.monotonic() + timeout
        while True:
            if self.superlink.poll() is not None:
                raise RuntimeError(f"the SuperLink exited ({self.superlink.returncode}); see {self.workdir / 'superlink.log'}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the SuperLink did not listen on 127.0.0.1:{self.port} within {timeout:g} s")
                time.sleep(0.2)

    def submit(self, config: str, overrides: str = "", wait_nodes_s: float = 120) -> subprocess.Popen:
        """``flwr run`` of the app with this run config, in the background; its log streams
        to run.log. Relative paths in the config resolve against this process's folder."""
        run_config = (f"config='{Path(config).resolve()}' overrides='{overrides}' wait-nodes-s={wait_nodes_s} "
                      f"cwd='{Path.cwd()}'")
        log = open(self.workdir / "run.log", "a")
        return subprocess.Popen([str(Path(sys.executable).parent / "flwr"), "run", str(APP_DIR), "local-deployment",
                                 "--stream", "--run-config", run_config], stdout=log, stderr=subprocess.STDOUT,
                                env=self.env(), cwd=ROOT)

    def run(self, config: str, overrides: str = "", timeout: float = 3600, wait_nodes_s: float = 120) -> int:
        return self.submit(config, overrides, wait_nodes_s).wait(timeout=timeout)

    def kill_client(self, k: int) -> None:
        """SIGKILL SuperNode k and everything it started (a client machine going away)."""
        for proc in [self.supernodes[k], *self.superexecs[k + 1:k + 2]]:  # [0] is the SuperLink's
            os.killpg(proc.pid, signal.SIGKILL)

    def stop(self) -> None:
        for proc in [*self.superexecs, *self.supernodes, self.superlink]:
            if proc is not None and proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for proc in [*self.superexecs, *self.supernodes, self.superlink]:
            if proc is not None:
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)

    def __enter__(self) -> "LocalFederation":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="the run's YAML (as for python -m fl_lightning fit)")
    parser.add_argument("--clients", type=int, required=True, help="SuperNodes to start (= partition.num_clients)")
    parser.add_argument("--overrides", default="", help='extra settings, e.g. "--federation.rounds 3"')
    parser.add_argument("--port", type=int, default=19091, help="SuperLink port; SuperNodes use port+10+k")
    parser.add_argument("--workdir", default=None, help="logs and FLWR_HOME (default: a new temporary folder)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per client process")
    parser.add_argument("--cold", action="store_true",
                        help="Flower's own SuperExec: every ClientApp process imports torch and Lightning afresh "
                             "(default: forked from a warm zygote, fl_lightning.flower.warm_superexec)")
    args = parser.parse_args(argv)
    if shutil.which("flwr", path=str(Path(sys.executable).parent)) is None:
        parser.error("flwr is not installed in this environment: pip install 'flwr[simulation]==1.42.0'")
    import shlex

    from fl_lightning.settings import build_federation

    _, _, planned = build_federation(["fit", "--config", args.config, *shlex.split(args.overrides)])
    if planned.partition.num_clients != args.clients:
        parser.error(f"--clients {args.clients} but the config's partition.num_clients is "
                     f"{planned.partition.num_clients}: one SuperNode per client")
    summary = Path(planned.run_dir).resolve() / "summary.json"
    with LocalFederation(args.clients, args.port, args.workdir, args.threads, warm=not args.cold) as federation:
        print(f"SuperLink on 127.0.0.1:{args.port}, {args.clients} SuperNodes; logs in {federation.workdir}", flush=True)
        started = time.time()
        code = federation.run(args.config, args.overrides)
        elapsed = time.time() - started
    # `flwr run --stream` exits 0 even when the ServerApp raised: a fresh summary.json is the proof.
    if code == 0 and not (summary.is_file() and summary.stat().st_mtime >= started):
        code = 1
    print(f"run {'finished' if code == 0 else 'FAILED'} after {elapsed:.1f} s (summary: {summary}); "
          f"log: {federation.workdir / 'run.log'}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
