#!/bin/bash
# FedOV (ICLR 2023) on this CPU: Table 1/2 settings with E local epochs (paper: 200).
# Runs one after the other, each with both cores (WORKERS=2 client workers, the default). Results:
# runs/fedov/seed<SEED>/<name><TAG>/summary.json; experiments/collect_fedov.py makes the table.
# ONLY=<regex> runs just the names that match, e.g. the FedOV rows again under a new tag:
#   TAG=_pixel ONLY='_fedov$' bash experiments/fedov_table.sh
# EXTRA adds arguments to every run, e.g. the authors' code's PROSER weights on MNIST Dir(0.5):
#   TAG=_codeweights ONLY='^mnist_D05_fedov$' EXTRA="--algorithm.dummy_weight 1 --algorithm.mixup_weight 0.01" bash experiments/fedov_table.sh
cd "$(dirname "$0")/.."
E=${E:-20}
SEED=${SEED:-0}
OUT=runs/fedov/seed$SEED
mkdir -p $OUT
run() {  # name config extra-args...
  local name=$1 config=$2; shift 2
  [[ $name =~ ${ONLY:-.} ]] || return
  name=$name${TAG:-}
  [ -f $OUT/$name/summary.json ] && return  # done already: the script can be re-run after a stop
  .venv/bin/python -m fl_lightning fit --config $config --seed $SEED --federation.local_epochs $E \
    --trainer.workers ${WORKERS:-2} --run.dir $OUT/$name --run.logger csv "$@" ${EXTRA:-} > $OUT/$name.log 2>&1 \
    || echo "FAILED $name" >> $OUT/failed.txt
}
C1="--partition.scheme num_labels --partition.labels_per_client 1"
C2="--partition.scheme num_labels --partition.labels_per_client 2"
D05="--partition.scheme dirichlet --partition.dirichlet_beta 0.5"
for data in mnist fmnist; do
  for part in C1 C2; do
    run ${data}_${part}_fedov configs/fedov_${data}.yaml ${!part}
    run ${data}_${part}_closeset configs/fedov_${data}.yaml ${!part} --algorithm CloseSetVoting
  done
done
for data in fmnist mnist; do
  run ${data}_D05_fedov configs/fedov_${data}.yaml $D05
  run ${data}_D05_closeset configs/fedov_${data}.yaml $D05 --algorithm CloseSetVoting
done
# Table 2 ablation on FMNIST #C=1: PROSER, PROSER + DD (FedOV and close-set above).
run fmnist_C1_proser configs/fedov_fmnist.yaml $C1 --algorithm.destruction_weight 0 --algorithm.adversarial_weight 0
run fmnist_C1_proser_dd configs/fedov_fmnist.yaml $C1 --algorithm.adversarial_weight 0
# Table 1 one-round baselines on FMNIST #C=2 (same optimizer, epochs and batch as FedOV).
run fmnist_C2_fedavg configs/fedavg_oneshot_fmnist.yaml $C2
for mu in 0.001 0.01 0.1 1; do
  run fmnist_C2_fedprox_mu$mu configs/fedprox_oneshot_fmnist.yaml $C2 --algorithm.mu $mu
done
run fmnist_C2_feddf configs/feddf_oneshot_fmnist.yaml $C2
run fmnist_C2_fedov_distilled configs/fedov_fmnist.yaml $C2 --algorithm.distill true
