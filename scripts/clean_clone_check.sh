#!/usr/bin/env bash
# The README's two commands on a clean clone of HEAD, as CI runs them: clones the repository
# into a temporary folder with ../shared beside it, runs .ci/run (setup, then the test
# command) and the README's run command, the quickstart (its 10 rounds; ROUNDS=n runs n,
# ROUNDS=0 skips it), then deletes the clone. Deleting matters: each clone holds a ~6 GB virtual environment, and clones left in
# /tmp once filled the disk that CI installs on.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d ../shared ] || { echo "clean_clone_check: ../shared not found beside $(pwd)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ln -s "$(realpath ../shared)" "$tmp/shared"
git clone -q . "$tmp/repo"
cd "$tmp/repo"
echo "clean_clone_check: $(git log --oneline -1)"
CI=true bash .ci/run
if [ "${ROUNDS:-}" != 0 ]; then
  .venv/bin/python -m fl_lightning fit --config configs/quickstart.yaml ${ROUNDS:+--federation.rounds "$ROUNDS"}
fi
