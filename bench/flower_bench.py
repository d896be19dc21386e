"""W3 (FedAvg, Fashion-MNIST, non-IID-2, K=100, C=0.2, E=5, B=15, SGD lr 0.1 as in configs/fedavg_fmnist.yaml) run through
Flower's simulation engine, for comparison with bench/round_bench.py:

    .venv/bin/python bench/flower_bench.py --rounds 1 --out bench/results/flower_W3.json

Flower 1.42's Message API: a ``ClientApp`` (``@client_app.train()``), a ``ServerApp``
whose main runs ``flwr.serverapp.strategy.FedAvg.start`` with a centralised
``evaluate_fn`` on the 10,000 test images, launched by ``flwr.simulation.run_simulation``
on the Ray backend. The work per client is fl_lightning's own: the same data loading,
non-IID-2 partition (seed 0), model (FashionCNN), initial weights (fl_lightning's FedAvg
``initial_state`` with seed 0), per-client batch order (``ClientBatches`` seeded with
``client_seed(seed, round, client)``), SGD and plain (unweighted) mean of the client
models: every reply carries the weight key ``"unit" = 1``, so Flower's weighted mean is
the plain mean. Only the sampling is Flower's own (``fraction_train`` = 0.2, 20 of 100
virtual SuperNodes at random), so the sampled clients differ from fl_lightning's.

Timing: ``wall_s`` covers only the federated rounds (``strategy.start``: sampling,
sending, local training, aggregation and the test-set evaluation after every round).
Before it, a warm-up query is sent to as many nodes as there are Ray actors, so each
actor loads and partitions the data set once (cached in this module, as a Flower user
would) outside the timed part; that warm-up and Ray's start-up are in ``wall_total_s``
(the whole ``run_simulation`` call) and reported as ``warmup_s``.

The ClientApp and ServerApp live in this module and are used as ``bench.flower_bench``
(not ``__main__``), so Ray's actors import the module (and keep its data cache) instead
of receiving pickled copies of the functions.
"""

from __future__ import annotations

import time

_T_IMPORT = time.perf_counter()  # process start, before the heavy imports (torch, flwr, ray)

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # so that Ray's workers can import bench.flower_bench
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # no network calls from Flower
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402

from fl_lightning.client import client_seed  # noqa: E402
from fl_lightning.config import DataConfig, OptimizerConfig, PartitionConfig  # noqa: E402
from fl_lightning.data import ClientBatches, load_dataset, partition_clients  # noqa: E402
from fl_lightning.models import FashionCNN  # noqa: E402
from fl_lightning.strategies import FedAvg as FlFedAvg  # noqa: E402

torch.set_num_threads(1)

FMNIST_DIR = "/usr/share/datasets/fashion-mnist"

# ---- per-process data cache (one per Ray actor, and one in the driver) --------------------
_CACHE: dict = {}


def get_data(num_clients: int, labels_per_client: int, seed: int):
    """Fashion-MNIST and its non-IID-l partition, loaded once per process."""
    key = (num_clients, labels_per_client, seed)
    if key not in _CACHE:
        data = load_dataset(DataConfig(name="fashion_mnist", idx_gz_dir=FMNIST_DIR))
        parts = partition_clients(data.train_y.numpy(),
                                  PartitionConfig(scheme="non_iid_l", num_clients=num_clients,
                                                  labels_per_client=labels_per_client), seed=seed)
        _CACHE.clear()
        _CACHE[key] = (data, parts)
    return _CACHE[key]


def new_model() -> torch.nn.Module:
    return FashionCNN(in_channels=1, image_size=28, num_outputs=10)


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _data_args(cfg) -> tuple[int, int, int]:
    return int(cfg["num-clients"]), int(cfg["labels-per-client"]), int(cfg["seed"])


# ---- ClientApp ---------------------------------------------------------------------------
client_app = ClientApp()


@client_app.query()
def warmup(msg: Message, context: Context) -> Message:
    """Loads this actor's data cache (one-time set-up, outside the timed rounds)."""
    torch.set_num_threads(1)
    start = time.perf_counter()
    get_data(*_data_args(msg.content["config"]))
    metrics = MetricRecord({"load-s": time.perf_counter() - start, "pid": os.getpid()})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    torch.set_num_threads(1)
    cfg = msg.content["config"]
    data, parts = get_data(*_data_args(cfg))
    k = int(context.node_config["partition-id"])
    idx = torch.from_numpy(parts[k])
    model = new_model()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=float(cfg["lr"]), momentum=float(cfg["momentum"]),
                          weight_decay=float(cfg["weight-decay"]))
    gen = torch.Generator().manual_seed(client_seed(int(cfg["seed"]), int(cfg["server-round"]), k))
    steps, loss_sum = 0, 0.0
    for _ in range(int(cfg["local-epochs"])):
        for x, y in ClientBatches(data.train_x, data.train_y, idx, int(cfg["batch-size"]), gen):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            steps += 1
            loss_sum += float(loss.detach())
    metrics = MetricRecord({
        "unit": 1,  # FedAvg weight: 1 for every client = plain (unweighted) mean
        "num-examples": len(idx),
        "steps": steps,
        "train-loss": loss_sum / max(steps, 1),
        "client-id": k,
        "pid": os.getpid(),
        "peak-rss-mb": _peak_rss_mb(),
    })
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics})
    return Message(content=content, reply_to=msg)


def train_metrics_aggr(records: list[RecordDict], weighting_key: str) -> MetricRecord:
    """Sum of steps/examples, mean loss, and the largest actor RSS seen this round."""
    ms = [next(iter(r.metric_records.values())) for r in records]
    peaks: dict[int, float] = {}
    for m in ms:
        peaks[int(m["pid"])] = max(peaks.get(int(m["pid"]), 0.0), float(m["peak-rss-mb"]))
    RESULT.setdefault("sampled_clients", []).append(sorted(int(m["client-id"]) for m in ms))
    RESULT.setdefault("actor_peak_rss_mb", {})
    for pid, p in peaks.items():
        RESULT["actor_peak_rss_mb"][str(pid)] = max(RESULT["actor_peak_rss_mb"].get(str(pid), 0.0), p)
    return MetricRecord({
        "clients": len(ms),
        "steps": sum(int(m["steps"]) for m in ms),
        "num-examples": sum(int(m["num-examples"]) for m in ms),
        "train-loss": float(np.mean([float(m["train-loss"]) for m in ms])),
    })


# ---- ServerApp ---------------------------------------------------------------------------
server_app = ServerApp()
SETTINGS: dict = {}  # filled by main() before run_simulation
RESULT: dict = {}  # filled by the ServerApp


@torch.inference_mode()
def test_accuracy(state: dict) -> float:
    data, _ = get_data(SETTINGS["num_clients"], SETTINGS["labels_per_client"], SETTINGS["seed"])
    model = new_model()
    model.load_state_dict(state)
    correct = 0
    for start in range(0, len(data.test_x), 500):
        pred = model(data.test_x[start:start + 500]).argmax(1)
        correct += int((pred == data.test_y[start:start + 500]).sum())
    return correct / len(data.test_x)


def initial_state(seed: int) -> dict:
    """fl_lightning's FedAvg initial weights for this seed."""
    strategy = FlFedAvg(weighted=False)
    strategy.setup(new_model(), 10, OptimizerConfig(name="sgd", lr=SETTINGS["lr"]), "loop")
    return strategy.initial_state(torch.Generator().manual_seed(seed))


@server_app.main()
def server_main(grid: Grid, context: Context) -> None:
    s = SETTINGS
    torch.set_num_threads(s["server_threads"])
    data_cfg = {"num-clients": s["num_clients"], "labels-per-client": s["labels_per_client"], "seed": s["seed"]}

    # Wait until every virtual SuperNode is registered, then warm up the actors.
    while len(list(grid.get_node_ids())) < s["num_clients"]:
        time.sleep(0.05)
    t_warm = time.perf_counter()
    nodes = sorted(grid.get_node_ids())[: s["num_actors"]]
    replies = grid.send_and_receive([
        Message(content=RecordDict({"config": ConfigRecord(data_cfg)}), message_type=MessageType.QUERY, dst_node_id=n)
        for n in nodes])
    errors = [r.error.reason for r in replies if r.has_error()]
    if errors:
        raise RuntimeError(f"warm-up failed: {errors}")
    RESULT["warmup_s"] = time.perf_counter() - t_warm
    RESULT["warmup_actor_pids"] = sorted({int(next(iter(r.content.metric_records.values()))["pid"]) for r in replies})

    strategy = FedAvg(
        fraction_train=s["client_fraction"],
        fraction_evaluate=0.0,  # W3 evaluates the global model on the test set only
        min_train_nodes=1,
        min_available_nodes=s["num_clients"],
        weighted_by_key="unit",
        train_metrics_aggr_fn=train_metrics_aggr,
    )
    train_config = ConfigRecord({
        **data_cfg, "lr": s["lr"], "momentum": 0.0, "weight-decay": 0.0,
        "local-epochs": s["local_epochs"], "batch-size": s["batch_size"],
    })
    round_ends: list[float] = []
    accuracies: list[float] = []

    def evaluate_fn(server_round: int, arrays: ArrayRecord):
        if server_round == 0:  # no evaluation of the initial model (not part of W3's rounds)
            return None
        acc = test_accuracy(arrays.to_torch_state_dict())
        accuracies.append(acc)
        round_ends.append(time.perf_counter())
        return MetricRecord({"accuracy": acc})

    initial = ArrayRecord(initial_state(s["seed"]))
    start = time.perf_counter()
    result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=s["rounds"],
                            train_config=train_config, evaluate_fn=evaluate_fn)
    RESULT["wall_s"] = time.perf_counter() - start
    RESULT["round_s"] = [b - a for a, b in zip([start] + round_ends[:-1], round_ends)]
    RESULT["accuracy_per_round"] = accuracies
    RESULT["train_metrics_per_round"] = {int(r): dict(m) for r, m in result.train_metrics_clientapp.items()}


# ---- driver ------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "flower_W3.json"))
    ap.add_argument("--num-clients", type=int, default=100)
    ap.add_argument("--labels-per-client", type=int, default=2)
    ap.add_argument("--client-fraction", type=float, default=0.2)
    ap.add_argument("--local-epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=15)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--total-cpus", type=int, default=os.cpu_count() or 1,
                    help="CPUs given to Ray (default: all cores)")
    ap.add_argument("--client-cpus", type=float, default=1.0,
                    help="num_cpus per ClientApp actor (actors = total/client)")
    ap.add_argument("--server-threads", type=int, default=1, help="torch threads of the ServerApp (evaluation)")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()

    t_total = time.perf_counter()
    import flwr
    import ray
    from flwr.simulation import run_simulation

    # Use the importable module, not __main__ (see the module docstring).
    import bench.flower_bench as fb

    num_actors = int(args.total_cpus // args.client_cpus)
    fb.SETTINGS.update(
        rounds=args.rounds, num_clients=args.num_clients, labels_per_client=args.labels_per_client,
        client_fraction=args.client_fraction, local_epochs=args.local_epochs, batch_size=args.batch_size,
        lr=args.lr, seed=args.seed, server_threads=args.server_threads, num_actors=num_actors)

    t_load = time.perf_counter()
    data, parts = fb.get_data(args.num_clients, args.labels_per_client, args.seed)  # server's test set
    driver_load_s = time.perf_counter() - t_load
    per_client_steps = [args.local_epochs * -(-len(p) // args.batch_size) for p in parts]

    backend_config = {
        "init_args": {"num_cpus": args.total_cpus, "num_gpus": 0, "include_dashboard": False},
        "client_resources": {"num_cpus": args.client_cpus, "num_gpus": 0.0},
    }
    t_sim = time.perf_counter()
    run_simulation(server_app=fb.server_app, client_app=fb.client_app, num_supernodes=args.num_clients,
                   backend_config=json.loads(json.dumps(backend_config)), verbose_logging=args.verbose)
    sim_s = time.perf_counter() - t_sim
    if ray.is_initialized():
        ray.shutdown()
    wall_total = time.perf_counter() - t_total
    wall_process = time.perf_counter() - _T_IMPORT

    r = fb.RESULT
    if "wall_s" not in r:
        raise SystemExit(f"the simulation did not finish its rounds: {r}")
    train_metrics = r["train_metrics_per_round"]
    steps = [int(m["steps"]) for _, m in sorted(train_metrics.items())]
    actor_peaks = r.get("actor_peak_rss_mb", {})
    out = {
        "workload": "W3",
        "engine": "flower-simulation",
        "api": "Message API: flwr.serverapp.ServerApp + flwr.serverapp.strategy.FedAvg.start, "
               "flwr.clientapp.ClientApp, flwr.simulation.run_simulation (Ray backend)",
        "flwr_version": flwr.__version__,
        "ray_version": ray.__version__,
        "torch_version": torch.__version__,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "rounds": args.rounds,
        "wall_s": r["wall_s"],
        "round_s": r["round_s"],
        "wall_total_s": wall_total,
        "wall_total_note": "whole process after imports: driver data load + run_simulation "
                           "(Ray start-up, actor start-up, warm-up data loading, rounds, shut-down)",
        "wall_process_s": wall_process,
        "wall_process_note": "as wall_total_s plus the imports of torch, flwr, ray and fl_lightning",
        "run_simulation_s": sim_s,
        "driver_data_load_s": driver_load_s,
        "warmup_s": r["warmup_s"],
        "warmup_actor_pids": r["warmup_actor_pids"],
        "warmup_note": "query to one node per actor so every Ray actor loads the data once; "
                       "includes actor start-up still in progress; not in wall_s",
        "clients_per_round": [int(m["clients"]) for _, m in sorted(train_metrics.items())],
        "sampled_clients": r["sampled_clients"],
        "local_steps_per_round": steps,
        "samples_per_round": [int(m["num-examples"]) for _, m in sorted(train_metrics.items())],
        "steps_per_s": sum(steps) / r["wall_s"],
        "mean_local_steps_per_client": float(np.mean(per_client_steps)),
        "test_accuracy_per_round": r["accuracy_per_round"],
        "final_accuracy": r["accuracy_per_round"][-1],
        "train_loss_per_round": [float(m["train-loss"]) for _, m in sorted(train_metrics.items())],
        "setting": {"dataset": "fashion_mnist", "partition": f"non_iid_{args.labels_per_client}",
                    "num_clients": args.num_clients, "client_fraction": args.client_fraction,
                    "local_epochs": args.local_epochs, "batch_size": args.batch_size,
                    "optimizer": {"name": "sgd", "lr": args.lr, "momentum": 0.0, "weight_decay": 0.0},
                    "model": "FashionCNN(1, 28, 10)", "aggregation": "plain mean (weight key 'unit'=1)",
                    "sampling": "Flower FedAvg.configure_train (random.sample of int(C*K) nodes)",
                    "evaluation": "server-side evaluate_fn on the 10,000 test images after every round",
                    "seed": args.seed},
        "backend_config": backend_config,
        "num_actors": num_actors,
        "torch_threads": {"client_actors": 1, "server": args.server_threads},
        "peak_rss_mb": {
            "driver_self": _peak_rss_mb(),
            "children": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
            "largest_actor": max(actor_peaks.values(), default=None),
            "actors": actor_peaks,
            "note": "driver_self = this process (ServerApp, Ray driver); children = largest reaped "
                    "child (Ray's daemons after shut-down); actors = ru_maxrss reported by each "
                    "ClientApp actor process",
        },
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "python": platform.python_version()},
        "device": "cpu",
    }
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(json.dumps({k: out[k] for k in ("wall_s", "wall_total_s", "warmup_s", "final_accuracy",
                                         "local_steps_per_round", "peak_rss_mb")}, indent=1))


if __name__ == "__main__":
    main()
