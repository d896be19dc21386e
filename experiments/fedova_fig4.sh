#!/bin/bash
# FedOVA's Figure 4 study (Section IV-E) on real Fashion-MNIST through the offline sweep
# runner: B in {15, 50, 100, full} at E = 5, and E in {1, 2, 5, 10} at B = 15, with R rounds
# (paper: more; reduced to fit two CPU cores). Resumable: re-running skips finished runs.
cd "$(dirname "$0")/.."
R=${R:-20}
for sweep in sweeps/fedova_fmnist_batch.yaml sweeps/fedova_fmnist_epochs.yaml; do
  .venv/bin/python -m fl_lightning sweep $sweep --runs-dir runs/sweeps --federation.rounds $R \
    --federation.eval_every 1 --federation.final_window 5 --run.logger csv --run.progress false
done
.venv/bin/python -m fl_lightning report runs/sweeps/fedova_fmnist_batch --out reports/fedova_fig4_batch
.venv/bin/python -m fl_lightning report runs/sweeps/fedova_fmnist_epochs --out reports/fedova_fig4_epochs
