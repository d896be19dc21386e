#!/bin/bash
# The headline config end to end: FedOV and close-set voting on CIFAR-10 #C=2 (simple CNN)
# with E local epochs (paper: 200). Results: runs/fedov/cifar/<name>/summary.json.
cd "$(dirname "$0")/.."
E=${E:-10}
OUT=runs/fedov/cifar
mkdir -p $OUT
for alg in FedOV CloseSetVoting; do
  name=cifar_C2_$(echo $alg | tr A-Z a-z)_E$E
  [ -f $OUT/$name/summary.json ] && continue
  .venv/bin/python -m fl_lightning fit --config configs/fedov_cifar.yaml --algorithm $alg \
    --federation.local_epochs $E --run.dir $OUT/$name > $OUT/$name.log 2>&1 || echo "FAILED $name" >> $OUT/failed.txt
done
