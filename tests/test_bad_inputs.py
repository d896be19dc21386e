"""Bad input, table-driven: each row is answered by a message naming the problem, a non-zero
exit status and nothing half-written in the run directory (no summary.json, no checkpoint,
no temporary file).

Rows run ``cli.run`` (what ``python -m fl_lightning`` runs, without its ~5 s of imports);
rows marked ``subprocess=True`` run the real ``python -m fl_lightning``. To add a row, append
a ``Bad`` to ``BAD_INPUTS``: ``args`` are fit overrides on top of the tiny synthetic run, with
``{tmp}`` (the test's folder) and ``{ckpt}`` (a valid checkpoint of the tiny run) filled in,
and ``prepare`` writes any files the row needs under ``{tmp}`` (or starts a process the row
needs, such as a fit holding ``{tmp}/run``: its PID fills ``{holder}`` in ``message``). A row
with ``nothing_written`` is refused before the run directory holds any file."""

from __future__ import annotations

import json
import os
import pickle
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import pytest
import torch

from fl_lightning import cli
from fl_lightning.errors import RunDirInUseError
from fl_lightning.run_lock import LOCK_NAME, run_dir_lock
from tests.conftest import tiny_args

REPO = Path(__file__).resolve().parents[1]
MARKER = "PWNED"  # the malicious checkpoints' payload would create this file in {tmp}


@dataclass
class Bad:
    id: str
    args: list[str]
    message: tuple[str, ...]  # each must appear in stderr
    prepare: Optional[Callable[[Path, Path], None]] = None  # (tmp, valid checkpoint) -> None
    command: str = "fit"
    status: Optional[int] = None  # the exact exit status, where it matters (2: argument errors)
    subprocess: bool = False
    nothing_written: bool = False  # refused at setup: not even partition.csv


# ---- files the rows prepare ---------------------------------------------------------------

def text_file(name, text):
    def prepare(tmp, ckpt):
        (tmp / name).write_text(text)
    return prepare


def idx_files(images=(12, 28, 28), labels=12, truncate_images=False, label_values=None):
    """Fashion-MNIST's four idx files under {tmp}/data/FashionMNIST/raw, with their shapes as given."""
    def prepare(tmp, ckpt):
        raw = tmp / "data" / "FashionMNIST" / "raw"
        raw.mkdir(parents=True)
        rng = np.random.default_rng(0)
        for prefix in ("train", "t10k"):
            pixels = rng.integers(0, 256, size=images, dtype=np.uint8).tobytes()
            if truncate_images:
                pixels = pixels[: len(pixels) // 2]
            (raw / f"{prefix}-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 2051, *images) + pixels)
            values = np.arange(labels) % 10 if label_values is None else np.full(labels, label_values)
            (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 2049, labels)
                                                             + values.astype(np.uint8).tobytes())
    return prepare


def truncated_checkpoint(tmp, ckpt):
    data = ckpt.read_bytes()
    (tmp / "cut.ckpt").write_bytes(data[: len(data) // 2])


class Payload:
    """Unpickling this runs code: it creates {tmp}/PWNED."""

    def __init__(self, folder):
        self.folder = str(folder)

    def __reduce__(self):
        return (os.system, (f"touch {self.folder}/{MARKER}",))


def malicious_checkpoint(tmp, ckpt):
    """A valid checkpoint's content plus a payload, saved the torch.save way (a zip archive)."""
    content = torch.load(ckpt, weights_only=True)
    content["history"] = [Payload(tmp)]
    torch.save(content, tmp / "evil.ckpt")


def malicious_raw_pickle(tmp, ckpt):
    (tmp / "evil.pkl").write_bytes(pickle.dumps({"round": Payload(tmp)}, protocol=2))


def plain_tensor_file(tmp, ckpt):
    torch.save(torch.zeros(3), tmp / "tensor.pt")


HOLDERS: list[subprocess.Popen] = []  # processes holding a run.dir's lock, stopped after each test
HOLD_LOCK = ("import sys\nfrom fl_lightning.run_lock import run_dir_lock\n"
             "with run_dir_lock(sys.argv[1]):\n    print('held', flush=True)\n    sys.stdin.read()\n")


def fit_in_progress(tmp, ckpt):
    """Another process holds {tmp}/run's lock, as a running fit does."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(tmp / "run")], cwd=REPO, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    HOLDERS.append(holder)
    assert holder.stdout.readline().strip() == "held"


@pytest.fixture(autouse=True)
def _stop_holders():
    yield
    while HOLDERS:
        holder = HOLDERS.pop()
        holder.stdin.close()  # it leaves its block: the lock is released and its file removed
        holder.wait(timeout=30)


OFFLINE_FMNIST = ["--data.name", "fashion_mnist", "--data.offline_roots", "[]"]

BAD_INPUTS = [
    # settings: names and types (the parser: exit status 2)
    Bad("unknown key on the command line", ["--federation.roundz", "3"], ("roundz",), status=2),
    Bad("unknown key in the config file", ["--config", "{tmp}/bad.yaml"], ("federation.roundz",), status=2,
        prepare=text_file("bad.yaml", "federation:\n  roundz: 3\n")),
    Bad("unknown group in the config file", ["--config", "{tmp}/bad.yaml"], ("optimiser",), status=2,
        prepare=text_file("bad.yaml", "optimiser:\n  lr: 0.1\n")),
    Bad("wrong type on the command line", ["--federation.rounds", "three"], ("federation.rounds", "three"), status=2),
    Bad("wrong type in the config file", ["--config", "{tmp}/bad.yaml"], ("federation.client_fraction", "lots"),
        status=2, prepare=text_file("bad.yaml", "federation:\n  client_fraction: lots\n")),
    Bad("value outside a choice", ["--partition.scheme", "noniid"], ("partition.scheme", "noniid"), status=2),
    Bad("config file that does not exist", ["--config", "{tmp}/nowhere.yaml"], ("nowhere.yaml", "does not exist"),
        status=2),
    Bad("config file that is not YAML", ["--config", "{tmp}/bad.yaml"], ("bad.yaml", "not valid YAML", "line 1"), status=2,
        prepare=text_file("bad.yaml", "federation: [1, 2\n")),
    # settings: impossible values
    Bad("C = 0", ["--federation.client_fraction", "0"], ("federation.client_fraction=0.0", "(0, 1]")),
    Bad("C < 0", ["--federation.client_fraction", "-0.5"], ("federation.client_fraction=-0.5", "(0, 1]")),
    Bad("C > 1", ["--federation.client_fraction", "1.5"], ("federation.client_fraction=1.5", "(0, 1]"),
        subprocess=True),
    Bad("K*C < 1", ["--federation.client_fraction", "0.05"],
        ("federation.client_fraction=0.05 x partition.num_clients=10", "less than one client")),
    Bad("K < 1", ["--partition.num_clients", "0"], ("partition.num_clients=0",)),
    Bad("l larger than the number of classes", ["--partition.labels_per_client", "11"],
        ("partition.labels_per_client=11", "[1, 10]")),
    Bad("l not dividing the shards", ["--partition.num_clients", "7"],
        ("labels_per_client=2 x partition.num_clients=7", "not divisible")),
    Bad("#C=k larger than the number of classes", ["--partition.scheme", "num_labels", "--partition.labels_per_client",
                                                    "12"], ("partition.labels_per_client=12",)),
    Bad("Dirichlet beta = 0", ["--partition.scheme", "dirichlet", "--partition.dirichlet_beta", "0"],
        ("partition.dirichlet_beta=0.0", "> 0")),
    Bad("Dirichlet beta < 0", ["--partition.scheme", "dirichlet", "--partition.dirichlet_beta", "-1"],
        ("partition.dirichlet_beta=-1.0", "> 0")),
    Bad("E < 1", ["--federation.local_epochs", "0"], ("federation.local_epochs=0", ">= 1")),
    Bad("B < 0", ["--federation.batch_size", "-1"], ("federation.batch_size=-1", ">= 0")),
    Bad("T < 0", ["--federation.rounds", "-1"], ("federation.rounds=-1", ">= 0")),
    Bad("a client with no samples", ["--partition.scheme", "dirichlet", "--partition.dirichlet_beta", "0.01",
                                     "--partition.min_samples", "0"], ("clients with no samples", "clients [0, 7]")),
    # data
    Bad("missing data root", [*OFFLINE_FMNIST, "--data.root", "{tmp}/nowhere"],
        ("data.root=", "nowhere", "does not exist", "data.download=true")),
    Bad("empty data root", [*OFFLINE_FMNIST, "--data.root", "{tmp}/empty"], ("data.root=", "empty'", "is empty"),
        prepare=lambda tmp, ckpt: (tmp / "empty").mkdir()),
    Bad("data file of the wrong image shape", [*OFFLINE_FMNIST, "--data.root", "{tmp}/data"],
        ("FashionMNIST/raw", "shape (12, 1, 20, 20)", "expected (N, 1, 28, 28)"), prepare=idx_files(images=(12, 20, 20))),
    Bad("data file with fewer labels than images", [*OFFLINE_FMNIST, "--data.root", "{tmp}/data"],
        ("FashionMNIST/raw", "12 training images but labels of shape (11,)"), prepare=idx_files(labels=11)),
    Bad("truncated data file", [*OFFLINE_FMNIST, "--data.root", "{tmp}/data"],
        ("FashionMNIST/raw", "cannot be read"), prepare=idx_files(truncate_images=True)),
    Bad("labels outside the classes", [*OFFLINE_FMNIST, "--data.root", "{tmp}/data"],
        ("training labels", "span 12..12", "expected 0..9"), prepare=idx_files(label_values=12)),
    # checkpoints
    Bad("checkpoint that does not exist", ["--ckpt_path", "{tmp}/nowhere.ckpt"], ("nowhere.ckpt", "does not exist")),
    Bad("truncated checkpoint", ["--ckpt_path", "{tmp}/cut.ckpt"], ("cut.ckpt", "truncated or corrupt"),
        prepare=truncated_checkpoint),
    Bad("checkpoint of another architecture", ["--ckpt_path", "{ckpt}", "--model.architecture", "logistic"],
        ("other settings", "model.architecture", "'fashion_cnn'", "'logistic'")),
    Bad("checkpoint of another algorithm", ["--ckpt_path", "{ckpt}", "--algorithm", "FedAvg"],
        ("other settings", "algorithm.class_path", "FedOVA", "FedAvg")),
    Bad("checkpoint carrying a malicious pickle", ["--ckpt_path", "{tmp}/evil.ckpt"],
        ("evil.ckpt", "weights_only=True", "refuses", "system"), prepare=malicious_checkpoint, subprocess=True),
    Bad("raw pickle carrying a payload", ["--ckpt_path", "{tmp}/evil.pkl"], ("evil.pkl", "refuses", "system"),
        prepare=malicious_raw_pickle),
    Bad("torch file that is not a checkpoint", ["--ckpt_path", "{tmp}/tensor.pt"],
        ("tensor.pt", "not an fl_lightning checkpoint"), prepare=plain_tensor_file),
    Bad("test without a checkpoint", [], ("needs --ckpt_path",), command="test", status=2),
    Bad("test of a run that has no checkpoint", ["--ckpt_path", "last"], ("last.ckpt", "does not exist"),
        command="test"),
    # training
    Bad("NaN loss in training", ["--optimizer.lr", "1e6", "--federation.rounds", "2"],
        ("non-finite", "diverged", "optimizer.lr")),
    Bad("min_clients above the clients of a round", ["--federation.min_clients", "0", "--federation.rounds", "1"],
        ("federation.min_clients=0",)),
    # ATHENA-FL
    Bad("detector database URL that cannot be opened",
        ["--algorithm", "AthenaFL", "--algorithm.probe_architecture", "simple_cnn", "--algorithm.db_url",
         "sqlite:///{tmp}/no/such/folder/d.sqlite", "--partition.validation_fraction", "0.1",
         "--data.image_size", "32", "--model.architecture", "athena_cnn"],
        ("sqlite:///", "no/such/folder", "cannot be opened")),
    Bad("ATHENA-FL without a validation split", ["--algorithm", "AthenaFL", "--data.image_size", "32",
                                                 "--model.architecture", "athena_cnn"],
        ("partition.validation_fraction",)),
    # FedKT
    Bad("FedKT with no teachers", ["--algorithm", "FedKT", "--algorithm.teachers", "0"],
        ("algorithm.teachers=0", ">= 1")),
    # found by trying the CLI as a new user would (issue 16)
    Bad("second fit into a run.dir in use", [], ("run.dir=", "run'", "is in use by another fit", "process {holder}"),
        prepare=fit_in_progress),
    Bad("negative learning rate", ["--optimizer.lr", "-0.1"], ("optimizer.lr=-0.1", "> 0"), nothing_written=True),
    Bad("architecture too deep for the image size", ["--model.architecture", "vgg11"],
        ("vgg11", "at least 32x32", "got 28x28", "data.image_size"), nothing_written=True),
]


@pytest.fixture(scope="module")
def valid_checkpoint(tmp_path_factory):
    run = tmp_path_factory.mktemp("valid")
    cli.main(["fit", *tiny_args(run, "--federation.rounds", "1")])
    return run / "checkpoints" / "last.ckpt"


def exit_status(argv):
    try:
        return cli.run(argv)
    except SystemExit as stop:  # the parser's errors
        return stop.code


def test_the_table_is_long_enough():
    assert len(BAD_INPUTS) >= 20 and len({b.id for b in BAD_INPUTS}) == len(BAD_INPUTS)


@pytest.mark.parametrize("bad", BAD_INPUTS, ids=[b.id for b in BAD_INPUTS])
def test_bad_input_is_named_and_stops_the_run_cleanly(bad, tmp_path, valid_checkpoint, capsys):
    if bad.prepare:
        bad.prepare(tmp_path, valid_checkpoint)
    run_dir = tmp_path / "run"
    args = [a.format(tmp=tmp_path, ckpt=valid_checkpoint) for a in bad.args]
    argv = [bad.command, *tiny_args(run_dir), *args]
    if bad.subprocess:
        proc = subprocess.run([sys.executable, "-m", "fl_lightning", *argv], cwd=REPO, capture_output=True, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
        status, err = proc.returncode, proc.stderr
    else:
        status, err = exit_status(argv), capsys.readouterr().err

    assert status != 0 and (bad.status is None or status == bad.status), err[-2000:]
    for needle in bad.message:
        needle = needle.format(holder=HOLDERS[-1].pid if HOLDERS else None)
        assert needle in err, f"{needle!r} not in:\n{err[-2000:]}"
    assert "Traceback" not in err
    assert not (tmp_path / MARKER).exists(), "the checkpoint's payload ran"
    if run_dir.exists():  # nothing half-written: at most the partition table of a run that started
        left = sorted(p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*") if p.is_file())
        assert not [p for p in left if p.endswith((".ckpt", ".json")) or ".tmp" in p], left
        assert not (bad.nothing_written and left), left


def test_two_fits_into_one_run_dir_the_second_is_refused_and_a_dead_fit_s_lock_blocks_nothing(tmp_path, capsys):
    run = tmp_path / "run"
    lock = run / LOCK_NAME
    first = subprocess.Popen([sys.executable, "-m", "fl_lightning", "fit", *tiny_args(run, "--federation.rounds", "1000")],
                             cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        for _ in range(1200):  # until the first fit holds the lock (imports and setup take seconds)
            if lock.is_file() and f'"pid": {first.pid}' in lock.read_text():
                break
            assert first.poll() is None, "the first fit ended early"
            time.sleep(0.1)
        assert exit_status(["fit", *tiny_args(run, "--federation.rounds", "1")]) == 1
        err = capsys.readouterr().err
        assert f"run.dir={str(run)!r} is in use by another fit: process {first.pid}" in err and "-m fl_lightning fit" in err
        assert first.poll() is None  # the first fit goes on, untouched
    finally:
        first.kill()  # SIGKILL: its lock file stays behind, naming a dead process
        first.wait()

    assert lock.is_file()
    # the stale lock blocks nothing (overwrite: the killed fit may have left a checkpoint)
    assert exit_status(["fit", *tiny_args(run, "--federation.rounds", "1", "--run.overwrite", "true")]) == 0
    assert not lock.exists()  # released when the fit ends
    assert json.loads((run / "summary.json").read_text())["rounds"] == 1


def test_one_process_cannot_fit_twice_into_one_run_dir(tmp_path):
    with run_dir_lock(tmp_path / "run"):
        with pytest.raises(RunDirInUseError, match="in use by another fit in this process: process"):
            with run_dir_lock(tmp_path / "run"):
                pass
    with run_dir_lock(tmp_path / "run"):  # released
        pass
