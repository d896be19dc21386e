"""fl_lightning on Flower's Deployment Runtime, on localhost: a SuperLink and 3 SuperNodes
(separate processes, each holding only its partition) give the same final model as the
in-process loop, and a SuperNode killed mid-run is dropped from its round by id (in one run)."""

import json
import random
import socket
import time

import pytest
import torch

from fl_lightning.config import OptimizerConfig  # noqa: E402

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
# (a ClientApp process per message, forked warm: ~5 s) on two busy cores, with margin.
CLIENT_TIMEOUT = 30
RUN = f"--run.checkpoint_every 1 --federation.client_timeout {CLIENT_TIMEOUT} --federation.min_clients 2"


def test_flower_localhost_equals_in_process_and_drops_a_killed_client(tmp_path, monkeypatch):
    """One Flower run: 3 SuperNodes train round 1, SuperNode 2 is killed, round 2 completes from
    the other two. It equals, bit for bit, the in-process run in which client 2 fails in round 2."""
    import fl_lightning.client as client_module

    config = tmp_path / "run.yaml"
    config.write_text(CONFIG.replace("RUN_DIR", str(tmp_path / "flower")))
    real_train = client_module.train_client

    def client_2_gone_in_round_2(ctx, task, indices, round_index, client_state=None):
        if task.client_id == 2 and round_index == 2:
            raise ConnectionError("client 2 went away")
        return real_train(ctx, task, indices, round_index, client_state)

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


def test_codec_round_trips_every_task_kind_and_results():
    from fl_lightning.flower.codec import decode_reply, decode_task, encode_failure, encode_result, encode_task
    from fl_lightning.algorithms.fedkt.knowledge_transfer import KnowledgeTransferConfig, party_task
    from fl_lightning.algorithms.baselines.classifier import classifier_task
    from fl_lightning.algorithms.fimlbfgs.curvature import curvature_task
    from fl_lightning.algorithms.fedova.detectors import detector_task
    from fl_lightning.algorithms.fedov.open_set import OpenSetLoss, open_set_task
    from fl_lightning.strategy import ClientResult

    w = {"w": torch.randn(3, 2)}
    tasks = [
        classifier_task(4, w, OptimizerConfig("adam", 0.01), prox_mu=0.01, control={"w": torch.ones(3, 2)}, epochs=2,
                        architecture="mobilenet", num_outputs=10, classes=(1, 7), upload=("w",)),
        detector_task(3, {"w": torch.randn(2, 3, 2)}, (0, 5), OptimizerConfig(), "vmap"),
        open_set_task(1, w, OptimizerConfig(), 10, OpenSetLoss(pixel_mean=(0.5,), pixel_std=(0.25,))),
        curvature_task(2, w, (), fisher=False, keep_gradient=True),
        party_task(2, OptimizerConfig(), 10, KnowledgeTransferConfig(3, 4, 7)),
    ]
    for task in tasks:
        back, round_index = decode_task(encode_task(task, 6))
        assert round_index == 6 and (back.client_id, back.kind, back.settings) == (task.client_id, task.kind, task.settings)
        assert back.params.keys() == task.params.keys() and all(torch.equal(back.params[k], task.params[k]) for k in w
                                                                  if k in task.params)
        assert back.payload.keys() == task.payload.keys()
        assert back.sent_bytes() == task.sent_bytes()
    first, _ = decode_task(encode_task(tasks[0], 1))
    assert first.classes == (1, 7) and first.epochs == 2 and first.upload == ("w",) and first.optimizer.name == "adam"
    assert torch.equal(first.payload["control.w"], torch.ones(3, 2))
    result = ClientResult(4, {"w": torch.randn(3, 2)}, 12, (1, 7), 0.25, 9, {"control.w": torch.ones(3, 2)},
                          client_state={"control.w": torch.zeros(3, 2)})
    decoded, reason = decode_reply(encode_result(result))
    assert reason is None and decoded.num_samples == 12 and torch.equal(decoded.params["w"], result.params["w"])
    assert torch.equal(decoded.payload["control.w"], torch.ones(3, 2))
    assert decoded.client_state == {}  # what a client keeps never leaves it
    assert decode_reply(encode_failure(4, "disk full")) == (None, "disk full")


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


# Every algorithm's tasks travel as tensors + JSON: FedOV's open-set clients, FedKT's parties
# and ATHENA-FL's probe and detectors run on SuperNodes; SCAFFOLD's c_i and ATHENA-FL's kept Adam
# state stay on their nodes.
ALGORITHMS = {
    "fedov": "algorithm: FedOV\nmodel: {architecture: simple_cnn}\noptimizer: {name: adam, lr: 0.001}\n"
             "federation: {rounds: 1, client_fraction: 1.0, local_epochs: 1, batch_size: 20, final_window: 1}\n",
    "fedkt": "algorithm: {class_path: FedKT, init_args: {partitions: 1, teachers: 2, student_epochs: 1, final_epochs: 1}}\n"
             "model: {architecture: simple_cnn}\noptimizer: {name: adam, lr: 0.001}\n"
             "federation: {rounds: 1, client_fraction: 1.0, local_epochs: 1, batch_size: 20, final_window: 1}\n",
    "scaffold": "algorithm: SCAFFOLD\noptimizer: {lr: 0.01}\n"
                "federation: {rounds: 2, client_fraction: 0.67, local_epochs: 1, batch_size: 20, final_window: 1}\n",
    # with its code reading's kept Adam state: a detector's second round restores what its
    # SuperNode kept from the first
    "athena": "algorithm: {class_path: AthenaFL, init_args: {probe_architecture: simple_cnn}}\n"
              "model: {architecture: athena_cnn}\noptimizer: {name: adam, lr: 0.001, keep_state: true}\n"
              "data: {name: synthetic, synthetic_size: 600, image_size: 32}\n"
              "partition: {scheme: label_groups, num_clients: 3, labels_per_client: 5, validation_fraction: 0.1}\n"
              "federation: {rounds: 3, client_fraction: 1.0, local_epochs: 1, batch_size: 20, final_window: 1}\n",
}
BASE = ("data: {name: synthetic, synthetic_size: 600}\n"
        "partition: {scheme: num_labels, num_clients: 3, labels_per_client: 2}\n"
        "trainer: {threads: 1}\nrun: {dir: RUN_DIR, logger: none, progress: false}\n")


def test_every_algorithm_on_flower_equals_in_process(tmp_path):
    """FedOV (one-shot voting), FedKT (the parties' students), SCAFFOLD (client state kept
    on the SuperNodes) and ATHENA-FL (probe round, clustering, per-cluster detectors, database)
    on one SuperLink with 3 SuperNodes: the same final parameters and metrics as in process."""
    configs = {}
    for name, own in ALGORITHMS.items():
        text = BASE.replace("RUN_DIR", str(tmp_path / name / "flower"))
        configs[name] = tmp_path / f"{name}.yaml"
        configs[name].write_text(text + own)  # later keys win: the algorithm's own data/partition
    references = {}
    with LocalFederation(3, port=free_port_block(), workdir=str(tmp_path / "flwr")) as federation:
        # The four runs share the SuperLink and SuperNodes at once (as runs of several users
        # would); the in-process references are computed while they run.
        runs = {name: federation.submit(str(config)) for name, config in configs.items()}
        for name, config in configs.items():
            references[name] = main(["fit", "--config", str(config), "--run.dir", str(tmp_path / name / "in_process")])
        for name, run in runs.items():
            assert run.wait(timeout=600) == 0, (tmp_path / "flwr" / "run.log").read_text()[-3000:]
    for name, config in configs.items():
        reference = references[name]
        on_flower = json.loads((tmp_path / name / "flower" / "summary.json").read_text())
        for key in ("test/accuracy", "train/loss", "bytes/up", "bytes/down", "clients"):
            assert [m.get(key) for m in on_flower["history"]] == [m.get(key) for m in reference["history"]], (name, key)
        a, b = state(tmp_path / name / "flower"), state(tmp_path / name / "in_process")
        assert a.keys() == b.keys(), name
        for k in a:  # bit for bit; ATHENA-FL's "no accuracy yet" is NaN on both sides
            assert a[k].dtype == b[k].dtype and torch.equal(a[k].isnan() if a[k].is_floating_point() else a[k],
                                                            b[k].isnan() if b[k].is_floating_point() else b[k]), (name, k)
            assert torch.equal(torch.nan_to_num(a[k]), torch.nan_to_num(b[k])), (name, k)


def test_the_warm_superexec_forwards_app_launches_to_its_zygote_and_others_to_flower():
    """ClientApp and ServerApp launches go to the zygote as length-prefixed JSON (what it
    needs to run Flower's run_clientapp / run_serverapp); any other task type is started
    as Flower's SubprocessExecutor starts it."""
    import os
    import struct

    from flwr.supercore.constant import TaskType
    from flwr.supercore.superexec.executor.types import ExecutionSpec, LaunchResult

    from fl_lightning.flower.warm_superexec import ForkExecutor

    read_fd, write_fd = os.pipe()
    executor = ForkExecutor(write_fd)
    started = []
    executor.fallback.launch = lambda spec: started.append(spec.task_type) or LaunchResult.accepted()

    def spec(task_type, token):
        return ExecutionSpec(task_type=task_type, runtime_api_address="127.0.0.1:9094", token=token, insecure=True,
                             root_certificates_path=None, runtime_dependency_install=False, parent_pid=42,
                             suppress_output=False, task_id=7)

    for task_type, token in ((TaskType.CLIENT_APP, "ab"), (TaskType.SERVER_APP, "cd"), (TaskType.SIMULATION, "ef")):
        assert executor.launch(spec(task_type, token)).status == "accepted"
    os.close(write_fd)
    requests = []
    with os.fdopen(read_fd, "rb") as pipe:
        while header := pipe.read(4):
            requests.append(json.loads(pipe.read(struct.unpack("!I", header)[0])))
    common = {"runtime_api_address": "127.0.0.1:9094", "insecure": True, "root_certificates_path": None,
              "parent_pid": 42, "runtime_dependency_install": False}
    assert requests == [{"task_type": "clientapp", "token": "ab", **common},
                        {"task_type": "serverapp", "token": "cd", **common}]
    assert started == [TaskType.SIMULATION]
