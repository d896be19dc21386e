"""fl_lightning on Flower's Deployment Runtime, on localhost: a SuperLink and 3 SuperNodes
(separate processes, each holding only its partition) give the same final model as the
in-process loop, and a SuperNode killed mid-run is dropped from its round by id (in one run)."""

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


# Round 2 waits this long for the killed client; long enough for a healthy client's round
# (a ClientApp process per message) on two busy cores.
CLIENT_TIMEOUT = 45
RUN = f"--run.checkpoint_every 1 --federation.client_timeout {CLIENT_TIMEOUT} --federation.min_clients 2"


def test_flower_localhost_equals_in_process_and_drops_a_killed_client(tmp_path, monkeypatch):
    """One Flower run: 3 SuperNodes train round 1, SuperNode 2 is killed, round 2 completes from
    the other two. It equals, bit for bit, the in-process run in which client 2 fails in round 2."""
    import fl_lightning.client as client_module

    config = tmp_path / "run.yaml"
    config.write_text(CONFIG.replace("RUN_DIR", str(tmp_path / "flower")))
    real_train = client_module.train_client

    def client_2_gone_in_round_2(ctx, task, indices, round_index):
        if task.client_id == 2 and round_index == 2:
            raise ConnectionError("client 2 went away")
        return real_train(ctx, task, indices, round_index)

    with monkeypatch.context() as patch:
        patch.setattr(client_module, "train_client", client_2_gone_in_round_2)
        reference = main(["fit", "--config", str(config), "--run.dir", str(tmp_path / "in_process"), *RUN.split()])
    flower = tmp_path / "flower"
    with LocalFederation(3, port=free_port_block(), workdir=str(tmp_path / "flwr")) as federation:
        run = federation.submit(str(config), RUN)
        deadline = time.monotonic() + 300
        while not (flower / "checkpoints" / "last.ckpt").exists():  # round 1 is done
            assert run.poll() is None and time.monotonic() < deadline, (tmp_path / "flwr" / "run.log").read_text()[-3000:]
            time.sleep(0.2)
        federation.kill_client(2)
        assert run.wait(timeout=300) == 0, (tmp_path / "flwr" / "run.log").read_text()[-3000:]

    on_flower = json.loads((flower / "summary.json").read_text())
    for key in ("test/accuracy", "train/loss", "bytes/up", "bytes/down", "clients", "clients/failed"):
        assert [m[key] for m in on_flower["history"]] == [m[key] for m in reference["history"]], key
    first, last = on_flower["history"]
    assert first["clients"] == 3 and first["clients/failed"] == 0 and "failures" not in first
    assert last["clients"] == 2 and last["clients/failed"] == 1
    assert last["failures"].startswith("client 2: ")  # no reply in time (or Flower: node unavailable)
    flower_state, local_state = state(flower), state(tmp_path / "in_process")
    assert all(torch.equal(flower_state[k], local_state[k]) for k in local_state)  # bit for bit


def test_codec_round_trips_tasks_and_results_and_refuses_python_objects():
    from fl_lightning.flower.codec import decode_reply, decode_task, encode_failure, encode_result, encode_task
    from fl_lightning.strategies.base import ClientResult, ClientTask

    task = ClientTask(4, "classifier", {"w": torch.randn(3, 2)}, (1, 7), prox_mu=0.01,
                      control={"w": torch.ones(3, 2)}, client_control={"w": torch.zeros(3, 2)}, epochs=2)
    back, round_index = decode_task(encode_task(task, 6))
    assert round_index == 6 and back.classes == (1, 7) and back.prox_mu == 0.01 and back.epochs == 2
    assert torch.equal(back.params["w"], task.params["w"]) and torch.equal(back.control["w"], task.control["w"])
    assert back.global_gradient is None and back.optimizer == task.optimizer and back.knowledge_transfer is None
    from fl_lightning.knowledge_transfer import KnowledgeTransferConfig

    party = ClientTask(2, "knowledge_transfer", {}, num_classes=10, knowledge_transfer=KnowledgeTransferConfig(3, 4, 7))
    back, _ = decode_task(encode_task(party, 1))
    assert back.knowledge_transfer == KnowledgeTransferConfig(3, 4, 7) and back.num_classes == 10 and back.params == {}
    result = ClientResult(4, {"w": torch.randn(3, 2)}, 12, (1, 7), 0.25, 9, {"w": torch.ones(3, 2)})
    decoded, reason = decode_reply(encode_result(result))
    assert reason is None and decoded.num_samples == 12 and torch.equal(decoded.params["w"], result.params["w"])
    assert decode_reply(encode_failure(4, "disk full")) == (None, "disk full")
    with pytest.raises(ValueError, match="in process"):
        encode_task(ClientTask(0, "classifier", {}, network=torch.nn.Linear(1, 1)), 1)


def test_run_settings_fall_back_to_the_environment_for_the_simulation_engine(monkeypatch):
    from types import SimpleNamespace

    from fl_lightning.flower.codec import run_setting

    context = SimpleNamespace(run_config={"config": "a.yaml"})
    monkeypatch.setenv("FL_LIGHTNING_FLOWER_OVERRIDES", "--federation.rounds 2")
    assert run_setting(context, "config") == "a.yaml"
    assert run_setting(context, "overrides") == "--federation.rounds 2"
    assert run_setting(context, "wait-nodes-s", 300) == 300
    with pytest.raises(ValueError, match="cwd"):
        run_setting(context, "cwd")
