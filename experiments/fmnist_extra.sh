#!/bin/bash
# Secondary runs (one core each, beside another one-core job):
# CIFAR-10 smoke runs (VGG-11 is slow on a CPU: 2 rounds, 2 clients per round, 1 local epoch,
# 1,000 test images) and the data-sharing baseline (FedOVA Table II) with beta = 5 % and 10 %.
cd "$(dirname "$0")/.."
ONE_CORE="--trainer.workers 1 --trainer.threads 1"
for algo in fedova fedavg; do
  .venv/bin/python -m fl_lightning fit --config configs/${algo}_cifar.yaml --federation.rounds 2 \
    --federation.client_fraction 0.02 --federation.local_epochs 1 --federation.final_window 2 \
    --data.test_subset 1000 $ONE_CORE --run.dir runs/cifar_smoke_$algo > runs/cifar_smoke_$algo.log 2>&1
done
for beta in 0.05 0.1; do
  .venv/bin/python -m fl_lightning fit --config configs/fedavg_fmnist.yaml --partition.share_fraction $beta \
    $ONE_CORE --run.dir runs/fedavg_fmnist_share$beta > runs/fedavg_fmnist_share$beta.log 2>&1
done
