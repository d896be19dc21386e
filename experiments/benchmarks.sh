#!/bin/bash
# The performance benchmarks reported in README.md, one after the other on an idle machine.
cd "$(dirname "$0")/.."
PY=.venv/bin/python
export PYTHONPATH=$PWD
$PY bench/micro_detectors.py --detectors 2 > bench/results/micro_detectors.log 2>&1
$PY bench/round_bench.py --workload W1 --rounds 20 > bench/results/W1_r20.log 2>&1
$PY bench/round_bench.py --workload W3 --rounds 3 > bench/results/W3_r3.log 2>&1
$PY bench/flower_bench.py --rounds 3 --out bench/results/flower_W3.json > bench/results/flower_W3.log 2>&1
$PY bench/round_bench.py --workload W2 --rounds 1 --variants fl_lightning,plain > bench/results/W2_r1.log 2>&1
$PY bench/round_bench.py --workload W1 --rounds 1 --variants fl_lightning > bench/results/W1_r1.log 2>&1
