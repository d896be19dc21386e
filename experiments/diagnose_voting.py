"""Where a one-shot ensemble's accuracy goes: per-member closed-set accuracy on the classes
the member holds, the open-set "unknown" probability on held and unheld classes, and the
vote restricted to members that hold the true class (an oracle no method has), and the
plurality of the members' hard predictions (one vote each, ties to the summed probabilities).

    .venv/bin/python experiments/diagnose_voting.py RUN_DIR [RUN_DIR ...]

Each RUN_DIR is a finished one-shot FedOV or close-set voting run (its checkpoint and
summary.json); prints one Markdown row per run. Used for the Dir(0.5) note in README.md.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


def diagnose(run_dir: Path) -> dict[str, float]:
    from fl_lightning.checkpoint import load_checkpoint
    from fl_lightning.settings import federation_from_config

    summary = json.loads((run_dir / "summary.json").read_text())
    fed = federation_from_config(summary["config"])
    fed.setup()
    # Only the parameters: runs from before a setting existed carry no value for it.
    state = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")["state"]
    if set(state) != set(fed.state):
        raise ValueError(f"{run_dir}: the checkpoint does not hold this run's model/algorithm")
    fed.state = state
    x, y = fed._data.test_x, fed._data.test_y
    with torch.no_grad():
        probs = torch.cat([fed.strategy.member_probabilities(fed.state, x[i:i + 2000])
                           for i in range(0, len(x), 2000)], 1)  # (N, B, outputs)
    n = fed._data.num_classes
    held = torch.as_tensor(fed.partition_counts[:, :n] > 0)  # (N, n)
    holds_truth = held[:, y]  # (N, B): member holds the sample's class
    known = probs[..., :n]
    member_correct = (known.argmax(-1) == y).float()
    out = {
        "accuracy": float((fed.strategy.vote(probs).argmax(1) == y).float().mean()),
        "member_acc_on_held": float(member_correct[holds_truth].mean()),
        "oracle_vote": float(((known * holds_truth.unsqueeze(-1)).sum(0).argmax(1) == y).float().mean()),
        "hard_vote": float(((torch.nn.functional.one_hot(known.argmax(-1), n).sum(0) + 1e-3 * known.sum(0) / len(known))
                            .argmax(1) == y).float().mean()),
    }
    if probs.shape[-1] > n:  # open-set members
        out["p_unknown_held"] = float(probs[..., n][holds_truth].mean())
        out["p_unknown_unheld"] = float(probs[..., n][~holds_truth].mean())
    return out


def main(run_dirs: list[str]) -> None:
    print("| run | accuracy | member accuracy on held classes | oracle vote | hard vote | P(unknown) held / unheld |")
    print("|---|---|---|---|---|---|")
    for d in run_dirs:
        r = diagnose(Path(d))
        unknown = (f"{r['p_unknown_held']:.3f} / {r['p_unknown_unheld']:.3f}" if "p_unknown_held" in r else "—")
        print(f"| {d} | {100 * r['accuracy']:.1f} | {100 * r['member_acc_on_held']:.1f} | "
              f"{100 * r['oracle_vote']:.1f} | {100 * r['hard_vote']:.1f} | {unknown} |")


if __name__ == "__main__":
    main(sys.argv[1:])
