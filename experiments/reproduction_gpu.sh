#!/bin/bash
# The reproduction cells a GPU makes cheap, in one device call, with the cohort engine (FedOVA's
# 100 FMNIST rounds: 32 s on an H100, bench/results/gpu/run2_MAIN_cohort.json). TASKS (default
# "table1 datasharing") picks, in order:
#   table1       FedOVA Table I: FedOVA and FedAvg on FMNIST non-IID-2/3/5, 100 rounds, the
#                paper's network with a 512-unit hidden layer, over SEEDS (default "0 1 2");
#   datasharing  Table II's data-sharing baseline (FedAvg, β = 5 / 10 %) over SEEDS;
#   cifar        FedOVA Table I on CIFAR-10 (FedOVA and FedAvg, VGG-11, non-IID-2) over SEEDS,
#                images from the data.image_pack file CIFAR_PACK (default .gpucifar/cifar10_q75.npz).
# The Fashion-MNIST tasks read the *.gz in GZ (default .gpudata). The carry limit (64 MiB) holds
# the wheels and either the Fashion-MNIST files (30 MiB) or the CIFAR-10 pack (36 MiB), not both:
# run "cifar" in a call of its own. The learning rates come from the committed selection runs
# (experiments/reproduction.sh's rule; a setting without them runs its own, one round per grid
# point). New runs start only while BUDGET_S (default 480) seconds have not passed and each run
# stops after RUN_TIMEOUT_S (default 300), so the archive always comes back; partial is fine:
# reproduction.sh skips finished runs next time. Runs keep the device and precision in their
# summary.json (the cohort engine's results equal per-client training's up to float rounding,
# tests/test_cohort.py). ACCELERATOR=cpu with EXTRA="--federation.rounds 1" is a smoke test here.
# On the device (the wheels carried in .whl, the data in .gpudata or .gpucifar):
#   OUT_TAR=$OUT/runs.tgz bash experiments/reproduction_gpu.sh
#   OUT_TAR=$OUT/runs.tgz TASKS=cifar SEEDS=0 bash experiments/reproduction_gpu.sh
# Back here: tar xzf runs.tgz, then
#   python -m fl_lightning report --reproduction reports/reproduction/cells.yaml --readme README.md
# (The CIFAR-10 pack: python -m fl_lightning.data.image_pack --data cifar10 --out .gpucifar/cifar10_q75.npz)
set -u
cd "$(dirname "$0")/.."
T=$(mktemp -d)
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$T" .whl/*.whl || exit 1
fi
export PYTHONPATH=$PWD:$T PYTHON="timeout ${RUN_TIMEOUT_S:-300} ${PYTHON:-python3}" PYTHONUNBUFFERED=1 WORKERS=1 FL_LIGHTNING_DATA=${FL_LIGHTNING_DATA:-/tmp/fl_data}
export EXTRA="--trainer.accelerator ${ACCELERATOR:-gpu} --data.idx_gz_dir ${GZ:-$PWD/.gpudata} ${EXTRA:-}"
export LOGS=${LOGS:-/tmp/reproduction_logs}
[ "${ACCELERATOR:-gpu}" != gpu ] || python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))" || exit 1
start=$(date +%s)
in_budget() { [ $(( $(date +%s) - start )) -lt "${BUDGET_S:-480}" ]; }
for task in ${TASKS:-table1 datasharing}; do
  for seed in ${SEEDS:-0 1 2}; do
    case $task in
      table1)
        for L in ${TABLE1_SETTINGS:-2 5 3}; do
          for method in fedova fedavg; do
            in_budget || break 4
            SEEDS=$seed TABLE1_SETTINGS=$L HIDDEN=${HIDDEN:-512} ONLY="^fmnist_n${L}_${method}_h" \
              bash experiments/reproduction.sh
          done
        done ;;
      datasharing)
        for beta in 0.05 0.1; do
          in_budget || break 3
          SEEDS=$seed SHARE_FRACTIONS=$beta HIDDEN=${HIDDEN:-512} ONLY="^fmnist_n2_datasharing" bash experiments/reproduction.sh
        done ;;
      cifar)
        for method in fedova fedavg; do
          in_budget || break 3
          SEEDS=$seed CIFAR_TABLE1=1 CIFAR_PACK=${CIFAR_PACK:-$PWD/.gpucifar/cifar10_q75.npz} ONLY="^cifar_n2_${method}_" \
            bash experiments/reproduction.sh
        done ;;
      *) echo "unknown task $task (table1, datasharing, cifar)"; exit 1 ;;
    esac
  done
done
echo "$(( $(date +%s) - start )) s"
tar czf "${OUT_TAR:-/tmp/reproduction_runs.tgz}" reports/reproduction/runs -C "$(dirname "$LOGS")" "$(basename "$LOGS")"
