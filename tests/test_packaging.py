"""The callbacks' folder stays at the top of the checkout but is the package
``fl_lightning.callbacks``: installed (a wheel, ``pip install -e .``) and from a source checkout on
PYTHONPATH, with no generic top-level ``callbacks`` package anywhere."""

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_listed_packages_are_the_package_folders():
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "fl_lightning").rglob("__init__.py")}
    folders |= {"fl_lightning." + ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "callbacks").rglob("__init__.py")}
    assert set(settings["packages"]) == folders
    assert settings["package-dir"] == {"fl_lightning.callbacks": "callbacks"}


def test_a_source_checkout_imports_fl_lightning_callbacks_without_installation(tmp_path):
    code = ("import sys, fl_lightning.callbacks.logging as m, fl_lightning.federation; "
            "print(m.__name__, m.__file__); print('callbacks' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    name, path, top_level = proc.stdout.split()
    assert name == "fl_lightning.callbacks.logging" and Path(path) == ROOT / "callbacks" / "logging.py"
    assert top_level == "False"


def test_the_wheel_installs_the_callbacks_under_fl_lightning(tmp_path):
    source = tmp_path / "src"
    for name in ("fl_lightning", "callbacks"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                           str(tmp_path / "wheel"), str(source)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]

    (wheel,) = (tmp_path / "wheel").glob("fl_lightning-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "fl_lightning/callbacks/logging.py" in names and "fl_lightning/data/sources.py" in names
    assert not [n for n in names if n.startswith("callbacks/")]
    top_level = [n for n in names if n.endswith("top_level.txt")]
    assert not top_level or zipfile.ZipFile(wheel).read(top_level[0]).decode().split() == ["fl_lightning"]
