"""Tables of the ATHENA-FL experiments (experiments/athena.sh) from their summary.json files:
clustering (Section 5.1), accuracy (Figures 6, 9, 10) and communication (Table 3)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/athena")
SETTINGS = {"C2": "non-IID, 2 classes/client", "C5": "non-IID, 5 classes/client", "D05": "Dirichlet(0.5) (LDA)",
            "IID": "IID"}
DATASETS = {"fmnist": "FMNIST", "mnist": "MNIST", "cifar": "CIFAR-10"}


def load(name: str):
    path = ROOT / name / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else None


def pct(x):
    return "—" if x is None else f"{100 * x:.1f}"


def best(summary) -> str:
    return pct(max(m["test/accuracy"] for m in summary["history"] if "test/accuracy" in m))


def mb(x):
    return "—" if x is None else f"{x / 1e6:.2f}"


def main() -> None:
    print("## Clustering (probe: MobileNet, 1 local epoch; DBSCAN, auto eps, l2 scaling)\n")
    print("| data | partition | on (run) | clients clustered | clusters | noise | ARI | bytes up / client | "
          "saving vs all weights |")
    print("|---|---|---|---|---|---|---|---|---|")
    for ds in DATASETS:
        for s in SETTINGS:
            for on in ("last_layer", "all"):
                for name in (f"{ds}_{s}_probe_{on}",) + ((f"{ds}_{s}_athena",) if on == "last_layer" else ()):
                    summary = load(name)
                    if summary is None:
                        continue
                    p = summary["history"][0]
                    up = p["clustering/bytes_per_client"]
                    uploaded = p["bytes/up"] // up
                    saving = 100 * (1 - up / p["clustering/bytes_all_weights_per_client"])
                    # Dirichlet: every client's label set differs, so the ARI against them means nothing
                    ari = "n/a" if s == "D05" else f"{p['clustering/ari']:.3f}"
                    print(f"| {DATASETS[ds]} | {SETTINGS[s]} | {on} ({name}) | {uploaded} | {p['clustering/clusters']} | "
                          f"{p['clustering/noise_clients']} | {ari} | {up:,.0f} B | {saving:.2f} % |")
    print("\n## Accuracy and communication to convergence (seed 0)\n")
    print("| data | partition | ATHENA-FL acc. % last (best) [rounds] | detectors (converged) | E[e_dec] | "
          "B_ova / client (Eq. 5) | FedAvg-MobileNet acc. % last (best) [rounds] | E[e_cmc] | B_cmc / client (Eq. 6) | "
          "economy | measured bytes ATHENA / FedAvg | wall time ATHENA / FedAvg |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for ds in DATASETS:
        for s in SETTINGS:
            a, f = load(f"{ds}_{s}_athena"), load(f"{ds}_{s}_fedavg_mobilenet")
            if a is None and f is None:
                continue
            row = [DATASETS[ds], SETTINGS[s]]
            if a:
                c = a["communication"]
                row += [f"{pct(a['last_accuracy'])} ({best(a)}) [{a['rounds'] - 1}+1]",
                        f"{c['detectors']} ({c['detectors_converged']})",
                        f"{c['expected_rounds_to_convergence']:.1f}", f"{mb(c['bytes_per_client_eq'])} MB"]
            else:
                row += ["—"] * 4
            if f:
                c = f["communication"]
                row += [f"{pct(f['last_accuracy'])} ({best(f)}) [{f['rounds']}]",
                        f"{c['rounds_to_convergence']}{'' if c['converged'] else ' (not converged)'}",
                        f"{mb(c['bytes_per_client_eq'])} MB"]
            else:
                row += ["—"] * 3
            if a and f:
                economy = 1 - a["communication"]["bytes_per_client_eq"] / max(f["communication"]["bytes_per_client_eq"], 1)
                row += [f"{100 * economy:.1f} %",
                        f"{mb(a['communication']['bytes_measured_total'])} / {mb(f['bytes_total'])} MB",
                        f"{a['wall_time_s']:.0f} / {f['wall_time_s']:.0f} s"]
            else:
                row += ["—", "—", "—"]
            print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
