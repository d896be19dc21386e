#!/bin/bash
# The same search with Adam (the FedOVA paper names Adam as its local optimizer), same
# grid for both methods: 8 rounds, score = mean test accuracy of rounds 6-8.
cd "$(dirname "$0")/.."
for algo in fedova fedavg; do for lr in ${@:-0.0003 0.001 0.003}; do
  [ -f runs/lr_search/${algo}_adam_lr$lr/summary.json ] && continue
  .venv/bin/python -m fl_lightning fit --config configs/${algo}_fmnist.yaml --optimizer.name adam --optimizer.lr $lr \
    --federation.rounds 8 --federation.final_window 3 --federation.eval_every 100 --run.logger none \
    --run.checkpoint_every 0 --trainer.workers 1 --trainer.threads 1 \
    --run.dir runs/lr_search/${algo}_adam_lr$lr > runs/lr_search/${algo}_adam_lr$lr.log 2>&1
done; done
.venv/bin/python - <<'PY'
import json, glob
for path in sorted(glob.glob("runs/lr_search/*/summary.json")):
    s = json.load(open(path)); print(f"{path.split('/')[2]:>22}: {s['final_accuracy']:.4f}")
PY
