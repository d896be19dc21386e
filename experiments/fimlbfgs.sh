#!/bin/bash
# The FIM-L-BFGS paper's optimizer comparison (Table II, Fashion-MNIST, IID; K=100, C=0.2,
# B=15, FashionCNN) and its two companions:
#   IID F-MNIST:        FedAvg-SGD (lr 0.1), FedAvg-Adam (lr 1e-3), FedDANE (SGD lr 0.1, mu 0.01),
#                       FIM-L-BFGS (eta, lambda from experiments/fimlbfgs_search.sh; see the config)
#   logistic regression (the convex sanity check): FedAvg-SGD (lr 0.1; 15-round scores 0.1: 83.7,
#                       0.03: 83.7, 0.01: 83.0) vs FIM-L-BFGS (configs/fimlbfgs_logreg_fmnist.yaml)
#   non-IID-2 F-MNIST:  FedOVA + FIM-L-BFGS vs FedOVA (local SGD, lr 0.05)
# ROUNDS rounds each (default 100), one run after the other (2 client workers each). Each
# result lands in $OUT/<name>/summary.json (default OUT=runs/fimlbfgs); finished runs are
# skipped. ARGS: extra overrides for every run (e.g. ARGS="--trainer.workers 1").
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-100}
OUT=${OUT:-runs/fimlbfgs}
mkdir -p $OUT

run() {  # run NAME CONFIG [OVERRIDES...]
  local name=$1 config=$2; shift 2
  if [ -f $OUT/$name/summary.json ]; then echo "skip $name (done)"; return; fi
  echo "run  $name"
  .venv/bin/python -m fl_lightning fit --config $config --federation.rounds $ROUNDS \
    --run.dir $OUT/$name "$@" $ARGS > $OUT/$name.log 2>&1 || echo "FAILED $name (see $OUT/$name.log)"
}

run fedavg_sgd_iid        configs/fedavg_sgd_iid_fmnist.yaml
run fedavg_adam_iid       configs/fedavg_adam_iid_fmnist.yaml
run feddane_iid           configs/feddane_fmnist.yaml
run fimlbfgs_iid          configs/fimlbfgs_fmnist.yaml
run logreg_fedavg_sgd_iid configs/fedavg_sgd_iid_fmnist.yaml --model.architecture logistic --optimizer.lr 0.1
run logreg_fimlbfgs_iid   configs/fimlbfgs_logreg_fmnist.yaml
run fedova_fimlbfgs_noniid2 configs/fedova_fimlbfgs_fmnist.yaml
run fedova_sgd_noniid2    configs/fedova_fmnist.yaml --federation.eval_every 1

OUT=$OUT .venv/bin/python - <<'PY'
import glob, json, os
print(f"{'run':>26} {'final (last 20)':>16} {'best':>7} {'first round >= 80 %':>20} {'GB exchanged':>13}")
for path in sorted(glob.glob(f"{os.environ['OUT']}/*/summary.json")):
    s = json.load(open(path))
    acc = [(m["round"], m["test/accuracy"]) for m in s["history"] if "test/accuracy" in m]
    reach = next((r for r, a in acc if a >= 0.80), None)
    final = "-" if s["final_accuracy"] is None else f"{100 * s['final_accuracy']:.2f}%"
    best = f"{100 * max(a for _, a in acc):.2f}%" if acc else "-"
    print(f"{path.split('/')[-2]:>26} {final:>16} {best:>7} {str(reach):>20} {s['bytes_total'] / 1e9:>13.3f}")
PY
