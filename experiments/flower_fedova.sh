#!/bin/bash
# FedOVA, Fashion-MNIST, 5 clients, 10 rounds (configs/flower_fedova_fmnist.yaml): in process
# (1 worker; 2 workers) and on Flower (SuperLink + 5 SuperNodes on this machine), back to back.
# Each run's summary.json has its accuracy and loop wall time; flower_launch.log the total
# including Flower's start-up.
cd "$(dirname "$0")/.."
OUT=runs/flower
mkdir -p $OUT
.venv/bin/python -m fl_lightning fit --config configs/flower_fedova_fmnist.yaml --run.dir $OUT/in_process_w1 \
  --trainer.workers 1 --trainer.threads 1 > $OUT/in_process_w1.log 2>&1
.venv/bin/python -m fl_lightning fit --config configs/flower_fedova_fmnist.yaml --run.dir $OUT/in_process_w2 \
  --trainer.workers 2 > $OUT/in_process_w2.log 2>&1
/usr/bin/time -f "launcher wall %e s" .venv/bin/python -m fl_lightning.flower.launch \
  --config configs/flower_fedova_fmnist.yaml --clients 5 --overrides "--run.dir $OUT/flower" \
  --workdir $OUT/flower_processes > $OUT/flower_launch.log 2>&1
.venv/bin/python - <<'PY'
import json
for name in ("in_process_w1", "in_process_w2", "flower"):
    s = json.load(open(f"runs/flower/{name}/summary.json"))
    print(name, "accuracy", [round(m["test/accuracy"], 4) for m in s["history"]][-3:], "loop wall", round(s["wall_time_s"], 1))
PY
