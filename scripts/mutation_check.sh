#!/usr/bin/env bash
# The mutation check of the maths modules (docs/mutation.md): on demand, never in CI.
#
#   bash scripts/mutation_check.sh                                  # every module in [tool.mutmut]
#   bash scripts/mutation_check.sh "fl_lightning.aggregation.*"    # one module's mutants
#
# mutmut (pip install -e ".[mutation]") changes one operator, constant or call at a time in the
# modules listed under [tool.mutmut] only_mutate (pyproject.toml) and runs the fast tests that
# cover the changed function; a mutant no test notices "survives". The run happens in a copy
# of the working tree (MUTATION_WORKDIR, default a new temporary folder), so the checkout never
# holds a mutated file or mutmut's mutants/ folder; MUTATION_TREE=HEAD copies the last commit
# instead of the working tree. JOBS: parallel mutants (default 2).
# Afterwards: `cd $MUTATION_WORKDIR && mutmut show <name>` prints a survivor's diff.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
MUTMUT="$ROOT/.venv/bin/mutmut"
if [ ! -x "$MUTMUT" ]; then
  echo "mutation_check: mutmut is not installed; run: .venv/bin/pip install -e '.[mutation]'" >&2
  exit 2
fi
WORK=${MUTATION_WORKDIR:-$(mktemp -d -t fl_lightning_mutation.XXXXXX)}
mkdir -p "$WORK"
if [ -n "${MUTATION_TREE:-}" ]; then  # a commit, e.g. MUTATION_TREE=HEAD: leaves uncommitted work out
  git archive "$MUTATION_TREE" | tar -xf - -C "$WORK"
else  # the working tree as it is (tracked and untracked files, not the ignored ones)
  git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$WORK"
fi
cd "$WORK"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 WANDB_MODE=disabled
echo "mutation_check: in $WORK (progress: $WORK/mutmut-run.log)" >&2
"$MUTMUT" run --max-children "${JOBS:-2}" "$@" > mutmut-run.log 2>&1 || true
tail -c 400 mutmut-run.log | tr '\r' '\n' | grep -a "mutations/second" || true
"$MUTMUT" results | grep -v ": not checked" | tee survivors.txt
echo "mutation_check: $(grep -c . survivors.txt || true) not killed (list: $WORK/survivors.txt); a diff: cd $WORK && $MUTMUT show <name>" >&2
