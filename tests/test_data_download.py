"""``--data.download true`` on a clean machine that is online: a file server on 127.0.0.1 serves
tiny data sets in torchvision's exact formats, ``data.mirror`` points the download at it, and the
real command line trains on what it fetched. torchvision checks the md5 sums of what it
downloads; the served files are not the originals, so the tests give torchvision their sums."""

import functools
import hashlib
import io
import pickle
import tarfile
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from fl_lightning import cli
from fl_lightning.config import DataConfig
from fl_lightning.data import DataNotFoundError, load_dataset
from tests.conftest import tiny_args
from tests.test_data import write_idx_gz

IDX_GZ = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
          "t10k-labels-idx1-ubyte.gz")


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):  # no line per request in the test output
        pass


@pytest.fixture
def file_server(tmp_path):
    """(folder served, its base URL, the paths requested)."""
    served = tmp_path / "served"
    served.mkdir()
    requested = []

    class Recording(QuietHandler):
        def do_GET(self):
            requested.append(self.path)
            super().do_GET()

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Recording, directory=str(served)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield served, f"http://127.0.0.1:{server.server_address[1]}/", requested
    finally:
        server.shutdown()
        server.server_close()


def md5(path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def test_fit_downloads_fashion_mnist_from_a_mirror_and_later_runs_read_the_copy(tmp_path, file_server, monkeypatch,
                                                                               capsys):
    from torchvision.datasets import FashionMNIST

    served, url, requested = file_server
    write_idx_gz(served / "fmnist", n_train=60, n_test=20)
    for name in IDX_GZ:
        (served / "fmnist" / name).rename(served / name)
    monkeypatch.setattr(FashionMNIST, "resources", [(name, md5(served / name)) for name in IDX_GZ])
    root = tmp_path / "root"
    fit = ["fit", *tiny_args(tmp_path / "run", "--federation.rounds", "1"), "--data.name", "fashion_mnist",
           "--data.root", str(root)]

    assert cli.run([*fit, "--data.download", "true", "--data.mirror", url]) == 0, capsys.readouterr().err

    assert set(requested) == {f"/{name}" for name in IDX_GZ}  # torchvision asks twice: redirects, then the file
    assert sorted(p.name for p in (root / "FashionMNIST" / "raw").iterdir() if not p.name.endswith(".gz")) == \
        sorted(name[:-3] for name in IDX_GZ)
    requested.clear()
    assert cli.run([*fit, "--run.dir", str(tmp_path / "again")]) == 0  # offline now: data.root holds the copy
    assert requested == []


def test_a_download_that_fails_names_the_mirror_and_the_data_root(tmp_path, file_server, capsys):
    served, url, _ = file_server  # serves nothing: every file is a 404
    fit = ["fit", *tiny_args(tmp_path / "run"), "--data.name", "mnist", "--data.root", str(tmp_path / "root"),
           "--data.download", "true", "--data.mirror", url]

    assert cli.run(fit) == 1
    err = capsys.readouterr().err
    assert f"data.download=true could not fetch the files from data.mirror={url!r}" in err
    assert "data.root=" in err and "404" in err and "Traceback" not in err


def write_cifar_archive(path, per_batch=3):
    """cifar-10-python.tar.gz as torchvision downloads it: cifar-10-batches-py/ with five training
    batches, a test batch and batches.meta, each a pickle of (N, 3072) uint8 rows and labels."""
    rng = np.random.default_rng(0)
    with tarfile.open(path, "w:gz") as tar:
        def add(name, obj):
            data = pickle.dumps(obj)
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
            add(name, {"data": rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8),
                       "labels": list(range(per_batch))})
        add("batches.meta", {"label_names": [str(i) for i in range(10)]})


def test_cifar10_downloads_its_archive_from_a_mirror(tmp_path, file_server, monkeypatch):
    from torchvision.datasets import CIFAR10

    served, url, requested = file_server
    write_cifar_archive(served / "cifar-10-python.tar.gz")
    monkeypatch.setattr(CIFAR10, "tgz_md5", md5(served / "cifar-10-python.tar.gz"))
    cfg = DataConfig(name="cifar10", root=str(tmp_path / "root"), download=True, mirror=url,
                     check_integrity=False)  # the batches inside are not the originals either

    data = load_dataset(cfg)

    assert set(requested) == {"/cifar-10-python.tar.gz"}
    assert data.train_x.shape == (15, 3, 32, 32) and data.test_y.tolist() == [0, 1, 2]
    assert (tmp_path / "root" / "cifar-10-batches-py" / "data_batch_5").is_file()


def test_a_served_file_with_another_md5_is_refused(tmp_path, file_server):
    served, url, _ = file_server
    write_cifar_archive(served / "cifar-10-python.tar.gz")  # torchvision's own md5 of the real archive differs
    with pytest.raises(DataNotFoundError, match="could not fetch"):
        load_dataset(DataConfig(name="cifar10", root=str(tmp_path / "root"), download=True, mirror=url))
