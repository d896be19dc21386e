#!/bin/bash
# FedOV vs close-set voting on FMNIST Dir(0.5) with E = 60 local epochs, over more seeds (the
# paper reports the mean of 3 trials; seed 0 is in experiments/fedov_more_baselines.sh).
# WORKERS=1 leaves a core free for other work. Results: runs/fedov/seed<S>/fmnist_D05_*_E<E><TAG>.
# Longer local training on seed 0: E=100 SEEDS=0 bash experiments/fedov_seeds.sh
# The authors' code's PROSER weights, FedOV only:
#   ALGS=FedOV TAG=_codeweights FEDOV_ARGS="--algorithm.dummy_weight 1 --algorithm.mixup_weight 0.01" bash experiments/fedov_seeds.sh
cd "$(dirname "$0")/.."
E=${E:-60}
WORKERS=${WORKERS:-2}
for SEED in ${SEEDS:-1 2}; do
  OUT=runs/fedov/seed$SEED
  mkdir -p $OUT
  for alg in ${ALGS:-CloseSetVoting FedOV}; do
    name=fmnist_D05_$(echo $alg | tr A-Z a-z | sed 's/closesetvoting/closeset/')_E$E
    extra=()
    [ $alg = FedOV ] && { name=$name${TAG:-}; extra=(${FEDOV_ARGS:-}); }
    [ -f $OUT/$name/summary.json ] && continue
    .venv/bin/python -m fl_lightning fit --config configs/fedov_fmnist.yaml --seed $SEED \
      --algorithm $alg "${extra[@]}" --partition.scheme dirichlet --partition.dirichlet_beta 0.5 --federation.local_epochs $E \
      --trainer.workers $WORKERS --trainer.threads 1 --run.dir $OUT/$name --run.logger csv > $OUT/$name.log 2>&1 \
      || echo "FAILED $name" >> $OUT/failed.txt
  done
done
