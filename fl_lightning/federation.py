"""The one federated loop. Algorithms plug in as a ``Strategy`` (server side) and the
LightningModules it hands to clients; logging and checkpoints are callbacks."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix

from fl_lightning.atomic_file import write_atomic
from fl_lightning.callbacks import Checkpointing, ConsoleProgress, FederatedCallback, MetricsLogger, PartitionStatistics
from fl_lightning.callbacks.logging import progress_mode
from fl_lightning.callbacks.training_accuracy import TrainingAccuracy
from fl_lightning.checkpoint import load_checkpoint
from fl_lightning.client import ClientContext, ClientExecutor, resolve_accelerator
from fl_lightning.client_journal import ClientJournal, JournaledExecutor
from fl_lightning.config import (DataConfig, FederationConfig, ModelConfig, OptimizerConfig, PartitionConfig,
                                 RunConfig, TrainerConfig, check_optimizer)
from fl_lightning.data import load_dataset, partition_clients, partition_table
from fl_lightning.data.local_splits import apply_local_split, check_local_split
from fl_lightning.data.preprocess import hold_out_validation, resize_images
from fl_lightning.errors import RoundFailedError
from fl_lightning.interrupts import RunInterrupted
from fl_lightning.per_client_eval import class_report, client_accuracy_summary, local_split_metrics, per_client_metrics
from fl_lightning.provenance import reproducibility_info
from fl_lightning.run_dir import held_run, refuse_or_clear
from fl_lightning.run_lock import run_dir_lock
from fl_lightning.models import build_architecture, check_architecture_options
from fl_lightning.strategy import ServerContext, Strategy
from fl_lightning.strategy import sample_clients  # noqa: F401  (public: tests, bench)

EVAL_BATCH = 500
GPU_EVAL_BATCH = 5000  # a GPU evaluates the test set in two launches per model instead of twenty
# Settings that may differ between a checkpoint and the run resuming it.
_RESUMABLE_CHANGES = {"federation.rounds", "run", "trainer", "data.root", "data.offline_roots", "data.idx_gz_dir",
                      "data.mirror", "data.download", "data.speech_commands_dir", "data.fsdd_dir", "federation.eval_every",
                      "ckpt_path", "federation.per_client_eval", "federation.on_divergence",
                      "federation.train_accuracy_samples"}
# Settings added after checkpoints were written: a checkpoint without one matches the value that
# behaves as the code did before (its default, unless the default was the change).
_ADDED_SETTINGS = {"model.hidden_units": 0, "optimizer.history": 10, "optimizer.damping": 1e-3,
                   "optimizer.max_step_norm": None, "federation.on_divergence": "error",
                   "federation.train_accuracy_samples": 0, "federation.local_split": "none",
                   "algorithm.init_args.distill_weight_decay": 0.0}


class Federation:
    def __init__(
        self,
        data: DataConfig,
        partition: PartitionConfig,
        algorithm: Strategy,
        model: ModelConfig,
        optimizer: OptimizerConfig,
        federation: FederationConfig,
        trainer: TrainerConfig,
        run: RunConfig,
        seed: int = 0,
        callbacks: Optional[Sequence[FederatedCallback]] = None,
        config: Optional[dict] = None,
    ) -> None:
        self.data_cfg, self.partition, self.strategy = data, partition, algorithm
        self.model_cfg, self.optimizer, self.federation = model, optimizer, federation
        self.trainer_cfg, self.run, self.seed = trainer, run, seed
        self.run_dir = run.dir
        self.config = config or {
            "data": asdict(data), "partition": asdict(partition), "model": asdict(model),
            "optimizer": asdict(optimizer), "federation": asdict(federation), "trainer": asdict(trainer),
            "run": asdict(run), "seed": seed,
            "algorithm": {"class_path": type(algorithm).__name__, "init_args": dict(vars(algorithm))},
        }
        self._validate()
        self.callbacks = list(callbacks) if callbacks is not None else self.default_callbacks()
        self.round = 0
        self.test_confusion: Optional[torch.Tensor] = None  # (C, C) counts of this process's last test evaluation
        self.history: list[dict[str, Any]] = []
        self.reported_labels: Optional[dict[int, np.ndarray]] = None  # set when clients run elsewhere (Flower)
        # what each client keeps between rounds (SCAFFOLD's c_i): held for the simulated clients
        # and checkpointed with the federation, never counted as communication
        self.client_states: dict[int, dict[str, torch.Tensor]] = {}
        #: ``state_dict()`` as of the last finished round, while nothing has changed it since (None
        #: once the next round's server step starts): what an interrupted run saves
        self.resume_point: Optional[dict[str, Any]] = None
        self._stage = ("after", 0, 0)  # (clients | server | after, round, clients in the round)
        self._data = None

    def _validate(self) -> None:
        f = self.federation
        for key, value, low in (("rounds", f.rounds, 0), ("local_epochs", f.local_epochs, 1), ("eval_every", f.eval_every, 1),
                                ("train_accuracy_samples", f.train_accuracy_samples, 0),
                                ("final_window", f.final_window, 1), ("min_clients", f.min_clients, 1),
                                ("round_retries", f.round_retries, 0)):
            if value < low:
                raise ValueError(f"federation.{key}={value} must be >= {low}")
        if not 0 < f.client_fraction <= 1:
            raise ValueError(f"federation.client_fraction={f.client_fraction} must lie in (0, 1]")
        if f.client_timeout is not None and f.client_timeout <= 0:
            raise ValueError(f"federation.client_timeout={f.client_timeout} must be > 0 (or unset)")
        check_local_split(f.local_split, self.data_cfg.name)
        if f.batch_size < 0:
            raise ValueError(f"federation.batch_size={f.batch_size} must be >= 0 (0 = whole local set)")
        check_optimizer(self.optimizer)
        check_architecture_options(self.model_cfg.architecture, {"hidden_units": self.model_cfg.hidden_units})

    def default_callbacks(self) -> list[FederatedCallback]:
        cbs: list[FederatedCallback] = [PartitionStatistics(), MetricsLogger(self.run.logger, self.run.wandb_project),
                                        Checkpointing(self.run.checkpoint_every)]
        mode = progress_mode(self.run.progress)
        if mode != "off":
            cbs.insert(1, ConsoleProgress(mode=mode))
        return cbs

    def keeps_client_results(self) -> bool:
        """run.checkpoint_clients; unset: on for a one-round run (a one-shot method's hours-long
        round), off otherwise."""
        keep = self.run.checkpoint_clients
        return self.federation.rounds == 1 if keep is None else keep

    # ---- setup ---------------------------------------------------------------------------
    def setup(self) -> None:
        if self._data is not None:
            return
        self._data = d = load_dataset(self.data_cfg)
        clients = partition_clients(d.train_y.numpy(), self.partition, self.seed)
        #: federation.local_split (not none): each client's local test split (indices into the
        #: training tensor, which then holds the clients' augmented pools); made from the stored
        #: images, before resizing, as the authors' code does
        self.local_test_indices: Optional[list[np.ndarray]]
        clients, self.local_test_indices = apply_local_split(self.federation.local_split, d, clients, self.seed)
        if self.data_cfg.image_size:
            resize_images(d, self.data_cfg.image_size)
        self.train_labels = d.train_y.numpy()
        self.client_indices, self.client_val_indices = hold_out_validation(
            clients, self.partition.validation_fraction, self.seed)
        self.partition_counts = partition_table(self.train_labels, self.client_indices, d.num_classes)
        if self.strategy.uses_public_data:
            # FedDF/FedOV's protocol: the first half of the test set is unlabelled public
            # data on the server; accuracy is measured on the second half.
            half = len(d.test_x) // 2
            self.public_x = d.test_x[:half]
            d.test_x, d.test_y = d.test_x[half:], d.test_y[half:]
        else:
            self.public_x = None

        def make_model(num_outputs: int, architecture: Optional[str] = None):
            # the run's architecture with its options; another one (ATHENA-FL's probe) with its defaults
            options = {"hidden_units": self.model_cfg.hidden_units} if architecture is None else {}
            return build_architecture(architecture or self.model_cfg.architecture, d.in_channels, d.input_size,
                                      num_outputs, **options)

        self.template = make_model(self.strategy.num_outputs(d.num_classes))
        self.device = torch.device("cuda" if resolve_accelerator(self.trainer_cfg) == "gpu" else "cpu")
        if self.device.type == "cuda":  # the whole data set fits; batches are then GPU-side gathers
            d.train_x, d.train_y = d.train_x.to(self.device), d.train_y.to(self.device)
            d.test_x, d.test_y = d.test_x.to(self.device), d.test_y.to(self.device)
        stacking = "vmap" if self.device.type == "cuda" else "loop"
        public_x = None if self.public_x is None else self.public_x.to(self.device)
        context = ServerContext(self.partition.num_clients, make_model, public_x,
                                "gpu" if self.device.type == "cuda" else "cpu", self.seed,
                                self.client_validation if self.partition.validation_fraction > 0 else None,
                                str(self.run_dir), tuple(d.train_x.shape[1:]), d.pixel_mean, d.pixel_std)
        self.strategy.setup(self.template, d.num_classes, self.optimizer, stacking, context)
        # the algorithm's own server steps run first after the clients return (aggregation, clustering)
        own = self.strategy.configure_callbacks()
        if self.federation.train_accuracy_samples and not any(isinstance(cb, TrainingAccuracy) for cb in own):
            own.append(TrainingAccuracy(self.federation.train_accuracy_samples))  # after the new global model exists
        self.callbacks = [*own, *self.callbacks]
        init_gen = torch.Generator().manual_seed(self.seed)
        self.state = self.strategy.initial_state(init_gen)
        self.sampler = torch.Generator().manual_seed(self.seed + 1)

    def client_labels(self, client_id: int) -> np.ndarray:
        """The labels client ``client_id`` trains on (a strategy uses their set and count):
        from the client's own report when it runs elsewhere (Flower), else from the partition."""
        if self.reported_labels is not None:
            return self.reported_labels[client_id]
        return self.train_labels[self.client_indices[client_id]]

    def client_label_counts(self) -> np.ndarray:
        """(K, classes): every client's training samples per class (per-client evaluation)."""
        n = self._data.num_classes
        return np.stack([np.bincount(np.asarray(self.client_labels(k), dtype=np.int64), minlength=n)[:n]
                         for k in range(self.partition.num_clients)])

    def use_reported_label_counts(self, counts: dict[int, np.ndarray]) -> None:
        """Per-class sample counts reported by remote clients (no samples, only counts)."""
        self.reported_labels = {k: np.repeat(np.arange(len(c)), c) for k, c in counts.items()}

    def client_validation(self, client_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The pooled validation splits of ``client_ids`` (ServerContext.client_validation)."""
        indices = np.concatenate([self.client_val_indices[k] for k in client_ids] or [np.zeros(0, dtype=np.int64)])
        index = torch.from_numpy(indices).to(self._data.train_x.device)
        return self._data.train_x[index], self._data.train_y[index]

    # ---- checkpoint state ----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "state": self.state,
            "sampler_state": self.sampler.get_state(),
            "history": self.history,
            "client_states": self.client_states,
            "config": json.loads(json.dumps(self.config, default=str)),
        }

    def load_state_dict(self, ckpt: dict[str, Any]) -> None:
        mismatch = _config_differences(ckpt["config"], json.loads(json.dumps(self.config, default=str)))
        if mismatch:
            raise ValueError(f"checkpoint was written with other settings: {mismatch}")
        if set(ckpt["state"]) != set(self.state):
            raise ValueError("checkpoint parameters do not match this model/algorithm")
        self.round, self.state, self.history = ckpt["round"], ckpt["state"], list(ckpt["history"])
        self.sampler.set_state(ckpt["sampler_state"])
        self.client_states = dict(ckpt.get("client_states", {}))

    # ---- the loop ------------------------------------------------------------------------
    def fit(self, ckpt_path: Optional[str] = None, executor=None, resume: Optional[bool] = None) -> dict[str, Any]:
        """Run the rounds. ``executor`` trains the clients (``run(jobs, round, on_result)`` ->
        (results, failures), and ``close()``): by default in this process or its workers;
        fl_lightning.flower.FlowerExecutor sends them to Flower SuperNodes instead. While it
        runs, a second fit into the same run.dir is refused (fl_lightning.run_lock).
        ``resume`` (default: whether ``ckpt_path`` is given; the CLI's ``--ckpt_path last``
        before any checkpoint also resumes): with ``run.checkpoint_clients``, reuse the client
        results saved in the round a stopped run was in; a fresh fit discards them. A fresh fit
        into a run.dir that holds a run is refused unless ``run.overwrite`` (fl_lightning/run_dir.py)."""
        resuming = bool(ckpt_path) if resume is None else resume
        if not resuming and not self.run.overwrite and held_run(self.run_dir):
            with run_dir_lock(self.run_dir):  # refused before the data loads (in use: the lock says so)
                refuse_or_clear(self.run_dir, overwrite=False)
        self.setup()
        if ckpt_path:
            self.load_state_dict(load_checkpoint(ckpt_path))
        with run_dir_lock(self.run_dir):
            if not resuming:  # under the lock: never deletes a running fit's files
                refuse_or_clear(self.run_dir, self.run.overwrite)
            journal = (ClientJournal(self.run_dir, json.dumps(_fixed_settings(self.config), sort_keys=True, default=str))
                       if self.keeps_client_results() else None)
            if journal is not None and not resuming:
                journal.clear()
            if resuming:
                print(self._resumed(ckpt_path, journal), file=sys.stderr)
            return self._run_rounds(executor, journal)

    def _resumed(self, ckpt_path: Optional[str], journal: Optional[ClientJournal]) -> str:
        """What a resume starts from (the journal says later which saved clients it reuses)."""
        rounds = self.federation.rounds
        line = (f"resumed from {ckpt_path} at round {self.round} of {rounds}" if ckpt_path
                else f"resumed at round 0 of {rounds} (no checkpoint yet)")
        saved = journal.count(self.round + 1) if journal is not None else 0
        return line + (f"; {saved} saved client results of round {self.round + 1} found" if saved else "")

    def _run_rounds(self, executor, journal: Optional[ClientJournal] = None) -> dict[str, Any]:
        if executor is None:
            executor = ClientExecutor(self.client_context())
        if journal is not None:
            executor = JournaledExecutor(executor, journal)
        started = time.perf_counter()
        self._finished_round(self.round)
        diverged = None
        try:
            for cb in self.callbacks:
                cb.on_fit_start(self)
            for round_index in range(self.round + 1, self.federation.rounds + 1):
                if self.strategy.is_finished(self.state):
                    break
                try:
                    metrics = self.run_round(round_index, executor)
                except FloatingPointError as err:  # every client of the round diverged
                    if self.federation.on_divergence != "stop":
                        raise
                    print(f"round {round_index}: every client diverged; the run ends here "
                          "(federation.on_divergence=stop)", file=sys.stderr)
                    diverged = {"round": round_index, "reason": str(err)}
                    break
                self.round = round_index
                self.history.append(metrics)
                self._finished_round(round_index)
                for cb in self.callbacks:
                    cb.on_round_end(self, round_index, metrics)
            executor.close()
        except BaseException as error:
            getattr(executor, "terminate", executor.close)()  # workers are killed, not waited for
            if isinstance(error, RunInterrupted):
                self._stopping(error, journal)
            raise
        summary = self.summary(time.perf_counter() - started)
        if diverged is not None:  # the rounds before it are no final accuracy of the run
            summary.update(final_accuracy=None, diverged=diverged)
        for cb in self.callbacks:
            cb.on_fit_end(self, summary)
        self.write_summary(summary)
        if journal is not None:  # the final checkpoint holds every round now
            journal.clear()
        return summary

    def client_context(self) -> ClientContext:
        """What this run's client fits share (after ``setup``): its data, model, settings, seed."""
        d = self._data
        public_x = None if self.public_x is None else self.public_x.to(d.train_x.device)
        return ClientContext(d.train_x, d.train_y, self.template, self.federation, self.trainer_cfg, self.seed,
                             public_x, on_epoch=self._client_epoch)

    def _finished_round(self, round_index: int) -> None:
        # containers copied, tensors shared: the next round replaces them before changing any
        self._stage = ("after", round_index, 0)
        self.resume_point = {**self.state_dict(), "state": dict(self.state), "history": list(self.history),
                             "client_states": dict(self.client_states)}

    def _client_epoch(self, client_id: int, epoch: int, epochs: int) -> None:
        for cb in self.callbacks:
            cb.on_client_epoch(self, self._stage[1], client_id, epoch, epochs)

    def _stopping(self, stop: RunInterrupted, journal: Optional[ClientJournal]) -> None:
        """On the way out of an interrupted fit: the callbacks keep what a resume needs (the
        last finished round's checkpoint), ``stop`` says where the run was and what is kept."""
        stage, round_index, clients = self._stage
        rounds = self.federation.rounds
        stop.where = {"after": (f"after round {round_index} of {rounds}" if round_index
                                else f"before round 1 of {rounds}"),
                      "clients": f"in round {round_index} of {rounds}, training clients",
                      "server": f"in round {round_index} of {rounds}, in its server step or evaluation"}[stage]
        for cb in self.callbacks:
            cb.on_interrupt(self, stop)
        if journal is not None and stage in ("clients", "server"):
            stop.kept.append(f"{journal.count(round_index)} of {clients} client results of round {round_index}")

    def run_round(self, round_index: int, executor: ClientExecutor) -> dict[str, Any]:
        t0 = time.perf_counter()
        self._stage = ("clients", round_index, 0)
        sampled = self.strategy.select_clients(self.state, self.sampler, self.partition.num_clients,
                                               self.federation.client_fraction)
        bytes_down = bytes_up = 0
        # Optional first phase (FedDANE's global gradient), same clients, same executor.
        failures: list = []
        first = self.strategy.gradient_phase(self.state, [k for k in sampled if len(self.client_indices[k])])
        if first is not None:
            first_jobs = [(task, self.client_indices[task.client_id]) for task in first]
            first_results, failures = self._run_clients(executor, first_jobs, round_index)
            self.strategy.receive_gradients(first_results)
            bytes_down += sum(t.sent_bytes() for t, _ in first_jobs)
            bytes_up += sum(r.sent_bytes() for r in first_results)
            sampled = [r.client_id for r in first_results]  # a client that failed phase one sits this round out
        jobs = []
        for k in sampled:
            indices = self.client_indices[k]
            task = self.strategy.configure_client(self.state, k, self.client_labels(k))
            if task is not None:
                jobs.append((task, indices))
        self._stage = ("clients", round_index, len(jobs))
        for cb in self.callbacks:
            cb.on_clients_start(self, round_index, len(jobs))
        results, second = self._run_clients(executor, jobs, round_index, lambda result, done, total: [
            cb.on_client_end(self, round_index, result, done, total) for cb in self.callbacks])
        failures += second
        self._stage = ("server", round_index, len(jobs))
        self.resume_point = None  # the server step may change the state in place
        facts: dict[str, Any] = {}
        for cb in self.callbacks:  # the strategy's server steps (aggregation, clustering), then any others
            facts.update(cb.on_clients_end(self, round_index, results) or {})
        metrics: dict[str, Any] = {
            "round": round_index,
            "train/loss": float(np.mean([r.train_loss for r in results])) if results else float("nan"),
            "train/steps": int(sum(r.steps for r in results)),
            "clients": len(results),
            "clients/failed": len(failures),
            # everything exchanged: SCAFFOLD's c down and delta c_i up (c_i itself stays with its
            # client), FIM-L-BFGS's gradient and Fisher up, FedDANE's two phases (ClientTask.sent_bytes)
            "bytes/down": int(bytes_down + sum(t.sent_bytes() for t, _ in jobs)),
            "bytes/up": int(bytes_up + sum(r.sent_bytes() for r in results)),
            **facts,
        }
        if failures:
            metrics["failures"] = "; ".join(f"client {f.client_id}: {f.reason}" for f in failures)
        metrics["time/train_s"] = time.perf_counter() - t0
        if self.should_evaluate(round_index):
            metrics.update(self.evaluate())
            if self.partition.validation_fraction > 0:
                metrics.update(self.evaluate("val"))
        metrics["time/round_s"] = time.perf_counter() - t0
        return metrics

    def _run_clients(self, executor: ClientExecutor, jobs, round_index: int, on_result=None):
        """One client phase: failed clients are dropped and logged; with fewer than
        ``federation.min_clients`` successes the phase is run again (``round_retries``
        times, same clients and seeds), then the run stops with the failures listed."""
        f = self.federation
        needed = min(f.min_clients, len(jobs))
        for attempt in range(f.round_retries + 1):
            results, failures = executor.run(jobs, round_index, on_result, client_states=self.client_states)
            for failure in failures:
                print(f"round {round_index}: client {failure.client_id} dropped ({failure.reason})", file=sys.stderr)
            if len(results) >= needed:  # the phase counts: its clients keep what they kept
                self.client_states.update({r.client_id: r.client_state for r in results if r.client_state})
                return results, failures
            if attempt < f.round_retries:
                print(f"round {round_index}: {len(results)} of {len(jobs)} clients succeeded, fewer than "
                      f"federation.min_clients={f.min_clients}; retrying ({attempt + 1}/{f.round_retries})", file=sys.stderr)
        hint = ("; training diverged: lower optimizer.lr (now {}) or the algorithm's step size".format(self.optimizer.lr)
                if failures and all("non-finite" in x.reason for x in failures) else "")
        error = FloatingPointError if hint else RoundFailedError  # FloatingPointError: every failure diverged
        raise error(
            f"round {round_index}: only {len(results)} of {len(jobs)} clients succeeded, fewer than "
            f"federation.min_clients={f.min_clients}, after {f.round_retries + 1} attempt(s): "
            + "; ".join(f"client {x.client_id}: {x.reason}" for x in failures) + hint)

    def should_evaluate(self, round_index: int) -> bool:
        """Every ``eval_every`` rounds, and every round of the final window, so that the
        final accuracy is always the mean over the last ``final_window`` rounds."""
        f = self.federation
        return round_index % f.eval_every == 0 or round_index > f.rounds - f.final_window

    @torch.inference_mode()
    def evaluate(self, split: str = "test") -> dict[str, float]:
        """Accuracy of the global model (for FedOVA: argmax of the detectors, Eq. 3), in large
        batches with every detector at once."""
        self.setup()
        if split == "val":  # every client's validation split (federated evaluation, pooled)
            x, y = self.client_validation(range(self.partition.num_clients))
        else:
            x, y = (self._data.test_x, self._data.test_y) if split == "test" else (self._data.train_x, self._data.train_y)
        state = {k: v.to(self.device) for k, v in self.state.items()}
        accuracy = MulticlassAccuracy(num_classes=self._data.num_classes, average="micro").to(self.device)
        confusion = MulticlassConfusionMatrix(num_classes=self._data.num_classes).to(self.device)
        scores = []
        size = GPU_EVAL_BATCH if self.device.type == "cuda" else EVAL_BATCH
        for start in range(0, len(x), size):
            xb = x[start:start + size].to(self.device).contiguous(memory_format=torch.channels_last)
            yb = y[start:start + size].to(self.device)
            s = self.strategy.predict_logits(state, xb).float()
            accuracy.update(s, yb)
            confusion.update(s, yb)
            scores.append(s)
        all_scores = torch.cat(scores)
        out = {f"{split}/accuracy": float(accuracy.compute())}
        if split == "test":  # per class is where label skew shows: kept for the summary, not logged each round
            self.test_confusion = confusion.compute().cpu()
        if split == "test" and self.federation.per_client_eval:
            out.update({f"{split}/{k}": v for k, v in per_client_metrics(
                all_scores.argmax(1).cpu().numpy(), y.cpu().numpy(), self.client_label_counts()).items()})
        out.update({f"{split}/{k}": v for k, v in self.strategy.extra_metrics(state, x, y.to(self.device), all_scores).items()})
        if split == "test" and self.local_test_indices is not None:
            out.update({f"{split}/{k}": v for k, v in self.local_split_evaluation(state, size).items()})
        return out

    def local_split_evaluation(self, state, batch: int) -> dict[str, float]:
        """federation.local_split (not none): the global model on every client's local test
        split (fl_lightning.per_client_eval.local_split_metrics)."""
        indices = np.concatenate(self.local_test_indices)
        owners = np.repeat(np.arange(len(self.local_test_indices)), [len(t) for t in self.local_test_indices])
        index = torch.from_numpy(indices).to(self._data.train_x.device)
        correct = []
        for start in range(0, len(index), batch):
            part = index[start:start + batch]
            xb = self._data.train_x[part].to(self.device).contiguous(memory_format=torch.channels_last)
            correct.append((self.strategy.predict_logits(state, xb).argmax(1) == self._data.train_y[part].to(self.device)).cpu())
        hits = torch.cat(correct).numpy() if correct else np.zeros(0, dtype=bool)
        return local_split_metrics(hits, owners, len(self.local_test_indices))

    # ---- results -------------------------------------------------------------------------
    def summary(self, wall_time: float) -> dict[str, Any]:
        evaluated = [m["test/accuracy"] for m in self.history if "test/accuracy" in m]
        evaluated_rounds = [m["round"] for m in self.history if "test/accuracy" in m]
        window = evaluated[-self.federation.final_window:]
        return {
            "algorithm": self.strategy.name,
            "config": json.loads(json.dumps(self.config, default=str)),
            "rounds": self.round,
            "final_accuracy": float(np.mean(window)) if window else None,
            "final_window": len(window),
            "last_accuracy": evaluated[-1] if evaluated else None,
            **({"client_accuracy": client_accuracy_summary(self.history, self.federation.final_window)}
               if self.federation.per_client_eval else {}),
            **({"test_classes": class_report(evaluated_rounds[-1], self.test_confusion)}
               if self.test_confusion is not None and evaluated_rounds else {}),
            "bytes_total": int(sum(m["bytes/down"] + m["bytes/up"] for m in self.history)),
            "wall_time_s": wall_time,
            "seconds_per_round": float(np.mean([m["time/round_s"] for m in self.history])) if self.history else None,
            "torch_threads": torch.get_num_threads(),
            "workers": self.trainer_cfg.workers,
            "device": str(self.device),
            "communication": self.strategy.communication_report(self.state, self.history),
            "reproducibility": reproducibility_info(),
            "history": self.history,
        }

    def write_summary(self, summary: dict[str, Any]) -> Path:
        path = Path(self.run_dir) / "summary.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(summary, indent=1, default=str).encode()
        write_atomic(path, lambda f: f.write(text))
        return path


def _fixed_settings(config: dict, prefix: str = "") -> dict:
    """The settings a resume may not change (those ``_config_differences`` compares)."""
    return {key: _fixed_settings(value, f"{prefix}{key}.") if isinstance(value, dict) else value
            for key, value in config.items()
            if f"{prefix}{key}" not in _RESUMABLE_CHANGES and not (key == "config" and not prefix)}


def _config_differences(saved: dict, current: dict, prefix: str = "") -> list[str]:
    diffs = []
    for key in sorted(set(saved) | set(current)):
        dotted = f"{prefix}{key}"
        if dotted in _RESUMABLE_CHANGES or key == "config" and not prefix:
            continue
        a, b = saved.get(key), current.get(key)
        if key not in saved and dotted in _ADDED_SETTINGS and b == _ADDED_SETTINGS[dotted]:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            diffs += _config_differences(a, b, dotted + ".")
        elif dotted == "algorithm.class_path" and isinstance(a, str) and isinstance(b, str):
            if strategy_name(a) != strategy_name(b):  # the module path moved (fl_lightning/algorithms/)
                diffs.append(f"{dotted}: checkpoint {a!r} != now {b!r}")
        elif a != b:
            diffs.append(f"{dotted}: checkpoint {a!r} != now {b!r}")
    return diffs


def strategy_name(class_path: str) -> str:
    """A strategy's class name, whatever module path a saved config wrote it with."""
    return class_path.rsplit(".", 1)[-1]
