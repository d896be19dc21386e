"""fl_lightning on Flower's Deployment Runtime, on localhost: a SuperLink and 3 SuperNodes
(separate processes, each holding only its partition) give the same final model as the
in-process loop, and a SuperNode killed mid-run is dropped from its round by id."""

import json
import random
import socket
import time

import pytest
import torch

pytest.importorskip("flwr")

from fl_lightning.cli import main  # noqa: E402
from fl_lightning.flower.launch import LocalFederation  # noqa: E402

CONFIG = """
data: {name: synthetic, synthetic_size: 600}
partition: {scheme: num_labels, num_clients: 3, labels_per_client: 2}
federation: {rounds: 2, client_fraction: 1.0, local_epochs: 1, batch_size: 10, final_window: 1}
trainer: {threads: 1}
run: {dir: RUN_DIR, logger: none, progress: true}
"""


def free_port_block(width: int = 20) -> int:
    for _ in range(50):
        base = random.randint(20000, 40000)
        try:
            for port in (base, *range(base + 10, base + 10 + width)):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError("no free port block")


def state(run_dir):
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state"]


def test_flower_localhost_equals_in_process_and_drops_a_killed_client(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(CONFIG.replace("RUN_DIR", str(tmp_path / "flower")))
    reference = main(["fit", "--config", str(config), "--run.dir", str(tmp_path / "in_process")])
    with LocalFederation(3, port=free_port_block(), workdir=str(tmp_path / "flwr")) as federation:
        assert federation.run(str(config), timeout=600) == 0, (tmp_path / "flwr" / "run.log").read_text()[-3000:]
        on_flower = json.loads((tmp_path / "flower" / "summary.json").read_text())
        assert [m["test/accuracy"] for m in on_flower["history"]] == [m["test/accuracy"] for m in reference["history"]]
        assert [m["bytes/up"] for m in on_flower["history"]] == [m["bytes/up"] for m in reference["history"]]
        flower_state, local_state = state(tmp_path / "flower"), state(tmp_path / "in_process")
        assert all(torch.equal(flower_state[k], local_state[k]) for k in local_state)  # bit for bit

        # A client machine dies after round 1: round 2 completes from the other two.
        killed = tmp_path / "killed"
        run = federation.submit(str(config), f"--run.dir {killed} --run.checkpoint_every 1 "
                                             "--federation.client_timeout 20 --federation.min_clients 2")
        deadline = time.monotonic() + 300
        while not (killed / "checkpoints" / "last.ckpt").exists():
            assert run.poll() is None and time.monotonic() < deadline, (tmp_path / "flwr" / "run.log").read_text()[-3000:]
            time.sleep(0.2)
        federation.kill_client(2)
        assert run.wait(timeout=300) == 0
    summary = json.loads((killed / "summary.json").read_text())
    last = summary["history"][-1]
    assert summary["rounds"] == 2 and last["clients"] == 2 and last["clients/failed"] == 1
    assert "client 2:" in last["failures"]
