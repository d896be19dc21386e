#!/bin/bash
# One-round FedNova and SCAFFOLD on FMNIST #C=2 (FedOV Table 1), E local epochs like the
# others in experiments/fedov_table.sh; SGD lr 0.01 (NIID-Bench's default; not tuned here).
cd "$(dirname "$0")/.."
E=${E:-20}
OUT=runs/fedov/seed0
C2="--partition.scheme num_labels --partition.labels_per_client 2"
for alg in fednova scaffold; do
  name=fmnist_C2_$alg
  [ -f $OUT/$name/summary.json ] && continue
  .venv/bin/python -m fl_lightning fit --config configs/${alg}_oneshot_fmnist.yaml $C2 --federation.local_epochs $E \
    --run.dir $OUT/$name > $OUT/$name.log 2>&1 || echo "FAILED $name" >> $OUT/failed.txt
done
