"""Where a one-shot ensemble's accuracy goes: per-member closed-set accuracy on the classes
the member holds, the open-set "unknown" probability on held and unheld classes, and the
vote restricted to members that hold the true class (an oracle no method has), and the
plurality of the members' hard predictions (one vote each, ties to the summed probabilities).

    .venv/bin/python experiments/diagnose_voting.py [--per-class] RUN_DIR [RUN_DIR ...]

Each RUN_DIR is a finished one-shot FedOV or close-set voting run (its checkpoint and
summary.json); prints one Markdown row per run. Used for the Dir(0.5) note in
docs/reproduction.md and the voting notes in docs/reproduction_readings.md.

With --per-class, one table per run, one row per true class c: where its test images go (the
most frequent wrong class w and the share of c's images voted w), the mean vote for c and for
w, and what the members holding each of the two classes give those images (P(class),
P(unknown)). It names the members whose votes carry a class's errors.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch


def member_outputs(run_dir: Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, object]:
    """The run's members' softmax outputs on the test set (N, B, outputs), the labels (B,),
    which classes each member holds (N, n) and the federation."""
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
    if probs.shape[0] != held.shape[0]:
        raise ValueError(f"{run_dir}: {probs.shape[0]} of {held.shape[0]} clients voted; this diagnosis needs all")
    return probs, y, held, fed


def diagnose(run_dir: Path) -> dict[str, float]:
    probs, y, held, fed = member_outputs(run_dir)
    n = held.shape[1]
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


def per_class(run_dir: Path) -> list[dict]:
    """Per true class c (see the module docstring): its accuracy, its most frequent wrong class
    w, the mean vote for c and for w on c's images, and each holder's mean output on them."""
    probs, y, held, fed = member_outputs(run_dir)
    n = held.shape[1]
    votes = fed.strategy.vote(probs)  # (B, n)
    pred = votes.argmax(1)
    open_set = probs.shape[-1] > n
    rows = []
    for c in range(n):
        mine = y == c
        if not bool(mine.any()):
            continue
        voted = pred[mine]
        wrong = voted[voted != c]
        w = int(wrong.mode().values) if len(wrong) else None
        p = probs[:, mine].mean(1)  # (N, outputs): each member's mean output on class c's images

        def holders(k: int) -> dict[int, tuple[float, float | None]]:
            return {m: (float(p[m, k]), float(p[m, n]) if open_set else None)
                    for m in torch.nonzero(held[:, k]).flatten().tolist()}

        rows.append({"class": c, "accuracy": float((voted == c).float().mean()),
                     "wrong_class": w, "share_to_w": float((voted == w).float().mean()) if w is not None else 0.0,
                     "vote_c": float(votes[mine, c].mean()),
                     "vote_w": float(votes[mine, w].mean()) if w is not None else None,
                     "holders_c": holders(c), "holders_w": holders(w) if w is not None else {}})
    return rows


def _holders(h: dict[int, tuple[float, float | None]]) -> str:
    return "; ".join(f"{m}: {pc:.2f}" + (f", {pu:.2f}" if pu is not None else "") for m, (pc, pu) in h.items()) or "none"


def _finished_run(path: str) -> Path:
    run_dir = Path(path)
    missing = [name for name in ("summary.json", "checkpoints/last.ckpt") if not (run_dir / name).is_file()]
    if missing:
        raise argparse.ArgumentTypeError(
            f"{run_dir} is not a finished run's --run.dir: it lacks {' and '.join(missing)} "
            "(the committed reproduction folders keep only summary.json: rerun the cell's command)")
    return run_dir


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-class", action="store_true",
                        help="one table per run, one row per true class, instead of one row per run")
    parser.add_argument("run_dirs", nargs="+", type=_finished_run, metavar="RUN_DIR",
                        help="a finished one-shot run's --run.dir (its summary.json and checkpoints/last.ckpt)")
    args = parser.parse_args(argv)
    if args.per_class:
        for d in args.run_dirs:
            print(f"\n{d}\n")
            print("| class c | accuracy | most frequent wrong class w | mean vote for c / w | "
                  "holders of c: P(c)[, P(unknown)] | holders of w: P(w)[, P(unknown)] |")
            print("|---|---|---|---|---|---|")
            for r in per_class(d):
                w = "—" if r["wrong_class"] is None else f"{r['wrong_class']} ({100 * r['share_to_w']:.1f} % of c's images)"
                vote_w = "—" if r["vote_w"] is None else f"{r['vote_w']:.2f}"
                print(f"| {r['class']} | {100 * r['accuracy']:.1f} | {w} | {r['vote_c']:.2f} / {vote_w} | "
                      f"{_holders(r['holders_c'])} | {_holders(r['holders_w'])} |")
        return
    print("| run | accuracy | member accuracy on held classes | oracle vote | hard vote | P(unknown) held / unheld |")
    print("|---|---|---|---|---|---|")
    for d in args.run_dirs:
        r = diagnose(d)
        unknown = (f"{r['p_unknown_held']:.3f} / {r['p_unknown_unheld']:.3f}" if "p_unknown_held" in r else "—")
        print(f"| {d} | {100 * r['accuracy']:.1f} | {100 * r['member_acc_on_held']:.1f} | "
              f"{100 * r['oracle_vote']:.1f} | {100 * r['hard_vote']:.1f} | {unknown} |")


if __name__ == "__main__":
    main(sys.argv[1:])
