#!/bin/bash
# The short search for FIM-L-BFGS's step size eta and damping lambda (configs/fimlbfgs_fmnist.yaml):
# 15 rounds of IID Fashion-MNIST each, score = mean test accuracy of rounds 13-15 (the test
# set doubles as the selection set, as in README's learning-rate searches). One process,
# one thread. Arguments: "eta:lambda[:max_step_norm]" triples; default: the grid in README.
# CONFIG=configs/fimlbfgs_logreg_fmnist.yaml OUT=runs/fimlbfgs_search_logreg: the logistic-regression search.
cd "$(dirname "$0")/.."
CONFIG=${CONFIG:-configs/fimlbfgs_fmnist.yaml}
OUT=${OUT:-runs/fimlbfgs_search}
mkdir -p $OUT
for point in ${@:-0.1:1 0.3:1 1:1 0.01:0.1 0.001:0.01 0.0001:0.001 0.003:0.01 0.001:0.001}; do
  IFS=: read eta lam clip <<< "$point"; clip=${clip:-0}
  name=eta${eta}_lam${lam}_clip${clip}
  [ -f $OUT/$name/summary.json ] && continue
  OMP_NUM_THREADS=1 .venv/bin/python -m fl_lightning fit --config $CONFIG \
    --algorithm.step_size $eta --algorithm.damping $lam --algorithm.max_step_norm $clip \
    --federation.rounds 15 --federation.final_window 3 --federation.eval_every 100 --run.logger none \
    --run.checkpoint_every 0 --trainer.workers 1 --trainer.threads 1 \
    --run.dir $OUT/$name > $OUT/$name.log 2>&1
done
OUT=$OUT .venv/bin/python - <<'PY'
import os
out = os.environ["OUT"]
import json, glob
for path in sorted(glob.glob(f"{out}/*/summary.json")):
    s = json.load(open(path)); h = s["history"]
    acc = "diverged" if s["final_accuracy"] is None else f"{100 * s['final_accuracy']:.2f}"
    print(f"{path.split('/')[-2]:>32}: acc(13-15) {acc:>8}  loss@w_t r1 {h[0]['train/loss']:.3f} "
          f"r15 {h[-1]['train/loss']:.3f}  max step {max(m['lbfgs/step_norm'] for m in h):.3g}")
for log in sorted(glob.glob(f"{out}/*.log")):
    if not glob.glob(log[:-4] + "/summary.json"):
        lines = [l for l in open(log).read().splitlines() if l.strip()]
        print(f"{log.split('/')[-1][:-4]:>32}: failed: {lines[-1][:100] if lines else '?'}")
PY
