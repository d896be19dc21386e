#!/bin/bash
# Learning-rate search for the Fashion-MNIST comparison: the same grid and budget for both
# methods (8 rounds of the paper's setting; score = mean test accuracy of rounds 6-8).
# The grid {0.01, 0.05, 0.1} was extended by 0.2 for both methods' sake once FedAvg's best
# sat on its edge. Usage: bash experiments/lr_search.sh [lr ...]
cd "$(dirname "$0")/.."
for algo in fedova fedavg; do for lr in ${@:-0.01 0.05 0.1 0.2}; do
  [ -f runs/lr_search/${algo}_lr$lr/summary.json ] && continue
  .venv/bin/python -m fl_lightning fit --config configs/${algo}_fmnist.yaml --optimizer.lr $lr --federation.rounds 8 \
    --federation.final_window 3 --federation.eval_every 100 --run.logger none --run.checkpoint_every 0 \
    --run.dir runs/lr_search/${algo}_lr$lr > runs/lr_search/${algo}_lr$lr.log 2>&1
done; done
.venv/bin/python - <<'PY'
import json, glob
for path in sorted(glob.glob("runs/lr_search/*/summary.json")):
    s = json.load(open(path)); print(f"{path.split('/')[2]:>16}: {s['final_accuracy']:.4f}")
PY
