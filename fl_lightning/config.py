"""Typed settings of a federation. jsonargparse reads them from YAML and the command
line, so a wrong key or a wrong type is rejected with its dotted name."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional, Union

DATA_ROOT_ENV = "FL_LIGHTNING_DATA"


def default_data_root() -> str:
    return os.environ.get(DATA_ROOT_ENV, str(Path.home() / ".cache" / "fl_lightning" / "data"))


@dataclass
class DataConfig:
    """Which data set, and where its files are.

    Attributes:
        name: fashion_mnist | mnist | cifar10 | svhn (cropped digits; files in ``SVHN/`` under
            ``root`` or an offline root) | synthetic (small generated images, for tests) |
            speech_commands (Speech Commands, 10 keywords, 50x16 MFCC) | fsdd (Free Spoken Digit
            Dataset, digits 0-9, 50x16 MFCC; the offline stand-in for keyword spotting).
        root: the one folder data are written to (downloads, unpacked copies, feature caches),
            in torchvision's layout; unset: $FL_LIGHTNING_DATA, else ~/.cache/fl_lightning/data.
            Read-only copies the machine already has (../shared/data beside the checkout,
            Debian's /usr/share/datasets/fashion-mnist) are found without a setting
            (fl_lightning/data/sources.py, docs/data.md).
        offline_roots: more read-only folders in torchvision's layout, searched after ``root``;
            each must exist.
        idx_gz_dir: a folder holding the original ``*-ubyte.gz`` files of an (F)MNIST set; read
            (unpacked into ``root``) in preference to any other copy, and an error when it lacks them.
        download: download missing files into ``root`` (needs internet, or ``mirror``).
        mirror: a base URL serving the original files under their original names (a local
            mirror of torchvision's: ``train-images-idx3-ubyte.gz``, ``cifar-10-python.tar.gz``,
            ``train_32x32.mat``, ...); ``download`` fetches from it instead of torchvision's
            mirrors. The md5 sums are still checked (image sets only).
        check_integrity: verify torchvision's md5 sums (CIFAR-10, SVHN); turn off for rebuilt
            copies such as the offline CIFAR-10 in shared/data, whose pickles differ from the originals.
        synthetic_size: training samples of the synthetic set (its test set is a quarter).
        test_subset: evaluate on the first this many test samples only (0 = the whole test
            set); for quick CPU smoke runs, never for reported results.
        speech_commands_dir: a folder holding Speech Commands as ``<word>/<speaker>_nohash_<n>.wav``
            (an extracted archive, or a subset such as ../shared/data/speech_commands_v0.01_subset).
            Unset: torchaudio's layout ``<root or offline root>/SpeechCommands/<speech_commands_version>/``
            is searched, and downloaded into ``root`` when ``download`` is true. Without
            testing_list.txt the test split follows the data set's own hash rule (docs/kws.md).
        speech_commands_version: speech_commands_v0.01 | speech_commands_v0.02, the archive
            torchaudio's SPEECHCOMMANDS looks for or downloads.
        fsdd_dir: the FSDD ``recordings/`` folder (``{digit}_{speaker}_{index}.wav``); unset:
            ``fsdd/recordings`` under ``root`` and then each of ``offline_roots``.
        mfcc_mels: mel bands the 16 MFCCs are taken from (speech corpora only; 50 frames x 16
            coefficients per 1 s clip whatever its value). Changing it recomputes the cache.
        image_pack: an ``.npz`` written by ``python -m fl_lightning.data.image_pack`` (every
            image as JPEG bytes, CIFAR-10 in 37 MB): read instead of the files above, e.g.
            on a machine that has no copy of the data set. Lossy: meant for copies that are
            lossy already (shared/data's CIFAR-10); the pack records how much it changed them.
        image_size: resize every image to image_size x image_size (bilinear) after loading;
            ATHENA-FL extends MNIST/FMNIST to 32x32 (Section 5). Unset: the native size.
        standardize: image sets only: standardise each channel with the training set's mean
            and std (true), or keep the raw [0, 1] pixels (false), as FedOV's code trains
            (docs/reproduction_readings.md).
    """

    name: Literal["fashion_mnist", "mnist", "cifar10", "svhn", "synthetic", "speech_commands", "fsdd"] = "fashion_mnist"
    root: Optional[str] = None
    offline_roots: list[str] = field(default_factory=list)
    idx_gz_dir: Optional[str] = None
    download: bool = False
    mirror: Optional[str] = None
    check_integrity: bool = True
    synthetic_size: int = 2000
    test_subset: int = 0
    speech_commands_dir: Optional[str] = None
    speech_commands_version: Literal["speech_commands_v0.01", "speech_commands_v0.02"] = "speech_commands_v0.01"
    fsdd_dir: Optional[str] = None
    mfcc_mels: int = 40
    image_pack: Optional[str] = None
    image_size: Optional[int] = None
    standardize: bool = True


@dataclass
class PartitionConfig:
    """How the training set is split over clients (seeded by the run's seed).

    Attributes:
        scheme: iid | non_iid_l (FedOVA: l shards of l different labels per client) |
            num_labels (NIID-Bench #C=k) | label_groups (ATHENA-FL: disjoint groups of l classes,
            client k in group k mod n/l) | dirichlet (NIID-Bench Dir(beta), ATHENA-FL's "LDA").
        num_clients: K.
        labels_per_client: l of non-IID-l, k of #C=k.
        dirichlet_beta: concentration of Dir(beta).
        min_samples: Dir(beta) redraws until every client holds at least this many samples.
        share_fraction: data-sharing baseline (Zhao et al. 2018): a random global subset of
            share_fraction x |D_k| samples is added to every client; 0 turns it off.
        validation_fraction: every client keeps this fraction of its samples out of training
            as a local validation split (federated evaluation: clients report correct/total);
            0 turns it off. ATHENA-FL's convergence criterion and detector ranking use it.
        rng: whose random stream draws the split. numpy: fl_lightning's own (a numpy Generator
            seeded with the run's seed). niid_bench: NIID-Bench's code (utils.py partition_data,
            identical in FedOV's repository) replayed draw for draw, so a seed gives the clients
            the same classes and samples as that code's --init_seed; iid, num_labels and
            dirichlet only.
    """

    scheme: Literal["iid", "non_iid_l", "num_labels", "label_groups", "dirichlet"] = "non_iid_l"
    num_clients: int = 100
    labels_per_client: int = 2
    dirichlet_beta: float = 0.5
    min_samples: int = 10
    share_fraction: float = 0.0
    validation_fraction: float = 0.0
    rng: Literal["numpy", "niid_bench"] = "numpy"


@dataclass
class ModelConfig:
    """Attributes:
    architecture: fashion_cnn (FedOVA's F-MNIST CNN) | vgg11 (CIFAR-10) | kws_cnn (FedOVA's
        keyword-spotting CNN for 50x16 MFCC inputs) | simple_cnn (the 5-layer CNN of FedAvg,
        NIID-Bench and FedOV) | logistic (flatten + linear: logistic regression, the convex
        sanity check of FIM-L-BFGS) | athena_cnn (ATHENA-FL's detector, 32x32 inputs) |
        mobilenet | mobilenet_v2 (ATHENA-FL's multi-class baselines and clustering probe).
    hidden_units: fashion_cnn only: a fully connected layer of this many units (with ReLU)
        before the output layer, as in McMahan et al.'s CNN (512), which FedOVA names as its
        network's source; 0 (default): none, the flattened features feed the output layer."""

    architecture: Literal["fashion_cnn", "vgg11", "kws_cnn", "simple_cnn", "logistic", "athena_cnn", "mobilenet",
                          "mobilenet_v2"] = "fashion_cnn"
    hidden_units: int = 0


@dataclass
class OptimizerConfig:
    """The clients' local optimizer, created afresh for every local fit (as in FedAvg) unless
    ``keep_state``.

    Attributes:
        name: sgd | adam | fim_lbfgs (FIM-L-BFGS's client-side reading: local FIM-based L-BFGS
            steps over the client's own (s, y = F_batch s) pairs; FedAvg family and FedOVA).
        lr: learning rate (fim_lbfgs: the step size along the L-BFGS direction).
        momentum: SGD momentum.
        weight_decay: L2 penalty (sgd, adam).
        history: fim_lbfgs: the (s, y) pairs kept, m.
        damping: fim_lbfgs: lambda added to the diagonal Fisher (B = F + lambda I).
        max_step_norm: fim_lbfgs: the longest step ||lr p|| (unset: no limit).
        keep_state: sgd, adam: each client keeps its optimizer's state (Adam's moments and
            step count, SGD's momentum) from one of its rounds to its next, as a client that
            compiles its model once and fits it every round (ATHENA-FL's Keras code); the
            state stays on the client (never sent) and is saved with the run's checkpoints,
            laid out as the exchanged parameters whichever engine trains the client (the
            cohort engine starts each member from it; callbacks/optimizer_state.py).
    """

    name: Literal["sgd", "adam", "fim_lbfgs"] = "sgd"
    lr: float = 0.05
    momentum: float = 0.0
    weight_decay: float = 0.0
    history: int = 10
    damping: float = 1e-3
    max_step_norm: Optional[float] = None
    keep_state: bool = False


def check_optimizer(cfg: OptimizerConfig) -> None:
    """Values every client's optimizer would refuse, named before the run starts."""
    if not cfg.lr > 0:
        raise ValueError(f"optimizer.lr={cfg.lr} must be > 0")
    for key in ("momentum", "weight_decay", "damping"):
        if not getattr(cfg, key) >= 0:
            raise ValueError(f"optimizer.{key}={getattr(cfg, key)} must be >= 0")
    if cfg.history < 1:
        raise ValueError(f"optimizer.history={cfg.history} must be >= 1")
    if cfg.name == "fim_lbfgs" and (cfg.momentum or cfg.weight_decay):
        raise ValueError("optimizer.name=fim_lbfgs takes no optimizer.momentum or optimizer.weight_decay")
    if cfg.name == "fim_lbfgs" and cfg.keep_state:
        raise ValueError("optimizer.keep_state applies to sgd and adam; fim_lbfgs rebuilds its (s, y) history "
                         "in every local fit")


@dataclass
class FederationConfig:
    """The round structure.

    Attributes:
        rounds: T.
        client_fraction: C; max(1, round(C*K)) clients are sampled per round.
        local_epochs: E.
        batch_size: B; 0 means the whole local set in one batch (the paper's B = infinity).
        eval_every: evaluate on the test set every this many rounds, and in every round of
            the final window.
        final_window: "final accuracy" is the mean over the last this many evaluations
            (the paper's convention: 20).
        min_clients: the fewest clients that must succeed for a round to count; a client that
            raises, runs past ``client_timeout``, disconnects or returns non-finite values is
            dropped from its round (and logged with its id).
        round_retries: how often a round with fewer than ``min_clients`` successes is run again
            (same clients, same seeds) before the run stops with an error.
        client_timeout: seconds a client's local training may take (none: no limit).
        per_client_eval: also evaluate the global model on each client's own test
            distribution whenever it is evaluated on the test set: per-class test accuracy
            weighted by the client's training label proportions (the test samples of the
            classes it holds, weighted like its training data), and report the mean over
            clients with a 95 % Student-t confidence interval (fl_lightning.per_client_eval), as
            ATHENA-FL reports its accuracies.
        on_divergence: a round in which every client diverged (non-finite parameters or
            loss, e.g. too large a step): ``error`` (default) stops the run with a
            FloatingPointError; ``stop`` ends it there as a result, the way a study records
            a diverged seed: summary.json gets ``diverged`` (the round and the clients'
            reasons), no final accuracy, and the history of the rounds before.
        train_accuracy_samples: also score the global model after every round on this many
            of the clients' pooled training samples (a fixed subsample drawn once from the
            seed; ``train/accuracy``): the FedOVA journal's Table II reads as training accuracy
            (callbacks/training_accuracy.py); 0: off.
        local_split: whose client data and client accuracy: ``none`` (the default; the ATHENA-FL
            paper's text): clients train on their partition, and ``per_client_eval`` scores each
            on the global test set weighted by its label proportions. ``athena_code`` (the
            authors' code, fl_lightning/data/athena_local_split.py, docs/reproduction_readings.md):
            every class of the training and of the test set quadrupled (flipped, rotated, noisy,
            original), each client's slices of its classes from both pooled and cut 80/20; the
            client trains on the 80 % and the global model's accuracy on each client's 20 % is
            logged as ``test/client_accuracy_local`` (mean over all clients), ``_ci95`` (the
            authors' 1.96 std / √10) and ``test/clients_evaluated_local``. The test set then
            lies in the clients' training data, so ``test/accuracy`` is no held-out measure
            either. Image sets only.
    """

    rounds: int = 100
    client_fraction: float = 0.2
    local_epochs: int = 5
    batch_size: int = 15
    eval_every: int = 1
    final_window: int = 20
    min_clients: int = 1
    round_retries: int = 0
    client_timeout: Optional[float] = None
    per_client_eval: bool = False
    on_divergence: Literal["error", "stop"] = "error"
    train_accuracy_samples: int = 0
    local_split: Literal["none", "athena_code"] = "none"


@dataclass
class TrainerConfig:
    """How each client's Lightning ``Trainer`` runs.

    Attributes:
        accelerator: auto | cpu | gpu.
        precision: auto (bf16-mixed where the GPU supports it, else 32-true) | 32-true |
            bf16-mixed | 16-mixed.
        workers: client-training processes; >1 trains sampled clients in parallel on the
            CPU cores (results are identical: each client's randomness is derived from
            (seed, round, client)). GPUs train in the main process.
        threads: torch threads per process; default: all cores with one worker, 1 per
            worker otherwise (a second busy process makes OpenMP spin-waits ~100x slower).
        engine: auto | per_client | cohort. per_client: one Trainer fit per client, one
            step at a time (the reference). cohort: a round's tasks that stack (same kind
            and architecture, a client plug-in that declares its members) are trained as
            one vectorised model by one Trainer; the others run per client. auto: cohort on
            a GPU, per_client on a CPU (README.md, Performance, has the measurements).
            federation.client_timeout is enforced per client only: a cohort is not
            interrupted, and a cohort that raises drops all of its clients from the round.
        cohort_size: the most members (FedOVA: (client, detector) pairs; FedAvg: clients)
            trained together; larger cohorts are split into chunks. 0: no limit.
        cuda_graph: on a GPU, capture the cohort's training step in one CUDA graph and
            replay it (static shapes per round); off: eager steps.
        cudnn_benchmark: let cuDNN time its convolution algorithms for each new shape and keep
            the fastest (the Trainer's ``benchmark``). vmap turns a cohort's convolutions into
            grouped ones, for which cuDNN's default choice may be slow; off by default until a
            GPU measures it (bench/cohort_bench.py, variant cohort_cudnn_benchmark).
        compile: compile the cohort's training step with ``torch.compile`` (inductor, one
            graph) before it runs or is captured, so that its many small operations (the
            optimizer's update, FedOV's destruction, FGSM and PROSER terms) fuse into fewer
            kernels. Each new cohort shape compiles once (FedOV's: about a minute on a CPU);
            past torch.compile's limit of 8 shapes new ones run eagerly. Off by default:
            not yet measured on a GPU (bench/cohort_bench.py, variant cohort_compiled).
    """

    accelerator: Literal["auto", "cpu", "gpu"] = "auto"
    precision: Literal["auto", "32-true", "bf16-mixed", "16-mixed"] = "auto"
    workers: int = 1
    threads: Optional[int] = None
    engine: Literal["auto", "per_client", "cohort"] = "auto"
    cohort_size: int = 0
    cuda_graph: bool = True
    cudnn_benchmark: bool = False
    compile: bool = False


@dataclass
class RunConfig:
    """Where results go.

    Attributes:
        dir: run directory (summary.json, metrics, checkpoints).
        checkpoint_every: write the whole federation state every this many rounds (and at
            the end); 0 only at the end.
        logger: csv | wandb (honours WANDB_MODE=offline) | none.
        wandb_project: W&B project name.
        progress: progress on stderr (callbacks/logging.py, docs/running.md): ``bar`` (a live
            line redrawn after every client and local epoch), ``lines`` (one line per round,
            per finished client, and per epoch at most every 10 s), ``off``; ``auto`` (or
            true): ``bar`` on a terminal, else ``lines``; false: ``off``. With an ETA for the
            round and the run.
        checkpoint_clients: also save each client's result as it arrives, so a run stopped in
            the middle of a round resumes (``--ckpt_path last``) without retraining the
            clients that had finished (fl_lightning/client_journal.py). Unset: on when the run
            has one round (a one-shot method: FedOV's ten clients train for hours in it), off
            otherwise (a checkpoint every few rounds loses little).
        overwrite: a fit into a run.dir that holds a run (summary.json, a checkpoint or saved
            client results) deletes that run's results first; without it such a fit is refused
            unless it resumes (``--ckpt_path last``).
    """

    dir: str = "runs/default"
    checkpoint_every: int = 10
    logger: Literal["csv", "wandb", "none"] = "csv"
    wandb_project: str = "fl_lightning"
    progress: Union[bool, Literal["auto", "bar", "lines", "off"]] = "auto"
    checkpoint_clients: Optional[bool] = None
    overwrite: bool = False
