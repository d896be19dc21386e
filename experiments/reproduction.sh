#!/bin/bash
# The runs behind the reproduction table (docs/reproduction.md; reports/reproduction/cells.yaml), at the
# budget the machine allows: SEEDS (default "0"), E (FedOV's local epochs, default 20; paper 200;
# runs at another E are named with _e<E>, e.g. fmnist_C1_fedov_e200),
# ROUNDS (Table II's budget, the same for every method, default 50; runs are named _r<ROUNDS>; the
# paper reports 50-200 rounds to its target), ATHENA_ROUNDS (ATHENA-FL's detector rounds and
# FedAvg-MobileNet's rounds, default 10; paper 200; runs at another budget are named _r<R>). Each
# run lands in reports/reproduction/runs/<name>/seed<S>/ and only its summary.json is kept (the
# config, the per-round history and the final accuracy are in it). Finished runs are skipped. A run in
# which every client diverges ends there and is kept (federation.on_divergence stop): the table shows
# that seed as diverged, and its accuracy is in no mean. ONLY=<regex>
# runs the matching names. CHECKPOINT_EVERY (default 0 = none): FedOVA Table I's runs save a
# checkpoint every that many rounds, so a run stopped by a time cap keeps its folder and the same
# command resumes it (--ckpt_path last; equal to an uninterrupted run, tests/test_crash_resume.py); FedOV's
# Table 1 runs (one round) save each client's result as it finishes (run.checkpoint_clients), so the same
# command resumes them without retraining those clients (a run at E = 200 takes hours on two cores); a run
# that fails without a checkpoint is removed. SELECT_PARALLEL=1 runs a learning-rate selection's grid points
# at the same time (for a GPU machine with cores to spare; each run's threads: EXTRA). WORKERS (default 2) client processes per run; EXTRA: settings added to
# every run (e.g. EXTRA="--trainer.accelerator gpu": the cohort engine
# on a GPU, where FedOVA's 100 rounds took 32 s on an H100, bench/results/gpu); PYTHON (default
# .venv/bin/python). Then:
#   python -m fl_lightning report --reproduction reports/reproduction/cells.yaml --doc docs/reproduction.md --readme README.md --figures docs/figures
# Hyper-parameters: the rule at the top of cells.yaml (each paper's stated values; nothing tuned).
cd "$(dirname "$0")/.."
# Ctrl-C stops the whole script: a run stopped by SIGINT exits normally (its checkpoint saved), and
# bash would otherwise go on to the next run
trap 'echo "stopped by SIGINT: the same command resumes"; exit 130' INT
OUT=reports/reproduction/runs
LOGS=${LOGS:-runs/reproduction_logs}
E=${E:-20}
ROUNDS=${ROUNDS:-50}
T2=_r$ROUNDS  # Table II runs are named by their round budget (the one-round selection runs are shared)
mkdir -p "$LOGS"
saved() {  # saved DIR: a stopped run left a checkpoint or client results (run.checkpoint_clients)
  [ -f "$1/checkpoints/last.ckpt" ] || compgen -G "$1/checkpoints/clients/round-*/client-*.pt" > /dev/null
}
# FedOV's Table 1-3 runs (FedOV, close-set voting, the one-round baselines, FedKT) follow the
# configs, which carry the authors' code reading (docs/reproduction_readings.md): their folders
# end in READING_TAG (default _code), so that they never mix with the text-reading runs committed
# before (the folders without it, made by commit 8af2d33's configs).
READING_TAG=${READING_TAG-_code}

run() {  # run NAME CONFIG [OVERRIDES...]
  local name=$1 config=$2; shift 2
  [[ $name =~ ${ONLY:-.} ]] || return
  for seed in ${SEEDS:-0}; do
    local dir=$OUT/$name/seed$seed
    [ -f "$dir/summary.json" ] && continue
    local resume=()
    saved "$dir" && resume=(--ckpt_path last)
    echo "$(date +%T) $name seed $seed${resume:+ (resumed from its checkpoint)}"
    mkdir -p "$(dirname "$LOGS/$name")"
    [ ${#resume[@]} = 0 ] && : > "$LOGS/${name}_seed$seed.log"  # a resumed run appends to its log
    if ${PYTHON:-.venv/bin/python} -m fl_lightning fit --config "$config" --seed "$seed" --run.dir "$dir" --run.logger none \
         --run.progress false --trainer.workers "${WORKERS:-2}" --federation.on_divergence stop ${EXTRA:-} "$@" "${resume[@]}" \
         >> "$LOGS/${name}_seed$seed.log" 2>&1; then
      find "$dir" -mindepth 1 -maxdepth 1 ! -name summary.json -exec rm -rf {} +
    elif saved "$dir"; then  # killed (a time cap): the next call resumes, equal to an uninterrupted run
      echo "STOPPED $name seed $seed: its checkpoint stays in $dir, the same command resumes it (see $LOGS/${name}_seed$seed.log)"
    else
      echo "FAILED $name seed $seed (see $LOGS/${name}_seed$seed.log)"; rm -rf "$dir"
    fi
  done
}
C1="--partition.scheme num_labels --partition.labels_per_client 1"
C2="--partition.scheme num_labels --partition.labels_per_client 2"
C3="--partition.scheme num_labels --partition.labels_per_client 3"
D05="--partition.scheme dirichlet --partition.dirichlet_beta 0.5"
D01="--partition.scheme dirichlet --partition.dirichlet_beta 0.1"
# one round: its clients' results are saved as they finish, so a stopped run resumes client by client
FEDOV="--federation.local_epochs $E --run.checkpoint_clients true"
E_TAG=$([ "$E" = 20 ] || echo "_e$E")  # runs at another E than 20 get names of their own (e.g. _e200)

# FedOV Table 1 (FedOV and close-set voting, same epochs, optimizer and seeds); FEDOV_PARTS adds
# Table 1's other columns (C3, D01: cells.yaml's transcribed table lists them)
for data in fmnist mnist; do
  for part in ${FEDOV_PARTS:-C1 C2 D05}; do
    run ${data}_${part}_closeset${READING_TAG}$E_TAG configs/fedov_${data}.yaml ${!part} $FEDOV --algorithm CloseSetVoting
    run ${data}_${part}_fedov${READING_TAG}$E_TAG configs/fedov_${data}.yaml ${!part} $FEDOV
  done
done
# FIM-L-BFGS Table II, IID FMNIST: FedAvg-SGD and the client-side reading (FedAvg whose clients
# optimise with FIM-based L-BFGS). Step sizes by one rule for both, fixed before these runs: a
# three-point grid each (SGD around its usual 0.1; FIM-L-BFGS around the largest step that did not
# diverge on a 2-client smoke run), one round of the real setting per point, and the lowest
# round-1 training loss wins (no test data; a diverged point is out). The selection runs are kept.
select_lr() {  # select_lr NAME CONFIG "GRID" [OVERRIDES...] -> prints the chosen value of $KEY (default optimizer.lr)
  local name=$1 config=$2 grid=$3; shift 3
  local key=${KEY:-optimizer.lr} rounds=${SELECT_ROUNDS:-1} tag=${TAG:-lr}
  for lr in $grid; do
    ONLY=. SEEDS=0 run selection/${name}_$tag$lr "$config" --federation.rounds $rounds --$key $lr "$@" > /dev/null &
    [ "${SELECT_PARALLEL:-0}" = 1 ] || wait  # parallel on a GPU machine: the grid points' start-ups overlap
  done
  wait
  ${PYTHON:-.venv/bin/python} - "$OUT/selection" "$name" "$tag" "$rounds" $grid <<'PY'
import json, math, sys
from pathlib import Path
folder, name, tag, rounds, grid = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:]
losses = {}
for lr in grid:
    path = folder / f"{name}_{tag}{lr}" / "seed0" / "summary.json"
    history = json.loads(path.read_text())["history"] if path.is_file() else []
    if len(history) >= rounds:  # else it diverged before (federation.on_divergence stop)
        loss = history[rounds - 1].get("train/loss")
        if loss is not None and math.isfinite(loss):
            losses[lr] = loss
print(min(losses, key=losses.get) if losses else "none")
PY
}
WINDOW="--federation.final_window ${WINDOW_ROUNDS:-2}"  # final accuracy: mean of the last rounds, not of all ROUNDS
if [[ fmnist_iid_fedavg_sgd =~ ${ONLY:-.} ]]; then
  lr=$(select_lr fmnist_iid_fedavg_sgd configs/fedavg_sgd_iid_fmnist.yaml "0.01 0.1 1")
  [ "$lr" != none ] && run fmnist_iid_fedavg_sgd$T2 configs/fedavg_sgd_iid_fmnist.yaml --federation.rounds $ROUNDS $WINDOW --optimizer.lr $lr
fi
if [[ fmnist_iid_fim_client =~ ${ONLY:-.} ]]; then
  FIM="--optimizer.name fim_lbfgs --optimizer.momentum 0"
  lr=$(select_lr fmnist_iid_fim_client configs/fedavg_sgd_iid_fmnist.yaml "0.0001 0.001 0.01" $FIM)
  [ "$lr" != none ] && run fmnist_iid_fim_client$T2 configs/fedavg_sgd_iid_fmnist.yaml --federation.rounds $ROUNDS $WINDOW $FIM --optimizer.lr $lr
fi
# Table II's other methods, same rule and budget (three points each, one round, round-1 training
# loss): FedAvg-Adam's lr, FedDANE's mu (its local SGD at FedAvg-SGD's chosen lr) and the
# server-side FIM-L-BFGS's eta (its clients do not train: its selection takes two rounds and
# reads the loss its clients report in round 2, at the first updated model).
if [[ fmnist_iid_fedavg_adam =~ ${ONLY:-.} ]]; then
  lr=$(select_lr fmnist_iid_fedavg_adam configs/fedavg_adam_iid_fmnist.yaml "0.0001 0.001 0.01")
  [ "$lr" != none ] && run fmnist_iid_fedavg_adam$T2 configs/fedavg_adam_iid_fmnist.yaml --federation.rounds $ROUNDS $WINDOW --optimizer.lr $lr
fi
if [[ fmnist_iid_feddane =~ ${ONLY:-.} ]]; then
  sgd=$(select_lr fmnist_iid_fedavg_sgd configs/fedavg_sgd_iid_fmnist.yaml "0.01 0.1 1")  # done above: read back
  mu=$(KEY=algorithm.mu TAG=mu select_lr fmnist_iid_feddane configs/feddane_fmnist.yaml "0.001 0.01 0.1" --optimizer.lr $sgd)
  [ "$mu" != none ] && run fmnist_iid_feddane$T2 configs/feddane_fmnist.yaml --federation.rounds $ROUNDS $WINDOW --optimizer.lr $sgd --algorithm.mu $mu
fi
if [[ fmnist_iid_fim_server =~ ${ONLY:-.} ]]; then
  eta=$(KEY=algorithm.step_size TAG=eta SELECT_ROUNDS=2 select_lr fmnist_iid_fim_server configs/fimlbfgs_fmnist.yaml "0.0001 0.001 0.01")
  [ "$eta" != none ] && run fmnist_iid_fim_server$T2 configs/fimlbfgs_fmnist.yaml --federation.rounds $ROUNDS $WINDOW --algorithm.step_size $eta
fi
# Table II's readings (issue 42, item 6): its 97-98 % are beyond this CNN's test accuracy on
# FMNIST (FedAvg-SGD: 90.1 here). Two readings, each run as its rows are: the global model's
# training accuracy on FMNIST, logged every round (federation.train_accuracy_samples: 10,000 of
# the clients' pooled samples), and the methods on MNIST IID (the rule's own selection there).
TRAIN_ACC="--federation.train_accuracy_samples 10000"
if [[ fmnist_iid_fedavg_sgd_trainacc =~ ${ONLY:-.} ]]; then
  lr=$(select_lr fmnist_iid_fedavg_sgd configs/fedavg_sgd_iid_fmnist.yaml "0.01 0.1 1")  # done above: read back
  [ "$lr" != none ] && run fmnist_iid_fedavg_sgd_trainacc$T2 configs/fedavg_sgd_iid_fmnist.yaml --federation.rounds $ROUNDS \
    $WINDOW --optimizer.lr $lr $TRAIN_ACC
fi
if [[ mnist_iid_fedavg_sgd =~ ${ONLY:-.} ]]; then
  lr=$(select_lr mnist_iid_fedavg_sgd configs/fedavg_sgd_iid_fmnist.yaml "0.01 0.1 1" --data.name mnist)
  [ "$lr" != none ] && run mnist_iid_fedavg_sgd$T2 configs/fedavg_sgd_iid_fmnist.yaml --data.name mnist \
    --federation.rounds $ROUNDS $WINDOW --optimizer.lr $lr $TRAIN_ACC
fi
if [[ mnist_iid_fim_client =~ ${ONLY:-.} ]]; then
  FIM="--optimizer.name fim_lbfgs --optimizer.momentum 0"
  lr=$(select_lr mnist_iid_fim_client configs/fedavg_sgd_iid_fmnist.yaml "0.0001 0.001 0.01" --data.name mnist $FIM)
  [ "$lr" != none ] && run mnist_iid_fim_client$T2 configs/fedavg_sgd_iid_fmnist.yaml --data.name mnist \
    --federation.rounds $ROUNDS $WINDOW $FIM --optimizer.lr $lr $TRAIN_ACC
fi
# Table II's other methods on MNIST IID, as their FMNIST blocks above (the same grids and rule, run
# on MNIST: FedDANE's local SGD at MNIST FedAvg-SGD's chosen lr)
if [[ mnist_iid_fedavg_adam =~ ${ONLY:-.} ]]; then
  lr=$(select_lr mnist_iid_fedavg_adam configs/fedavg_adam_iid_fmnist.yaml "0.0001 0.001 0.01" --data.name mnist)
  [ "$lr" != none ] && run mnist_iid_fedavg_adam$T2 configs/fedavg_adam_iid_fmnist.yaml --data.name mnist \
    --federation.rounds $ROUNDS $WINDOW --optimizer.lr $lr
fi
if [[ mnist_iid_feddane =~ ${ONLY:-.} ]]; then
  sgd=$(select_lr mnist_iid_fedavg_sgd configs/fedavg_sgd_iid_fmnist.yaml "0.01 0.1 1" --data.name mnist)  # read back
  mu=$(KEY=algorithm.mu TAG=mu select_lr mnist_iid_feddane configs/feddane_fmnist.yaml "0.001 0.01 0.1" --data.name mnist --optimizer.lr $sgd)
  [ "$mu" != none ] && run mnist_iid_feddane$T2 configs/feddane_fmnist.yaml --data.name mnist \
    --federation.rounds $ROUNDS $WINDOW --optimizer.lr $sgd --algorithm.mu $mu
fi
if [[ mnist_iid_fim_server =~ ${ONLY:-.} ]]; then
  eta=$(KEY=algorithm.step_size TAG=eta SELECT_ROUNDS=2 select_lr mnist_iid_fim_server configs/fimlbfgs_fmnist.yaml "0.0001 0.001 0.01" --data.name mnist)
  [ "$eta" != none ] && run mnist_iid_fim_server$T2 configs/fimlbfgs_fmnist.yaml --data.name mnist \
    --federation.rounds $ROUNDS $WINDOW --algorithm.step_size $eta
fi
# Table 1's one-round baselines (NIID-Bench: sample-weighted averaging, FedProx μ 0.01), then the
# one-shot baselines with public data (accuracy on the second test half; FedKT's teachers get
# FedOV's E, its students and final model the authors' 100 epochs on the public half). FMNIST #C=2
# always; BASELINE_CELLS (e.g. "mnist_C3 fmnist_D01") adds other columns of the table.
baselines() {  # baselines DATA PART
  local cell=$1_$2 data=(); [ "$1" = mnist ] && data=(--data.name mnist)
  local args=("${data[@]}" ${!2} $FEDOV)
  run ${cell}_fedavg${READING_TAG}$E_TAG configs/fedavg_oneshot_fmnist.yaml "${args[@]}"
  run ${cell}_fedprox${READING_TAG}$E_TAG configs/fedprox_oneshot_fmnist.yaml "${args[@]}" --algorithm.mu 0.01
  run ${cell}_fednova${READING_TAG}$E_TAG configs/fednova_oneshot_fmnist.yaml "${args[@]}"
  run ${cell}_scaffold${READING_TAG}$E_TAG configs/scaffold_oneshot_fmnist.yaml "${args[@]}"
  run ${cell}_feddf${READING_TAG}$E_TAG configs/feddf_oneshot_fmnist.yaml "${args[@]}"
  run ${cell}_fedkt${READING_TAG}$E_TAG configs/fedkt_oneshot_fmnist.yaml "${args[@]}"
}
baselines fmnist C2
for cell in ${BASELINE_CELLS:-}; do baselines ${cell%_*} ${cell#*_}; done
# Table 3: Distilled FedOV on FMNIST Dir(0.5) (student: 100 epochs on the first test half)
run fmnist_D05_fedov_distilled${READING_TAG}$E_TAG configs/fedov_fmnist.yaml $D05 $FEDOV --algorithm.distill true
# Table 2's ablation (FedOV without outlier enhancement, then also without data destruction): FMNIST
# #C=1 always; ABLATION_CELLS (e.g. "mnist_C1 fmnist_D05") adds other columns of the table.
ablation() {  # ablation DATA PART
  run $1_$2_proser${READING_TAG}$E_TAG configs/fedov_$1.yaml ${!2} $FEDOV --algorithm.destruction_weight 0 --algorithm.adversarial_weight 0
  run $1_$2_proser_dd${READING_TAG}$E_TAG configs/fedov_$1.yaml ${!2} $FEDOV --algorithm.adversarial_weight 0
}
ablation fmnist C1
for cell in ${ABLATION_CELLS:-}; do ablation ${cell%_*} ${cell#*_}; done
# FedOVA Table I, FMNIST non-IID-L (K = 100, C = 0.2, E = 5, B = 15, 100 rounds, final accuracy =
# mean of the last 20 rounds as the paper states), with the paper's network (McMahan et al.'s CNN:
# a 512-unit hidden layer). The paper states no learning rate: the same rule for FedOVA and FedAvg
# (plain mean, Algorithm 1 line 8), fixed before these runs: the Table II grid "0.01 0.1 1", one
# round of the real setting per point, lowest round-1 training loss. TABLE1_SETTINGS (default "2")
# picks labels per client; HIDDEN (default 512) the network.
lr_rule_run() {  # lr_rule_run NAME CONFIG [OVERRIDES...]: the rule's lr, then the 100-round run
  local name=$1 config=$2; shift 2
  local lr; lr=$(select_lr $name $config "0.01 0.1 1" "$@")
  [ "$lr" != none ] && run $name $config "$@" --optimizer.lr $lr --run.checkpoint_every ${CHECKPOINT_EVERY:-0}
}
for L in ${TABLE1_SETTINGS:-2}; do
  for method in fedova fedavg; do
    name=fmnist_n${L}_${method}_h${HIDDEN:-512}
    [[ $name =~ ${ONLY:-.} ]] || continue
    lr_rule_run $name configs/${method}_fmnist.yaml --partition.labels_per_client $L --model.hidden_units ${HIDDEN:-512}
  done
done
# CIFAR-10, only with CIFAR=1 (GPU work: experiments/reproduction_gpu.sh, TASKS=cifar). CIFAR_PACK:
# read the images from a data.image_pack file (python -m fl_lightning.data.image_pack) instead of
# the files (data.root or the machine's copy in ../shared/data, docs/data.md). FedOVA Table I (non-IID-2, VGG-11, the rest as the FMNIST rows; a round of
# VGG-11 costs about 12 min on a core; on an H200 with the cohort engine FedAvg's round took
# 4.5-4.9 s and FedOVA's 8.1-9.4 s, one-round runs in commit 7f93069):
# the configs' SGD with momentum 0.9, and the same rule for both methods with a grid one decade
# lower than FMNIST's ("0.001 0.01 0.1": momentum 0.9 multiplies the step by about ten, and VGG-11
# has no batch normalisation), fixed before any CIFAR run. CIFAR_ROUNDS (default 100, the FMNIST
# rows' budget; the paper states none) sets both methods' rounds; runs at another budget are named
# _r<R> and share the one-round selection runs. Then FedOV Table 1's #C=2 cell (FedOV and close-set
# voting at E local epochs).
if [ "${CIFAR:-0}" = 1 ]; then
  pack=${CIFAR_PACK:+--data.image_pack $CIFAR_PACK}
  CR=${CIFAR_ROUNDS:-100}
  CR_TAG=$([ "$CR" = 100 ] || echo "_r$CR")
  for method in fedavg fedova; do  # FedAvg first: its 100 rounds fit one 10-minute device call, FedOVA's do not
    name=cifar_n2_${method}_vgg11
    [[ $name$CR_TAG =~ ${ONLY:-.} ]] || continue
    lr=$(select_lr $name configs/${method}_cifar.yaml "0.001 0.01 0.1" $pack)  # shared by every CIFAR_ROUNDS
    [ "$lr" != none ] && run $name$CR_TAG configs/${method}_cifar.yaml $pack --optimizer.lr $lr \
      --federation.rounds $CR --run.checkpoint_every ${CHECKPOINT_EVERY:-0}
  done
  run cifar_C2_closeset${READING_TAG}$E_TAG configs/fedov_cifar.yaml $C2 $FEDOV --algorithm CloseSetVoting $pack
  run cifar_C2_fedov${READING_TAG}$E_TAG configs/fedov_cifar.yaml $C2 $FEDOV $pack
fi
# FedOVA Table II's data-sharing baseline (Zhao et al. 2018), FMNIST non-IID-2: FedAvg whose
# clients all hold the same random global subset of β·|D_k| extra samples; Table I's setting and
# network, and the same learning-rate rule (its own three one-round runs per β). SHARE_FRACTIONS
# (default "0.05 0.1") picks β.
for beta in ${SHARE_FRACTIONS:-0.05 0.1}; do
  name=fmnist_n2_datasharing${beta}_h${HIDDEN:-512}
  [[ $name =~ ${ONLY:-.} ]] || continue
  lr_rule_run $name configs/fedavg_fmnist.yaml --partition.labels_per_client 2 --partition.share_fraction $beta --model.hidden_units ${HIDDEN:-512}
done
# FedOVA journal Table V, FMNIST non-IID-2 at K = 1000 (Section V: the same training samples over
# ten times the clients, C = 0.2, i.e. 200 clients a round of about 60 samples each; final = mean
# of the last 20 rounds): Table I's settings, network and 100 rounds otherwise (the paper states no
# rounds), and the same learning-rate rule with its own one-round runs at K = 1000.
for method in fedova fedavg; do
  name=fmnist_n2_${method}_h${HIDDEN:-512}_k1000
  [[ $name =~ ${ONLY:-.} ]] || continue
  lr_rule_run $name configs/${method}_fmnist.yaml --partition.labels_per_client 2 --partition.num_clients 1000 --model.hidden_units ${HIDDEN:-512}
done
# ATHENA-FL Section 5.2.2 (50 clients, 2 classes per client, 32x32): ATHENA-FL (one probe round,
# then ATHENA_ROUNDS detector rounds; every detector trains every round, Section 5.3's criterion
# only estimates E[e_dec]) and FedAvg-MobileNet (ATHENA_ROUNDS rounds), both with the configs'
# Adam 1e-3 (the authors' Keras default; nothing tuned), both evaluated on the whole test set and
# per client (the paper's mean over clients with a 95 % interval: federation.per_client_eval).
# ATHENA_ROUNDS (default 10, what two cores allow; the paper: 200); runs at another budget than
# 200 are named _r<R>. CIFAR-10 only with CIFAR=1 (from CIFAR_PACK when set). Then the authors'
# code's reading of the same cells (configs/*_code.yaml: each client's local 80/20 split of its
# pooled, quadrupled data, half the clients a round; docs/reproduction_readings.md), named
# *_code: about 9x the text reading's training (ATHENA-FL's MNIST run: 89 min on one core), so
# they save a checkpoint every CHECKPOINT_EVERY rounds and the same command resumes them. The
# code reads raw [0, 1] pixels (the _code configs' data.standardize: false) and keeps each client's
# Adam state from one of its rounds to its next (optimizer.keep_state: true, as the code's Keras
# clients). The readings made before those details were read: *_code_std (ATHENA-FL on
# standardised inputs, Adam afresh in every fit) and *_code_fresh (raw pixels, Adam afresh).
R=${ATHENA_ROUNDS:-10}
R_TAG=$([ "$R" = 200 ] || echo "_r$R")
for reading in "" _code _code_fresh _code_std; do
  for data in mnist fmnist $([ "${CIFAR:-0}" = 1 ] && echo cifar); do
    pack=$([ $data = cifar ] && echo ${CIFAR_PACK:+--data.image_pack $CIFAR_PACK})
    every=$([ -z "$reading" ] && echo 0 || echo ${CHECKPOINT_EVERY:-0})
    variant=()
    [ "$reading" = _code_std ] && variant=(--data.standardize true --optimizer.keep_state false)
    [ "$reading" = _code_fresh ] && variant=(--optimizer.keep_state false)
    config_reading=${reading%_std}
    config_reading=${config_reading%_fresh}
    run ${data}_C2_athena$reading$R_TAG configs/athena_${data}$config_reading.yaml $pack "${variant[@]}" \
      --federation.rounds $((R + 1)) --federation.per_client_eval true --run.checkpoint_every $every
    [ "$reading" = _code_std ] && continue
    run ${data}_C2_fedavg_mobilenet$reading$R_TAG configs/fedavg_mobilenet_${data}$config_reading.yaml $pack "${variant[@]}" \
      --federation.rounds $R --federation.per_client_eval true --run.checkpoint_every $every
  done
done
