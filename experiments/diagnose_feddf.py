"""Where one-round FedDF's accuracy goes: trains one run as the command line would, keeps the
clients' models the server received, and prints on the test half the accuracy of each step
of FedDF's server: the sample-weighted average of the models (one-round FedAvg), the ensemble
FedDF distils (the members' mean logits, Lin et al.), the ensemble of mean probabilities
(close-set voting's vote), and the distilled student (the run's result); then how far the
student follows its teacher on the public half (agreement of their top classes) and the spread
of the members' logits (a member with large logits outweighs the others in a mean of logits,
FedOV Appendix B.8).

    .venv/bin/python experiments/diagnose_feddf.py --config configs/feddf_oneshot_fmnist.yaml \
        --partition.scheme dirichlet --partition.dirichlet_beta 0.5 --federation.local_epochs 20 \
        --seed 0 --run.dir /tmp/feddf_diag

Settings are those of ``python -m fl_lightning fit``; prints one Markdown table and writes it
to ``diagnosis.json`` in the run's folder. The averaged model is also scored on the whole test
set, as one-round FedAvg's own runs are: a FedDF run at the paper's E then measures FedAvg's cell
too, at no extra training (its clients train exactly as FedAvg's: tests/test_diagnose_feddf.py).
FedNova's clients train as FedAvg's as well, and only its server differs (each update
normalised by the client's local steps); with SGD (the code reading's optimizer) the same
clients therefore also give one-round FedNova's model and cell.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


def accuracy(logits_or_probs: torch.Tensor, y: torch.Tensor) -> float:
    return 100.0 * float((logits_or_probs.argmax(1) == y).float().mean())


def diagnose(argv: list[str]):
    """(the measures, the servers' models {"fedavg": state, "fednova": state or None}, the
    finished Federation) of one run."""
    from fl_lightning.algorithms.baselines.fedavg import FedAvg
    from fl_lightning.algorithms.baselines.fednova import FedNova
    from fl_lightning.data.datasets import load_dataset
    from fl_lightning.settings import build_federation
    from fl_lightning.strategy import model_logits

    _, _, fed = build_federation(["fit", "--run.logger", "none", *argv])
    strategy = fed.strategy
    received = {}
    aggregate = strategy.aggregate

    def keep_results(state, results):
        received["start"], received["results"] = state, results
        return aggregate(state, results)

    strategy.aggregate = keep_results
    fed.fit()
    results = received["results"]
    x, y = fed._data.test_x.cpu(), fed._data.test_y.cpu()
    public = fed.public_x.cpu()

    @torch.no_grad()
    def logits(params, inputs):
        return torch.cat([model_logits(strategy.template, params, inputs[i:i + 2000])
                          for i in range(0, len(inputs), 2000)]).float()

    members = torch.stack([logits(r.params, x) for r in results])  # (N, B, C)
    members_public = torch.stack([logits(r.params, public) for r in results])
    averaged, _ = FedAvg.aggregate(strategy, fed.state, results)  # FedDF's first step, as its server takes it
    student = logits(fed.state, x)
    teacher_public = members_public.mean(0).softmax(1)
    whole = load_dataset(fed.data_cfg)  # the run's test set lost its public half to the server
    measures = {
        "averaged model (one-round FedAvg)": accuracy(logits(averaged, x), y),
        "averaged model on the whole test set (FedAvg's cell)": accuracy(logits(averaged, whole.test_x), whole.test_y),
        "mean-logit ensemble (FedDF's teacher)": accuracy(members.mean(0), y),
        "mean-probability ensemble (close-set vote)": accuracy(members.softmax(2).mean(0), y),
        "distilled student (the run)": accuracy(student, y),
        "student = teacher on the public half": accuracy(logits(fed.state, public), teacher_public.argmax(1)),
        "members' logit std, min-max": (float(members.std(dim=(1, 2)).min()), float(members.std(dim=(1, 2)).max())),
    }
    normalised = None
    if strategy.optimizer.name == "sgd":  # FedNova's a_i assumes SGD steps (FedNova.setup refuses others)
        # FedNova's own server, from the state the round started at, as it takes it
        normalised, _ = FedNova.aggregate(strategy, received["start"], results)
        measures["FedNova's server on the same clients, whole test set (FedNova's cell)"] = accuracy(
            logits(normalised, whole.test_x), whole.test_y)
    return measures, {"fedavg": averaged, "fednova": normalised}, fed


def main(argv: list[str]) -> None:
    out, _, fed = diagnose(argv)
    (Path(fed.run_dir) / "diagnosis.json").write_text(json.dumps(out, indent=1) + "\n")
    print("| measure | value |\n|---|---|")
    for name, value in out.items():
        text = f"{value[0]:.1f}-{value[1]:.1f}" if isinstance(value, tuple) else f"{value:.1f} %"
        print(f"| {name} | {text} |")


if __name__ == "__main__":
    main(sys.argv[1:])
