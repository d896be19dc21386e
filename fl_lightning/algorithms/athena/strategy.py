"""ATHENA-FL (de Souza et al., Sections 4-5): clients clustered on the last layer of a
probe model, one-vs-all detectors trained by FedAvg inside each cluster, every detector
kept in a database, and a one-vs-all model composed from detectors of any cluster.

Round 1 is Steps 1-3 of the paper's Figure 2: every client trains the broadcast multi-class
probe (``probe_architecture``, ``probe_epochs`` local epochs) and uploads only its last
layer (``cluster_on``); the server clusters those vectors with DBSCAN
(``fl_lightning.algorithms.athena.clustering``) and creates one detector per (cluster, class held in the
cluster). Rounds 2.. are Step 4: in every cluster with a detector still training,
``federation.client_fraction`` of its clients (at least one) are sampled; each trains the
cluster's detectors of the classes it holds (``federation.local_epochs``, batch size B)
and the server averages each detector over the clients that trained it, weighted by their
sample counts (Eq. 4). After each round every cluster's clients measure the detectors on
their validation splits; a detector whose accuracy moved by at most ``tol`` (relative; the
paper's 0.001 %) since the previous round has converged (Section 5.3). As in the paper,
every detector keeps training for the whole budget (``federation.rounds``) and the
criterion only records its convergence round, from which E[e_dec] (Eq. 5) is estimated;
with ``stop_converged`` a converged detector stops training instead. Step 5: every updated detector is written to the
detector database (``fl_lightning.algorithms.athena.detector_db``) in one transaction per round. Step 6:
evaluation composes a one-vs-all model from all clusters' detectors
(``fl_lightning.algorithms.athena.composition``, ``composition`` criterion).

Everything the strategy needs across rounds lives in the checkpointed state: the probe,
each client's cluster, the stacked detectors and their cluster, class, validation accuracy
and convergence round.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal, Optional

import numpy as np
import torch
from torch import Tensor

from fl_lightning.aggregation import one_vs_all_groups
from fl_lightning.algorithms.athena.clustering import DBSCANClustering, label_set_ids
from fl_lightning.algorithms.athena.composition import Criterion, compose
from fl_lightning.convergence import DEFAULT_TOL, has_converged
from fl_lightning.models import last_layer_names
from fl_lightning.algorithms.baselines.classifier import classifier_task
from fl_lightning.algorithms.fedova.detectors import detector_task
from fl_lightning.modules.stacking import StackedModel, stack_models
from fl_lightning.messages import prefixed
from fl_lightning.strategy import ClientResult, ClientTask, State, Strategy, sample_clients

PROBE, DET = "probe.", "detectors."
CLIENT_CLUSTER, PROBE_VECTORS = "athena.client_cluster", "athena.probe_vectors"
DET_CLUSTER, DET_CLASS = "athena.detector_cluster", "athena.detector_class"
VAL_ACC, PREV_VAL_ACC, VAL_N = "athena.val_accuracy", "athena.prev_val_accuracy", "athena.val_samples"
CONVERGED_ROUND, DET_ROUND, STABLE = "athena.converged_round", "athena.detector_rounds", "athena.stable_rounds"


class AthenaFL(Strategy):
    """Args:
    probe_architecture: the multi-class probe clients train for clustering (the paper's
        whole-model size, 12.98 MB, and last layer, 41.48 kB, are MobileNet's).
    probe_epochs: local epochs of the probe (its single round).
    cluster_on: last_layer (the paper) | all (every probe parameter, for the comparison of
        Section 5.1).
    clustering: DBSCAN's settings (eps, min_samples, metric, scaling, noise handling).
    tol: the convergence tolerance, relative (1e-5 = the paper's 0.001 %).
    patience: consecutive rounds the accuracy must stay within tol (1: the paper's criterion;
        more guards against a detector that merely repeats a constant prediction).
    stop_converged: False (default, the paper: 200 epochs for every detector): train every
        detector for all rounds; the criterion only estimates E[e_dec]. True: converged
        detectors stop training (and cost no more bytes); the run ends when all have converged.
    composition: most_classes | val_accuracy | ensemble (fl_lightning.algorithms.athena.composition).
    db_url: the detector database (SQLAlchemy URL); unset: sqlite in the run folder.
    weighted: average detectors weighted by client sample counts (Eq. 4's p_kn) rather than plainly.
    """

    name = "athena_fl"

    def __init__(self, probe_architecture: Literal["mobilenet", "mobilenet_v2", "simple_cnn", "athena_cnn"] = "mobilenet",
                 probe_epochs: int = 1, cluster_on: Literal["last_layer", "all"] = "last_layer",
                 clustering: Optional[DBSCANClustering] = None, tol: float = DEFAULT_TOL, stop_converged: bool = False,
                 composition: Criterion = "most_classes", db_url: Optional[str] = None, weighted: bool = True,
                 patience: int = 1) -> None:
        if probe_epochs < 1:
            raise ValueError(f"algorithm.probe_epochs={probe_epochs} must be >= 1")
        if patience < 1:
            raise ValueError(f"algorithm.patience={patience} must be >= 1")
        if tol < 0:
            raise ValueError(f"algorithm.tol={tol} must be >= 0")
        self.probe_architecture, self.probe_epochs, self.cluster_on = probe_architecture, probe_epochs, cluster_on
        self.clustering = clustering or DBSCANClustering()
        self.tol, self.stop_converged, self.composition = tol, stop_converged, composition
        self.db_url, self.weighted, self.patience = db_url, weighted, patience
        self._db = None
        self._label_sets: dict[int, tuple[int, ...]] = {}
        self._composed: Optional[tuple[Any, Any]] = None

    def num_outputs(self, num_classes: int) -> int:
        return 1  # the run's architecture is the detector

    # ---- setup and state -------------------------------------------------------------
    def setup(self, template, num_classes, optimizer, stacking, context=None) -> None:
        super().setup(template, num_classes, optimizer, stacking, context)
        if self.context.client_validation is None:
            raise ValueError("AthenaFL measures convergence on the clients' validation splits: set "
                             "partition.validation_fraction > 0 (e.g. 0.1)")
        if self.context.make_model is None:
            raise ValueError("AthenaFL needs the server context's make_model to build its probe")
        self.probe = self.context.make_model(num_classes, self.probe_architecture)
        names = [n for n, _ in self.probe.named_parameters()]
        self.upload_names = tuple(last_layer_names(self.probe) if self.cluster_on == "last_layer" else names)
        self.run_name = str(self.context.run_dir)
        self._db = self._open_database()  # now: a URL that cannot be opened fails before any training

    def initial_state(self, generator: torch.Generator) -> State:
        (probe,) = self._fresh(generator, self.probe)
        state = {PROBE + k: v.detach().clone() for k, v in probe.state_dict().items()}
        for name, p in self.template.named_parameters():
            state[DET + name] = torch.zeros((0, *p.shape), dtype=p.dtype)
        k = self.context.num_clients
        state.update({CLIENT_CLUSTER: torch.full((k,), -1, dtype=torch.long), PROBE_VECTORS: torch.zeros(0),
                      DET_CLUSTER: torch.zeros(0, dtype=torch.long), DET_CLASS: torch.zeros(0, dtype=torch.long),
                      VAL_ACC: torch.zeros(0, dtype=torch.float64), PREV_VAL_ACC: torch.zeros(0, dtype=torch.float64),
                      VAL_N: torch.zeros(0, dtype=torch.long), STABLE: torch.zeros(0, dtype=torch.long), CONVERGED_ROUND: torch.zeros(0, dtype=torch.long), DET_ROUND: torch.zeros(1, dtype=torch.long)})
        self._init_generator = torch.Generator().manual_seed(int(torch.randint(2**31 - 1, (1,), generator=generator)))
        return state

    def _fresh(self, generator: torch.Generator, model, count: int = 1):
        saved, self.template = self.template, model
        try:
            return self.fresh_models(generator, count)
        finally:
            self.template = saved

    @staticmethod
    def clustered(state: State) -> bool:
        return bool((state[CLIENT_CLUSTER] >= 0).any())

    def _active(self, state: State) -> Tensor:
        """Detectors still training (all of them without ``stop_converged``)."""
        if not self.stop_converged:
            return torch.ones_like(state[CONVERGED_ROUND], dtype=torch.bool)
        return state[CONVERGED_ROUND] == 0

    # ---- rounds ----------------------------------------------------------------------
    def select_clients(self, state, generator, num_clients, fraction) -> list[int]:
        if not self.clustered(state):
            return list(range(num_clients))  # Steps 1-2: every client trains the probe
        active_clusters = set(state[DET_CLUSTER][self._active(state)].tolist())
        chosen = []
        for g in sorted(active_clusters):  # a fraction of each cluster's clients (Section 5)
            members = torch.nonzero(state[CLIENT_CLUSTER] == g).flatten()
            chosen += members[sample_clients(generator, len(members), fraction)].tolist()
        return sorted(chosen)

    def is_finished(self, state: State) -> bool:
        return self.clustered(state) and self.stop_converged and not bool(self._active(state).any())

    def configure_client(self, state: State, client_id: int, labels: np.ndarray) -> Optional[ClientTask]:
        classes = tuple(int(c) for c in np.unique(labels))
        if not classes:
            return None
        self._label_sets[client_id] = classes  # what the client reports; the ground truth of the ARI
        if not self.clustered(state):
            params = {k: v.clone() for k, v in prefixed(state, PROBE).items()}
            # the probe trains once: no later round reads what optimizer.keep_state would keep
            once = replace(self.optimizer, keep_state=False)
            return classifier_task(client_id, params, once, architecture=self.probe_architecture,
                                   num_outputs=self.num_classes, classes=classes, epochs=self.probe_epochs,
                                   upload=self.upload_names)
        rows = self._rows(state, client_id, classes)
        if not rows:
            return None
        index = torch.tensor(rows)
        params = {k: v[index].clone() for k, v in prefixed(state, DET).items()}
        return detector_task(client_id, params, state[DET_CLASS][index].tolist(), self.optimizer, self.stacking)

    def _rows(self, state: State, client_id: int, classes) -> list[int]:
        """The active detectors of the client's cluster for the classes it holds."""
        g = int(state[CLIENT_CLUSTER][client_id])
        mask = (state[DET_CLUSTER] == g) & self._active(state) & torch.isin(state[DET_CLASS], torch.tensor(classes))
        return torch.nonzero(mask).flatten().tolist()

    def configure_callbacks(self) -> list:
        """Aggregation, then Step 3 after the probe round (callbacks/clustering.py)."""
        from fl_lightning.callbacks.clustering import ClientClustering

        return [*super().configure_callbacks(), ClientClustering()]

    def aggregate(self, state: State, results: list[ClientResult]) -> tuple[State, dict[str, Any]]:
        """Step 4's averaging within each cluster. The probe round has nothing to average: its
        vectors are clustered next (``cluster``, by the ClientClustering callback)."""
        if not self.clustered(state):
            return state, {}
        return self._train_detectors(state, results)

    # ---- Step 3: clustering ------------------------------------------------------------
    def cluster(self, state: State, results: list[ClientResult]) -> tuple[State, dict[str, Any]]:
        if len(results) < 2:
            raise ValueError(f"ATHENA-FL's clustering needs at least 2 clients with data, got {len(results)}")
        results = sorted(results, key=lambda r: r.client_id)
        vectors = torch.stack([torch.cat([r.params[n].flatten().float() for n in self.upload_names])
                               for r in results]).numpy()
        labels, facts = self.clustering.fit(vectors)
        new = dict(state)
        cluster = torch.full_like(state[CLIENT_CLUSTER], -1)
        for r, g in zip(results, labels):
            cluster[r.client_id] = int(g)
        det_cluster, det_class = [], []
        for g in range(int(labels.max()) + 1):
            held = sorted({c for r, lg in zip(results, labels) if lg == g for c in r.classes})
            det_cluster += [g] * len(held)
            det_class += held
        stacked = stack_models(self._fresh(self._init_generator, self.template, len(det_class)))
        new.update({DET + k: v for k, v in stacked.items()})
        r_count = len(det_class)
        new.update({CLIENT_CLUSTER: cluster, PROBE_VECTORS: torch.from_numpy(vectors),
                    DET_CLUSTER: torch.tensor(det_cluster, dtype=torch.long),
                    DET_CLASS: torch.tensor(det_class, dtype=torch.long),
                    VAL_ACC: torch.full((r_count,), float("nan"), dtype=torch.float64),
                    PREV_VAL_ACC: torch.full((r_count,), float("nan"), dtype=torch.float64),
                    VAL_N: torch.zeros(r_count, dtype=torch.long), STABLE: torch.zeros(r_count, dtype=torch.long),
                    CONVERGED_ROUND: torch.zeros(r_count, dtype=torch.long)})
        probe_params = {n: p for n, p in self.probe.named_parameters()}
        upload = sum(probe_params[n].numel() * 4 for n in self.upload_names)
        whole = sum(p.numel() * 4 for p in probe_params.values())
        out = {"clustering/clusters": int(labels.max()) + 1, "clustering/noise_clients": facts["noise_clients"],
               "clustering/eps": facts["eps"], "clustering/bytes_per_client": upload,
               "clustering/bytes_all_weights_per_client": whole,
               "clustering/saving_pct": 100.0 * (1 - upload / whole), "detectors/total": r_count}
        truth = [self._label_sets.get(r.client_id, tuple(r.classes)) for r in results]
        from sklearn.metrics import adjusted_rand_score

        out["clustering/ari"] = float(adjusted_rand_score(label_set_ids(truth), labels))
        return new, out

    def assign_new_client(self, state: State, vector: Tensor) -> int:
        """Section 4.2: a client absent at clustering trains the probe, uploads its vector,
        and joins the cluster of its nearest known client (within eps) or a new one."""
        known = state[PROBE_VECTORS].numpy()
        clustered = state[CLIENT_CLUSTER][state[CLIENT_CLUSTER] >= 0].numpy()
        return self.clustering.assign(known, clustered, vector.flatten().float().numpy())

    # ---- Step 4: detectors inside each cluster -------------------------------------------
    def _train_detectors(self, state: State, results: list[ClientResult]) -> tuple[State, dict[str, Any]]:
        detectors = prefixed(state, DET)
        updates = [(self._rows(state, r.client_id, r.classes), r.params, r.num_samples) for r in results]
        averaged, group_sizes = one_vs_all_groups(detectors, updates, self.weighted)
        new = dict(state)
        new.update({DET + k: v for k, v in averaged.items()})
        new[DET_ROUND] = state[DET_ROUND] + 1
        updated = sorted(group_sizes)
        self._validate(new, updated)
        self._write(new, updated)
        converged = new[CONVERGED_ROUND] > 0
        return new, {"detectors/trained": len(updated), "detectors/converged": int(converged.sum()),
                     "detectors/total": int(len(converged)),
                     "detectors/mean_val_accuracy": float(new[VAL_ACC][~torch.isnan(new[VAL_ACC])].mean())
                     if updated else float("nan")}

    @torch.inference_mode()
    def _validate(self, state: State, rows: list[int]) -> None:
        """Binary accuracy of each updated detector on its cluster's pooled validation
        splits, and Section 5.3's convergence test against the previous round's value."""
        val, prev, conv = state[VAL_ACC].clone(), state[PREV_VAL_ACC].clone(), state[CONVERGED_ROUND].clone()
        counts, stable = state[VAL_N].clone(), state[STABLE].clone()
        for g in sorted({int(state[DET_CLUSTER][r]) for r in rows}):
            members = torch.nonzero(state[CLIENT_CLUSTER] == g).flatten().tolist()
            x, y = self.context.client_validation(members)
            group = [r for r in rows if int(state[DET_CLUSTER][r]) == g]
            if len(y) == 0:
                continue
            accuracy = self._binary_accuracy(state, group, x, y)
            counts[torch.tensor(group)] = len(y)
            for row, acc in zip(group, accuracy.tolist()):
                previous = None if torch.isnan(val[row]) else float(val[row])
                prev[row], val[row] = val[row], acc
                stable[row] = stable[row] + 1 if has_converged(previous, acc, self.tol) else 0
                if conv[row] == 0 and stable[row] >= self.patience:
                    conv[row] = int(state[DET_ROUND])
        state.update({VAL_ACC: val, PREV_VAL_ACC: prev, CONVERGED_ROUND: conv, VAL_N: counts, STABLE: stable})
        self._composed = None

    # ---- Step 5: the detector database -------------------------------------------------
    def _open_database(self):
        from fl_lightning.algorithms.athena.detector_db import DetectorDatabase

        url = self.db_url
        if url is None:
            Path(self.context.run_dir).mkdir(parents=True, exist_ok=True)
            url = f"sqlite:///{Path(self.context.run_dir) / 'detectors.sqlite'}"
        return DetectorDatabase(url)

    def _write(self, state: State, rows: list[int]) -> None:
        from fl_lightning.algorithms.athena.detector_db import DetectorRecord

        records = []
        for row, d in zip(rows, self.describe(state, rows)):
            records.append(DetectorRecord(
                run=self.run_name, cluster=d.cluster, class_label=d.class_label, round=int(state[DET_ROUND]),
                converged=bool(state[CONVERGED_ROUND][row] > 0), val_accuracy=d.val_accuracy,
                val_samples=d.val_samples, cluster_classes=d.cluster_classes, architecture=self.architecture_name,
                in_channels=d.in_channels, image_size=d.image_size,
                params={k: v[row].clone() for k, v in prefixed(state, DET).items()}))
        self._db.put(records)

    @property
    def architecture_name(self) -> str:
        from fl_lightning.models import ARCHITECTURES

        return next((n for n, cls in ARCHITECTURES.items() if type(self.template) is cls), type(self.template).__name__)

    def describe(self, state: State, rows: Optional[list[int]] = None) -> list[SimpleNamespace]:
        """Per detector row: cluster, class, the cluster's classes, validation accuracy."""
        rows = list(range(len(state[DET_CLASS]))) if rows is None else rows
        in_channels, image_size = self.context.input_shape[0], self.context.input_shape[-1]
        out = []
        for row in rows:
            g = int(state[DET_CLUSTER][row])
            cluster_classes = tuple(sorted(set(state[DET_CLASS][state[DET_CLUSTER] == g].tolist())))
            acc = float(state[VAL_ACC][row])
            out.append(SimpleNamespace(cluster=g, class_label=int(state[DET_CLASS][row]), cluster_classes=cluster_classes,
                                       val_accuracy=-1.0 if np.isnan(acc) else acc,
                                       val_samples=int(state[VAL_N][row]), in_channels=in_channels,
                                       image_size=image_size))
        return out

    # ---- Step 6: the composed one-vs-all model ---------------------------------------------
    def composed_model(self, state: State, device):
        key = (id(state), int(state[DET_ROUND]))
        if self._composed is None or self._composed[0] != key:
            rows = list(range(len(state[DET_CLASS])))
            per_row = [{k: v[r] for k, v in prefixed(state, DET).items()} for r in rows]
            model, _ = compose(self.template, self.describe(state), per_row, self.num_classes, self.composition,
                               self.stacking)
            self._composed = (key, model.to(device))
        return self._composed[1]

    def predict_logits(self, state: State, x: Tensor) -> Tensor:
        if len(state[DET_CLASS]) == 0:
            return torch.zeros(x.shape[0], self.num_classes, device=x.device)
        return self.composed_model(state, x.device)(x)

    def extra_metrics(self, state: State, x: Tensor, y: Tensor, scores: Tensor) -> dict[str, float]:
        """Each detector's binary accuracy on the test set (the paper's Figures 4, 7, 8)."""
        if len(state[DET_CLASS]) == 0:
            return {}
        accuracy = self._binary_accuracy(state, list(range(len(state[DET_CLASS]))), x, y).tolist()
        return {f"detector_acc/g{g}_c{c}": acc
                for g, c, acc in zip(state[DET_CLUSTER].tolist(), state[DET_CLASS].tolist(), accuracy)}

    @torch.inference_mode()
    def _binary_accuracy(self, state: State, rows: list[int], x: Tensor, y: Tensor) -> Tensor:
        """Per detector row: how often (logit > 0) == (y is its class), in float64 on the CPU."""
        index = torch.tensor(rows)
        stacked = {k: v[index] for k, v in prefixed(state, DET).items()}
        model = StackedModel(self.template, stacked, mode=self.stacking).to(x.device).eval()
        logits = torch.cat([model(x[i:i + 500]).squeeze(-1) for i in range(0, len(x), 500)], dim=1)
        positives = y.unsqueeze(0) == state[DET_CLASS][index].to(y.device).unsqueeze(1)
        return ((logits > 0) == positives).double().mean(1).cpu()

    # ---- Section 5.3: communication ----------------------------------------------------------
    def communication_report(self, state: State, history: list[dict[str, Any]]) -> dict[str, Any]:
        """Eq. 5: B_ova = T_dec x R x E[e_dec] per client, E[e_dec] the mean over detectors of
        the detector rounds to convergence (the rounds trained, for one that never converged)."""
        r_count = len(state[DET_CLASS])
        t_dec = sum(v[0].numel() * v.element_size() for k, v in state.items() if k.startswith(DET)) if r_count else 0
        trained = int(state[DET_ROUND])
        rounds = [int(c) if c > 0 else trained for c in state[CONVERGED_ROUND].tolist()]
        expected = float(np.mean(rounds)) if rounds else 0.0
        probe = history[0] if history else {}
        return {
            "criterion": f"detector validation accuracy within {self.tol:.0e} (relative) of the previous round",
            "detector_bytes": int(t_dec), "detectors": r_count,
            "detectors_converged": int((state[CONVERGED_ROUND] > 0).sum()),
            "expected_rounds_to_convergence": expected,
            "bytes_per_client_eq": int(t_dec * r_count * expected),
            "clustering_bytes_per_client": probe.get("clustering/bytes_per_client"),
            "clustering_bytes_all_weights_per_client": probe.get("clustering/bytes_all_weights_per_client"),
            "bytes_measured_total": int(sum(m["bytes/down"] + m["bytes/up"] for m in history)),
            "bytes_measured_clustering": int(probe.get("bytes/down", 0) + probe.get("bytes/up", 0)),
        }
