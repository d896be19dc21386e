"""How many operations one cohort step runs, eager and compiled (trainer.compile), counted on a
CPU: a proxy for the GPU's fixed cost of a step, which a CUDA graph replays kernel by kernel.

Eager: the aten operations of one step that have no aten children, less views and shape
queries (torch.profiler). Compiled: the kernel calls in the step's inductor code (fused kernels
plus extern calls such as convolutions and batched matmuls; TORCH_LOGS=output_code). The step's
structure does not depend on the data's size or the number of members (they are vmapped), so
a tiny synthetic federation of 3 members is used. On a GPU inductor fuses into Triton kernels
instead of C++ ones, so the compiled count there is not measured by this.

    python bench/step_kernels.py --algorithms FedOV CloseSetVoting --out bench/results/step_kernels_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NOT_KERNELS = {"view", "reshape", "expand", "as_strided", "select", "slice", "unsqueeze", "squeeze", "permute", "t",
               "transpose", "detach", "alias", "_unsafe_view", "empty", "empty_like", "lift_fresh", "_reshape_alias",
               "unbind", "split", "chunk", "expand_as", "view_as", "empty_strided", "resolve_conj", "resolve_neg",
               "narrow", "movedim", "flatten", "unflatten", "result_type", "is_nonzero", "item", "_local_scalar_dense",
               "size", "stride", "dim", "numel", "set_", "to", "type_as"}


def federation(algorithm: str, run_dir: str, *extra: str):
    from fl_lightning.settings import build_federation
    from tests.conftest import tiny_args

    fed = build_federation(["fit", *tiny_args(run_dir, "--federation.rounds", "1", "--trainer.engine", "cohort",
                                              "--algorithm", algorithm, "--federation.local_epochs", "1", *extra)],
                           callbacks=[])[2]
    fed.setup()
    return fed


def eager_ops(algorithm: str) -> dict:
    """Profile the second step of the first cohort (the draws are in place by then)."""
    import torch

    from fl_lightning.cohort import engine

    counted: dict = {}
    run_window = engine.CohortRunner.run_window

    def profiled_window(self, start, count, autocast):
        step, calls = self._step, [0]

        def profiled():
            calls[0] += 1
            if calls[0] != 2 or counted:
                return step()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                step()
            names = [e.name[len("aten::"):] for e in prof.events()
                     if not e.cpu_children and e.name.startswith("aten::") and e.name[len("aten::"):] not in NOT_KERNELS]
            counted.update(ops=len(names), most=sorted(((n, names.count(n)) for n in set(names)), key=lambda kv: -kv[1])[:10])

        self._step = profiled
        return run_window(self, start, count, autocast)

    engine.CohortRunner.run_window = profiled_window
    try:
        with tempfile.TemporaryDirectory() as tmp:
            federation(algorithm, tmp).fit()
    finally:
        engine.CohortRunner.run_window = run_window
    return counted


def compiled_calls(algorithm: str) -> dict:
    """A fresh process (no compile cache) with the inductor code logged."""
    env = {**os.environ, "TORCH_LOGS": "output_code", "TORCHINDUCTOR_FX_GRAPH_CACHE": "0",
           "TORCHINDUCTOR_AUTOGRAD_CACHE": "0"}
    code = ("import sys, tempfile; sys.path.insert(0, %r); from bench.step_kernels import federation; "
            "federation(%r, tempfile.mkdtemp(), '--trainer.compile', 'true').fit()" % (str(ROOT), algorithm))
    log = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stderr
    lines = [line.split("[__output_code]", 1)[1] for line in log.splitlines() if "[__output_code]" in line]
    graphs, body = [], None
    for line in lines:
        if re.match(r"\s+def call\(", line):
            body = []
            graphs.append(body)
        elif body is not None and (re.match(r"\s+return \(", line) or re.match(r"\s{0,4}def ", line)):
            body = None
        elif body is not None:
            body.append(line)
    fused = sum(1 for b in graphs for line in b if re.match(r"\s+cpp_fused_\w+\(", line))
    extern = sum(1 for b in graphs for line in b if "extern_kernels." in line or re.search(r"torch\.ops\.\w+\.\w+\(", line))
    return {"graphs": len(graphs), "fused_kernels": fused, "extern_calls": extern, "calls": fused + extern}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--algorithms", nargs="+", default=["FedOV", "CloseSetVoting"])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    result = {"what": __doc__.split("\n\n")[0].replace("\n", " "), "torch": torch.__version__, "steps": {}}
    for algorithm in args.algorithms:
        eager, compiled = eager_ops(algorithm), compiled_calls(algorithm)
        result["steps"][algorithm] = {"eager_ops": eager["ops"], "eager_most_frequent": eager["most"],
                                      "compiled": compiled, "eager_over_compiled": round(eager["ops"] / compiled["calls"], 2)}
        print(algorithm, result["steps"][algorithm], flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
