#!/bin/bash
# GPU check (run on a CUDA machine from the repo root): the GPU-only test, then FedOVA and
# FedAvg on Fashion-MNIST in the paper's setting for $ROUNDS rounds with precision auto
# (bf16-mixed) and one FedOVA round in 32-true, writing each summary.json to $OUT.
# Data: FMNIST's *-ubyte.gz in $GZ (default /usr/share/datasets/fashion-mnist).
set -u
ROUNDS=${ROUNDS:-20}; GZ=${GZ:-/usr/share/datasets/fashion-mnist}; OUT=${OUT:-bench/results/gpu}
export FL_LIGHTNING_DATA=${FL_LIGHTNING_DATA:-/tmp/fl_data} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))"
python3 -m pytest -q -p no:cacheprovider tests/test_detectors.py 2>&1 | tail -3
run() {  # name, extra args...
  local name=$1; shift
  python3 -m fl_lightning fit "$@" --data.idx_gz_dir "$GZ" --trainer.accelerator gpu --trainer.workers 1 \
    --run.logger none --run.checkpoint_every 0 --run.dir /tmp/gpu_runs/$name 2>&1 | grep -E "round +(1|2|$ROUNDS)/|final|Error"
  cp /tmp/gpu_runs/$name/summary.json "$OUT/$name.json"
}
run fedova_bf16 --config configs/fedova_fmnist.yaml --optimizer.lr 0.05 --federation.rounds $ROUNDS --federation.eval_every 1 --federation.final_window 5
run fedavg_bf16 --config configs/fedavg_fmnist.yaml --optimizer.lr 0.1 --federation.rounds $ROUNDS --federation.eval_every 1 --federation.final_window 5
run fedova_fp32 --config configs/fedova_fmnist.yaml --optimizer.lr 0.05 --federation.rounds 3 --trainer.precision 32-true --federation.final_window 3
