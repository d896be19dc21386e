#!/usr/bin/env bash
# Sets up fl_lightning on a fresh machine: a virtual environment in .venv with the pinned
# packages, and (where apt is usable as root) Debian's Fashion-MNIST copy for offline use.
# Idempotent: re-running it installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
if ! .venv/bin/python -c "import fl_lightning.callbacks, torch, lightning, jsonargparse, pytest, soundfile, sqlalchemy, flwr" 2>/dev/null; then
  .venv/bin/pip install --disable-pip-version-check -q --upgrade pip
  .venv/bin/pip install --disable-pip-version-check -q -e ".[test]"
fi

# Data (docs/data.md): runs look in data.root ($FL_LIGHTNING_DATA, else ~/.cache/fl_lightning/data),
# then in ../shared/data and Debian's /usr/share/datasets/fashion-mnist when present; online,
# --data.download true fetches what is missing into data.root.
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist) >/dev/null 2>&1 \
    || echo "setup: no offline Fashion-MNIST (Debian's dataset-fashion-mnist did not install); online, add" \
            "--data.download true to the first run: it downloads the files into data.root" >&2
fi
echo "setup: .venv ready ($(.venv/bin/python -c 'import torch, lightning; print("torch", torch.__version__, "lightning", lightning.__version__)'))"
