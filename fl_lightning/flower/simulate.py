"""The same ServerApp and ClientApp on Flower's Simulation Engine (Ray), for client counts
beyond one process per client:

    python -m fl_lightning.flower.simulate --config configs/flower_fedova_fmnist.yaml

One virtual SuperNode per client (Flower sets its ``partition-id``); ``--cpus-per-client``
sets how many run at once. Needs ``pip install -e ".[bench]"`` (flwr[simulation])."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Optional


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--overrides", default="")
    parser.add_argument("--cpus-per-client", type=float, default=1.0)
    args = parser.parse_args(argv)
    os.environ["FL_LIGHTNING_FLOWER_CONFIG"] = str(Path(args.config).resolve())
    os.environ["FL_LIGHTNING_FLOWER_OVERRIDES"] = args.overrides
    os.environ["FL_LIGHTNING_FLOWER_CWD"] = str(Path.cwd())
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    from flwr.simulation import run_simulation

    from fl_lightning.settings import build_federation
    from fl_lightning.flower.client_app import app as client_app
    from fl_lightning.flower.server_app import app as server_app

    _, _, federation = build_federation(["fit", "--config", args.config, *args.overrides.split()])
    run_simulation(server_app=server_app, client_app=client_app, num_supernodes=federation.partition.num_clients,
                   backend_config={"client_resources": {"num_cpus": args.cpus_per_client, "num_gpus": 0.0}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
