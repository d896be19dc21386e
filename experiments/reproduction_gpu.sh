#!/bin/bash
# The reproduction cells a GPU makes cheap, in one device call, with the cohort engine (FedOVA's
# 100 FMNIST rounds: 32 s on an H100, bench/results/gpu/run2_MAIN_cohort.json). TASKS (default
# "table1 datasharing") picks, in order:
#   table1       FedOVA Table I: FedOVA and FedAvg on FMNIST non-IID-2/3/5, 100 rounds, the
#                paper's network with a 512-unit hidden layer, over SEEDS (default "0 1 2");
#   datasharing  Table II's data-sharing baseline (FedAvg, β = 5 / 10 %) over SEEDS;
#   fedov        FedOV Table 1 at the paper's FEDOV_E (default 200) local epochs: FedOV and
#                close-set voting on FMNIST and MNIST, #C=1 / #C=2 / Dir(0.5) (FEDOV_PARTS; also C3, D01), all
#                SEEDS at once: each cell's runs (data set, partition) stacked in one cohort (experiments/
#                fedov_stacked.py; runs named *_code_e200; a stack the deadline stops is lost, the
#                finished ones stay; bench/gpu_check.sh's STACKED_FEDOV measures one; on an H200 at
#                commit 55648b8 one run took 110 s, two seeds stacked 143 s, and two stacks of three
#                seeds side by side 388 and 443 s (slower than one after another, which this runs;
#                docs/performance.md); finished runs are skipped, so the call picks up the cells left;
#                FEDOV_STACK_BY=data: one stack per data set, which saves only the ≈ 2.85 ms fixed
#                cost of a step (a member-step costs ≈ 0.18 ms at any stack size), and loses more
#                to the deadline: MNIST #C=2 and Dir(0.5) as one stack of 60 were killed at 420 s);
#                FEDOV_DATA (default "fmnist mnist"; "cifar" with FEDOV_PARTS=C2: CIFAR-10's #C=2
#                cells, images from CIFAR_PACK, carry .gpucifar instead of .gpudata/.gpumnist);
#   athena       ATHENA-FL Section 5.2.2: ATHENA-FL and FedAvg-MobileNet on MNIST and FMNIST (2
#                classes per client), the text's and the authors' code's readings (*_code), at
#                ATHENA_ROUNDS (default 200, the paper's) rounds, over SEEDS
#                (two cores: ~1 min a round, the code reading ~9x that; no GPU time measured yet,
#                and a run the deadline stops is lost: lower ATHENA_ROUNDS if one call cannot
#                hold it; the code reading's clients keep their Adam state, optimizer.keep_state,
#                which the cohort engine carries from round to round as per-client fits do);
#   cifar        CIFAR-10: FedOVA Table I (FedAvg, then FedOVA, VGG-11, non-IID-2, CIFAR_ROUNDS
#                rounds, default 100), FedOV Table 1's #C=2 cell at FEDOV_E, then ATHENA-FL's cell
#                (ATHENA_ROUNDS), over SEEDS, images from the data.image_pack file CIFAR_PACK
#                (default .gpucifar/cifar10_q75.npz). Measured on an H200 (one-round runs, commit
#                7f93069): a VGG-11 round takes 4.5-4.9 s for FedAvg and 8.1-9.4 s for FedOVA, plus
#                ~25 s to start a run, so FedAvg's 100 rounds fit one call and FedOVA's (~15 min)
#                fit neither one call nor a session's 15 device minutes. CIFAR_ROUNDS=50
#                CHECKPOINT_EVERY=5 runs the six one-round selection runs (~3 min) and both cells
#                (named *_r50; ~4.5 + 7.5 min): the deadline stops FedOVA's run with its checkpoint
#                on the device, and the same command, called again while the machine is warm,
#                resumes it (what one session's device time leaves may not hold all of it).
#                CONCURRENT (default 1) runs the two Table I cells at the same time, each
#                selection's three grid points too (SELECT_PARALLEL), with THREADS (default 2)
#                torch threads per process: the start-ups (~25 s each) overlap, and so does each
#                run's host work; whether the GPU's own time overlaps is not measured (the
#                processes time-share it); CONCURRENT=0 runs them one after another.
# Fashion-MNIST is read from the *.gz in GZ (default .gpudata), MNIST from the *.gz in MNIST_GZ
# (default .gpumnist; gzip ../shared/data/MNIST/raw/* there). The carry limit (64 MiB) holds the
# wheels and the two MNIST sets (41 MiB) or the CIFAR-10 pack (36 MiB), not both: run "cifar" in
# a call of its own. The learning rates come from the committed selection runs
# (experiments/reproduction.sh's rule; a setting without them runs its own, one round per grid
# point). New runs start only while BUDGET_S (default 480) seconds have not passed and every run
# is stopped at DEADLINE_S (default 560), so the archive always comes back; partial is fine:
# reproduction.sh skips finished runs next time. Runs keep the device and precision in their
# summary.json (the cohort engine's results equal per-client training's up to float rounding,
# tests/test_cohort.py). ACCELERATOR=cpu with EXTRA="--federation.rounds 1" is a smoke test here.
# On the device (the wheels carried in .whl, the data in .gpudata or .gpucifar):
#   OUT_TAR=$OUT/runs.tgz bash experiments/reproduction_gpu.sh
#   OUT_TAR=$OUT/runs.tgz TASKS=cifar SEEDS=0 bash experiments/reproduction_gpu.sh   (carry .whl .gpucifar)
# Back here: tar xzf runs.tgz, then
#   python -m fl_lightning report --reproduction reports/reproduction/cells.yaml --doc docs/reproduction.md --readme README.md --figures docs/figures
# (The CIFAR-10 pack: python -m fl_lightning.data.image_pack --data cifar10 --out .gpucifar/cifar10_q75.npz)
set -u
cd "$(dirname "$0")/.."
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT  # the wheels and the deadline wrapper are needed only while it runs
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$T" .whl/*.whl || exit 1
fi
# Every python call ends by start + DEADLINE_S (default 560: the archive is written inside the
# device's 600-s call). timeout -k: a fit that is told to stop (SIGTERM) may finish its round first.
export DEADLINE=$(( $(date +%s) + ${DEADLINE_S:-560} )) REAL_PYTHON=${PYTHON:-python3}
cat > "$T/python_until_deadline" <<'SH'
#!/bin/bash
left=$(( DEADLINE - $(date +%s) ))
[ "$left" -gt 5 ] || { echo "no time left before the deadline" >&2; exit 124; }
exec timeout -k 10 "$left" $REAL_PYTHON "$@"
SH
chmod +x "$T/python_until_deadline"
export PYTHONPATH=$PWD:$T PYTHON="$T/python_until_deadline" PYTHONUNBUFFERED=1 WORKERS=1 FL_LIGHTNING_DATA=${FL_LIGHTNING_DATA:-/tmp/fl_data}
export EXTRA="--trainer.accelerator ${ACCELERATOR:-gpu} ${EXTRA:-}"
export LOGS=${LOGS:-/tmp/reproduction_logs}
# Both sets unpacked into data.root ($FL_LIGHTNING_DATA) in torchvision's layout, where every run finds
# them (a data.idx_gz_dir would be read by the MNIST runs too, and refused there as Fashion-MNIST).
for pair in "FashionMNIST:${GZ:-$PWD/.gpudata}" "MNIST:${MNIST_GZ:-$PWD/.gpumnist}"; do
  raw=$FL_LIGHTNING_DATA/${pair%%:*}/raw gz=${pair#*:}
  if ls "$gz"/*.gz > /dev/null 2>&1 && [ ! -d "$raw" ]; then
    mkdir -p "$raw" && for f in "$gz"/*.gz; do gunzip -c "$f" > "$raw/$(basename "$f" .gz)"; done
  fi
done
[ "${ACCELERATOR:-gpu}" != gpu ] || python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))" || exit 1
athena_rounds=${ATHENA_ROUNDS:-200}
r_tag=$([ "$athena_rounds" = 200 ] || echo "_r$athena_rounds")  # reproduction.sh's names for ATHENA-FL's runs
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
      fedov)  # every seed at once: the runs of a data set stacked in one cohort (fl_lightning/stacking.py)
        [ "$seed" = "$(set -- ${SEEDS:-0 1 2}; echo $1)" ] || continue
        in_budget || break 2
        mkdir -p "$LOGS"
        $PYTHON experiments/fedov_stacked.py --epochs ${FEDOV_E:-200} --seeds ${SEEDS:-0 1 2} \
          --data ${FEDOV_DATA:-fmnist mnist} --cifar-pack "${CIFAR_PACK:-$PWD/.gpucifar/cifar10_q75.npz}" \
          --parts ${FEDOV_PARTS:-C1 C2 D05} --stack-by ${FEDOV_STACK_BY:-cell} --reading-tag "${READING_TAG-_code}" --extra "$EXTRA" \
          2>&1 | tee -a "$LOGS/fedov_stacked.log" | grep -vE "Warning|warn" ;;
      athena)
        for data in mnist fmnist; do
          for method in athena fedavg_mobilenet; do
            in_budget || break 4
            SEEDS=$seed ATHENA_ROUNDS=$athena_rounds ONLY="^${data}_C2_${method}(_code)?$r_tag\$" bash experiments/reproduction.sh
          done
        done ;;
      cifar)
        cr_tag=$([ "${CIFAR_ROUNDS:-100}" = 100 ] || echo "_r$CIFAR_ROUNDS")
        cifar_run() {  # cifar_run NAME: one CIFAR cell's runs (its selection first)
          local extra=$EXTRA select_parallel=0
          if [ "${CONCURRENT:-1}" = 1 ]; then  # several processes share the GPU: split the cores between them
            extra="$EXTRA --trainer.threads ${THREADS:-2}" select_parallel=1
          fi
          SEEDS=$seed CIFAR=1 E=${FEDOV_E:-200} ATHENA_ROUNDS=$athena_rounds CIFAR_PACK=${CIFAR_PACK:-$PWD/.gpucifar/cifar10_q75.npz} \
            EXTRA="$extra" SELECT_PARALLEL=$select_parallel ONLY="^$1\$" bash experiments/reproduction.sh
        }
        # FedOVA Table I's two cells side by side (CONCURRENT=1, the default): their selection
        # runs' start-ups and the host work between graph replays overlap on the one GPU
        for name in cifar_n2_fedavg_vgg11$cr_tag cifar_n2_fedova_vgg11$cr_tag; do
          in_budget || break 3
          cifar_run $name &
          [ "${CONCURRENT:-1}" = 1 ] || wait
        done
        wait
        e_tag=$([ "${FEDOV_E:-200}" = 20 ] || echo "_e${FEDOV_E:-200}")  # reproduction.sh's FedOV names
        for name in cifar_C2_fedov${READING_TAG-_code}$e_tag cifar_C2_closeset${READING_TAG-_code}$e_tag \
            cifar_C2_athena$r_tag cifar_C2_fedavg_mobilenet$r_tag cifar_C2_athena_code$r_tag cifar_C2_fedavg_mobilenet_code$r_tag; do
          in_budget || break 3
          cifar_run $name
        done ;;
      *) echo "unknown task $task (table1, datasharing, fedov, athena, cifar)"; exit 1 ;;
    esac
  done
done
echo "$(( $(date +%s) - start )) s"
# A stopped run's checkpoint stays on the device for the next call (FedOVA's VGG-11 one is 390 MB,
# beyond what a call brings back): the archive holds summaries and logs only.
tar czf "${OUT_TAR:-/tmp/reproduction_runs.tgz}" --exclude=checkpoints reports/reproduction/runs -C "$(dirname "$LOGS")" "$(basename "$LOGS")"
