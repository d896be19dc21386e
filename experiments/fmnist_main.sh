#!/bin/bash
# The Fashion-MNIST comparison (FedOVA Table I, non-IID-2): each method with its best
# learning rate from experiments/lr_search.sh, 100 rounds, run one after the other so each
# has both cores (2 client workers).
cd "$(dirname "$0")/.."
FEDOVA_LR=${FEDOVA_LR:?} FEDAVG_LR=${FEDAVG_LR:?}
.venv/bin/python -m fl_lightning fit --config configs/fedova_fmnist.yaml --optimizer.lr $FEDOVA_LR \
  --run.dir runs/fedova_fmnist_noniid2 > runs/fedova_fmnist_noniid2.log 2>&1
.venv/bin/python -m fl_lightning fit --config configs/fedavg_fmnist.yaml --optimizer.lr $FEDAVG_LR \
  --run.dir runs/fedavg_fmnist_noniid2 > runs/fedavg_fmnist_noniid2.log 2>&1
