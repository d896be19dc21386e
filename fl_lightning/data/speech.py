"""Keyword spotting (FedOVA, Section IV-A): spoken words as 50 x 16 MFCC "images".

Two corpora, one pipeline:

- **Speech Commands**, the 10 keywords of the paper. torchaudio's ``SPEECHCOMMANDS``
  locates (and, with ``data.download``, downloads) the archive in its layout
  ``<root>/SpeechCommands/<version>/<word>/<speaker>_nohash_<n>.wav``; ``data.speech_commands_dir``
  points at such a ``<word>/`` folder directly (an extracted archive, or a subset like
  ../shared/data/speech_commands_v0.01_subset). Test split: ``testing_list.txt`` where the
  folder has it, else the data set's own rule (``which_set`` below; the lists were made by it).
  Training set: every other keyword clip (the official training and validation lists).
- **FSDD**, ``{digit}_{speaker}_{index}.wav`` at 8 kHz, resampled to 16 kHz. Test split:
  indices 0-4 of every speaker and digit (upstream's convention), training: the rest.

Audio is read with ``soundfile`` (torchaudio >= 2.9 reads through torchcodec, which needs
system FFmpeg libraries), made mono, and centred in exactly 1 s at 16 kHz: shorter clips
are zero-padded equally on both sides, longer ones cropped to their middle second.

Features (``MfccSettings``): 40 ms Hann windows (n_fft = win_length = 640) every 20 ms
(hop 320), ``center=False`` on the clip zero-padded by half a hop (160 samples) at each
end, so 16,000 samples give exactly 50 frames centred at 10, 30, ..., 990 ms; 40 mel
bands from 20 Hz to 8 kHz, natural log (``log_mels=True``), orthonormal DCT-II, 16
coefficients. A clip is a (1, 50, 16) tensor: frames x coefficients.

The features are computed once and cached under ``<data.root>/kws_features/`` as one
``.pt`` file per corpus, named by a hash of the feature settings and the source file
list (relative paths, sizes, split, labels); a changed setting or file list computes a
new file. Writes go to a temporary file renamed into place, so a crash never leaves a
truncated cache. Standardisation (per coefficient, with the training set's mean and
std) is applied after loading, so it never goes stale.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from fl_lightning.atomic_file import write_atomic
from fl_lightning.config import DataConfig
from fl_lightning.data.sources import DataNotFoundError, explicit_folder, search_roots

log = logging.getLogger(__name__)

KEYWORDS = ("one", "two", "three", "four", "five", "down", "left", "right", "stop", "go")
SAMPLE_RATE = 16000
CACHE_FORMAT = 1  # bump when the feature code changes in a way the settings do not show
_HASH_DIVIDER = "_nohash_"
_MAX_NUM_WAVS_PER_CLASS = 2**27 - 1  # Speech Commands README, which_set()
_FSDD_NAME = re.compile(r"^(\d)_([A-Za-z]+)_(\d+)\.wav$")


@dataclass(frozen=True)
class MfccSettings:
    """Everything that shapes a feature tensor (and so the cache key)."""

    sample_rate: int = SAMPLE_RATE
    clip_samples: int = SAMPLE_RATE  # 1 s
    edge_pad: int = 160  # half a hop of zeros at each end: frames centred at 10, 30, ... ms
    n_fft: int = 640  # 40 ms
    win_length: int = 640
    hop_length: int = 320  # 20 ms
    n_mels: int = 40
    f_min: float = 20.0
    f_max: float = 8000.0
    n_mfcc: int = 16

    @property
    def num_frames(self) -> int:
        return 1 + (self.clip_samples + 2 * self.edge_pad - self.n_fft) // self.hop_length


@dataclass
class SpeechSplit:
    """Audio files of one corpus: absolute paths and int labels, train and test."""

    folder: Path
    train_files: list[Path]
    train_labels: list[int]
    test_files: list[Path]
    test_labels: list[int]


# ---- corpora -------------------------------------------------------------------------------
def which_set(filename: str, validation_percentage: float = 10.0, testing_percentage: float = 10.0) -> str:
    """Speech Commands' split rule (its README): a SHA-1 of the speaker part of the name, so
    all clips of a speaker share a set. 'validation' | 'testing' | 'training'."""
    hash_name = re.sub(r"_nohash_.*$", "", os.path.basename(filename))
    hashed = int(hashlib.sha1(hash_name.encode()).hexdigest(), 16)
    percentage = (hashed % (_MAX_NUM_WAVS_PER_CLASS + 1)) * (100.0 / _MAX_NUM_WAVS_PER_CLASS)
    if percentage < validation_percentage:
        return "validation"
    if percentage < validation_percentage + testing_percentage:
        return "testing"
    return "training"


def speech_commands_split(folder: Path) -> SpeechSplit:
    """The 10 keywords of a Speech Commands folder ``<word>/<speaker>_nohash_<n>.wav``."""
    listed = None
    if (folder / "testing_list.txt").is_file():
        listed = {line.strip() for line in (folder / "testing_list.txt").read_text().splitlines() if line.strip()}
    split = SpeechSplit(folder, [], [], [], [])
    for label, word in enumerate(KEYWORDS):
        for path in sorted((folder / word).glob("*.wav")):
            if _HASH_DIVIDER not in path.name:
                continue
            relative = f"{word}/{path.name}"
            in_test = relative in listed if listed is not None else which_set(path.name) == "testing"
            (split.test_files if in_test else split.train_files).append(path)
            (split.test_labels if in_test else split.train_labels).append(label)
    return split


def fsdd_split(folder: Path) -> SpeechSplit:
    """FSDD recordings; test = indices 0-4 of every (digit, speaker), as upstream does."""
    split = SpeechSplit(folder, [], [], [], [])
    for path in sorted(folder.glob("*.wav")):
        match = _FSDD_NAME.match(path.name)
        if not match:
            continue
        digit, index = int(match.group(1)), int(match.group(3))
        in_test = index < 5
        (split.test_files if in_test else split.train_files).append(path)
        (split.test_labels if in_test else split.train_labels).append(digit)
    return split


def _has_keywords(folder: Path) -> bool:
    return any((folder / word).is_dir() and any((folder / word).glob(f"*{_HASH_DIVIDER}*.wav")) for word in KEYWORDS)


def locate_speech_commands(cfg: DataConfig, root: Path) -> Path:
    if cfg.speech_commands_dir:
        folder = Path(cfg.speech_commands_dir).expanduser()
        if not _has_keywords(folder):
            raise DataNotFoundError(
                f"data.speech_commands_dir={str(folder)!r} holds no <word>/<speaker>_nohash_<n>.wav files of the "
                f"keywords {list(KEYWORDS)}"
            )
        return folder
    candidates = search_roots(cfg)
    for candidate in candidates:  # torchaudio's layout: <root>/SpeechCommands/<version>/<word>/
        folder = candidate / "SpeechCommands" / cfg.speech_commands_version
        if _has_keywords(folder):
            return folder
    if cfg.download:
        from torchaudio.datasets import SPEECHCOMMANDS

        root.mkdir(parents=True, exist_ok=True)
        dataset = SPEECHCOMMANDS(str(root), url=cfg.speech_commands_version, download=True)
        return Path(dataset._path)  # the extracted archive: <root>/SpeechCommands/<version>
    raise DataNotFoundError(
        f"speech_commands: no {cfg.speech_commands_version} under "
        f"{[str(c / 'SpeechCommands' / cfg.speech_commands_version) for c in candidates]}. Online: set "
        f"data.download=true (torchaudio downloads it into data.root). Offline: point data.speech_commands_dir at a "
        f"folder of <word>/<speaker>_nohash_<n>.wav files, e.g. ../shared/data/speech_commands_v0.01_subset (100 "
        f"clips: enough for a smoke run, not for training; train offline on data.name=fsdd instead)."
    )


def locate_fsdd(cfg: DataConfig, root: Path) -> Path:
    if cfg.fsdd_dir:
        folder = explicit_folder("fsdd_dir", cfg.fsdd_dir)
        if not any(_FSDD_NAME.match(p.name) for p in folder.glob("*.wav")):
            raise DataNotFoundError(f"data.fsdd_dir={cfg.fsdd_dir!r} holds no {{digit}}_{{speaker}}_{{index}}.wav "
                                    f"recordings")
        return folder
    candidates = [c / "fsdd" / "recordings" for c in search_roots(cfg)]
    for folder in candidates:
        if folder.is_dir() and any(_FSDD_NAME.match(p.name) for p in folder.glob("*.wav")):
            return folder
    raise DataNotFoundError(
        f"fsdd: no {{digit}}_{{speaker}}_{{index}}.wav recordings in {[str(c) for c in candidates]}. FSDD has no "
        f"torchaudio downloader: clone https://github.com/Jakobovski/free-spoken-digit-dataset and set "
        f"data.fsdd_dir to its recordings/ folder (or put it at <data.root>/fsdd/recordings)."
    )


# ---- audio and features --------------------------------------------------------------------
def read_clip(path: Path, settings: MfccSettings) -> Tensor:
    """One file as a mono float waveform of exactly ``clip_samples`` at ``sample_rate``."""
    import soundfile
    import torchaudio.functional as AF

    samples, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    wave = torch.from_numpy(np.ascontiguousarray(samples.mean(axis=1)))
    if rate != settings.sample_rate:
        wave = AF.resample(wave, rate, settings.sample_rate)
    return fit_length(wave, settings.clip_samples)


def fit_length(wave: Tensor, length: int) -> Tensor:
    """Centre ``wave`` in ``length`` samples: zero-pad both sides equally, or crop the middle."""
    excess = wave.shape[-1] - length
    if excess > 0:
        start = excess // 2
        return wave[..., start:start + length]
    if excess < 0:
        left = -excess // 2
        return torch.nn.functional.pad(wave, (left, -excess - left))
    return wave


def mfcc_transform(settings: MfccSettings):
    import torchaudio.transforms as AT

    return AT.MFCC(
        sample_rate=settings.sample_rate,
        n_mfcc=settings.n_mfcc,
        dct_type=2,
        norm="ortho",
        log_mels=True,
        melkwargs={
            "n_fft": settings.n_fft,
            "win_length": settings.win_length,
            "hop_length": settings.hop_length,
            "n_mels": settings.n_mels,
            "f_min": settings.f_min,
            "f_max": settings.f_max,
            "center": False,
            "power": 2.0,
        },
    )


@torch.no_grad()
def compute_features(files: Sequence[Path], settings: MfccSettings, chunk: int = 512) -> Tensor:
    """MFCCs of ``files`` as float32 (N, 1, frames, n_mfcc) — the expensive step the cache saves."""
    transform = mfcc_transform(settings)
    out = torch.empty(len(files), 1, settings.num_frames, settings.n_mfcc)
    for start in range(0, len(files), chunk):
        waves = torch.stack([read_clip(p, settings) for p in files[start:start + chunk]])
        waves = torch.nn.functional.pad(waves, (settings.edge_pad, settings.edge_pad))
        mfcc = transform(waves)  # (n, n_mfcc, frames)
        out[start:start + len(waves), 0] = mfcc.transpose(1, 2)
    return out


# ---- cache ---------------------------------------------------------------------------------
def cache_key(corpus: str, split: SpeechSplit, settings: MfccSettings) -> str:
    def listing(files, labels):
        return [[p.relative_to(split.folder).as_posix(), p.stat().st_size, y] for p, y in zip(files, labels)]

    description = {
        "format": CACHE_FORMAT,
        "corpus": corpus,
        "settings": asdict(settings),
        "train": listing(split.train_files, split.train_labels),
        "test": listing(split.test_files, split.test_labels),
    }
    return hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()[:20]


def cached_features(corpus: str, split: SpeechSplit, settings: MfccSettings, cache_dir: Path) -> dict[str, Tensor]:
    """Raw (unstandardised) features and labels, from the cache or computed and cached."""
    path = cache_dir / f"{corpus}-{cache_key(corpus, split, settings)}.pt"
    if path.is_file():
        try:
            cached = torch.load(path, map_location="cpu", weights_only=True)
            if cached["train_x"].shape[0] == len(split.train_files) and cached["test_x"].shape[0] == len(split.test_files):
                return cached
        except Exception as err:  # unreadable: recompute and overwrite
            log.warning("ignoring unreadable feature cache %s (%s)", path, err)
    log.info("computing %s MFCC features of %d clips into %s", corpus,
             len(split.train_files) + len(split.test_files), path)
    features = {
        "train_x": compute_features(split.train_files, settings),
        "train_y": torch.tensor(split.train_labels, dtype=torch.long),
        "test_x": compute_features(split.test_files, settings),
        "test_y": torch.tensor(split.test_labels, dtype=torch.long),
    }
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(path, lambda f: torch.save(features, f))
    except OSError as err:  # a read-only data root still trains, it only recomputes next time
        log.warning("could not cache features in %s (%s)", cache_dir, err)
    return features


# ---- entry point ---------------------------------------------------------------------------
def load_speech(cfg: DataConfig, root: Path):
    """``FederatedDataset`` of ``cfg.name`` in {speech_commands, fsdd}: (N, 1, 50, 16)
    MFCCs standardised per coefficient with the training set's statistics."""
    from fl_lightning.data.datasets import DataNotFoundError, FederatedDataset

    if cfg.mfcc_mels < MfccSettings.n_mfcc:
        raise ValueError(f"data.mfcc_mels={cfg.mfcc_mels} must be >= {MfccSettings.n_mfcc} (the MFCCs are taken from them)")
    settings = MfccSettings(n_mels=cfg.mfcc_mels)
    if cfg.name == "speech_commands":
        split = speech_commands_split(locate_speech_commands(cfg, root))
    elif cfg.name == "fsdd":
        split = fsdd_split(locate_fsdd(cfg, root))
    else:  # pragma: no cover
        raise ValueError(f"data.name={cfg.name!r} is not a speech corpus")
    if not split.train_files or not split.test_files:
        raise DataNotFoundError(f"{cfg.name} in {split.folder}: {len(split.train_files)} training and "
                                f"{len(split.test_files)} test clips; both splits need clips")
    features = cached_features(cfg.name, split, settings, root / "kws_features")
    train_x, test_x = features["train_x"], features["test_x"]
    mean = train_x.mean(dim=(0, 1, 2), keepdim=True)
    std = train_x.std(dim=(0, 1, 2), keepdim=True).clamp_min(1e-6)
    return FederatedDataset(
        cfg.name,
        ((train_x - mean) / std).contiguous(),
        features["train_y"],
        ((test_x - mean) / std).contiguous(),
        features["test_y"],
        num_classes=10,
    )
