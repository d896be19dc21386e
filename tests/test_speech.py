"""Keyword-spotting data (Speech Commands, FSDD), its MFCC cache, and the KWS CNN."""

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

from fl_lightning.cli import main
from fl_lightning.config import DataConfig
from fl_lightning.data import DataNotFoundError, load_dataset
from fl_lightning.data import speech
from fl_lightning.models import build_architecture
from tests.conftest import tiny_args

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
SUBSET = SHARED / "speech_commands_v0.01_subset"
FSDD = SHARED / "fsdd" / "recordings"


def write_wav(path: Path, label: int, rate: int = 16000, seconds: float = 0.8, seed: int = 0) -> None:
    """A learnable clip: a tone whose pitch depends on the label, plus noise (16-bit PCM)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(rate * seconds)) / rate
    wave = 0.3 * np.sin(2 * np.pi * (300 + 150 * label) * t) + 0.02 * rng.standard_normal(t.shape)
    path.parent.mkdir(parents=True, exist_ok=True)
    soundfile.write(str(path), wave.astype(np.float32), rate, subtype="PCM_16")


def speakers(split: str, count: int) -> list[str]:
    """Speaker ids that Speech Commands' hash rule puts in ``split``."""
    found, i = [], 0
    while len(found) < count:
        name = f"{i:08x}"
        if speech.which_set(f"{name}_nohash_0.wav") == split:
            found.append(name)
        i += 1
    return found


def write_speech_folder(folder: Path, train_speakers: int = 3, test_speakers: int = 1) -> dict[str, list[str]]:
    """``<word>/<speaker>_nohash_0.wav`` for the 10 keywords (plus a non-keyword and a noise
    folder that must be ignored); returns the relative paths per hash-rule split."""
    split = {"training": [], "testing": []}
    for name in ("training", "testing"):
        for s, speaker in enumerate(speakers(name, train_speakers if name == "training" else test_speakers)):
            for label, word in enumerate(speech.KEYWORDS):
                relative = f"{word}/{speaker}_nohash_0.wav"
                write_wav(folder / relative, label, seed=100 * s + label)
                split[name].append(relative)
    write_wav(folder / "bed" / "00000000_nohash_0.wav", 0)
    write_wav(folder / "_background_noise_" / "noise.wav", 0, seconds=2.0)
    return split


def config(tmp_path, **kw) -> DataConfig:
    return DataConfig(root=str(tmp_path / "data_root"), offline_roots=[], **kw)


def test_flat_folder_without_lists_follows_the_hash_rule(tmp_path):
    split = write_speech_folder(tmp_path / "words")
    data = load_dataset(config(tmp_path, name="speech_commands", speech_commands_dir=str(tmp_path / "words")))

    assert data.train_x.shape == (30, 1, 50, 16) and data.test_x.shape == (10, 1, 50, 16)
    assert data.input_size == (50, 16) and data.num_classes == 10 and data.train_y.dtype == torch.long
    assert sorted(data.test_y.tolist()) == list(range(10)) and sorted(data.train_y.tolist()) == sorted(list(range(10)) * 3)
    per_coefficient = data.train_x.transpose(0, 3).reshape(16, -1)  # standardised with training statistics
    assert per_coefficient.mean(1).abs().max() < 1e-4 and (per_coefficient.std(1) - 1).abs().max() < 1e-3
    assert len(split["testing"]) == 10


def test_torchaudio_layout_with_lists_is_found_under_the_data_root(tmp_path):
    folder = tmp_path / "data_root" / "SpeechCommands" / "speech_commands_v0.01"
    write_speech_folder(folder, train_speakers=2, test_speakers=0)
    files = sorted(p.relative_to(folder).as_posix() for p in folder.glob("*/*_nohash_*.wav") if p.parent.name != "bed")
    (folder / "testing_list.txt").write_text("\n".join(files[:3]) + "\n")
    (folder / "validation_list.txt").write_text(files[3] + "\n")  # validation clips train

    data = load_dataset(config(tmp_path, name="speech_commands"))

    assert data.test_x.shape == (3, 1, 50, 16) and data.train_x.shape == (17, 1, 50, 16)
    expected = [speech.KEYWORDS.index(f.split("/")[0]) for f in files[:3]]
    assert sorted(data.test_y.tolist()) == sorted(expected)


def test_missing_speech_commands_says_what_to_do(tmp_path):
    with pytest.raises(DataNotFoundError, match="data.download=true.*speech_commands_dir"):
        load_dataset(config(tmp_path, name="speech_commands"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataNotFoundError, match="speech_commands_dir"):
        load_dataset(config(tmp_path, name="speech_commands", speech_commands_dir=str(tmp_path / "empty")))
    with pytest.raises(DataNotFoundError, match="fsdd_dir"):
        load_dataset(config(tmp_path, name="fsdd"))


def test_fsdd_resamples_and_splits_indices_0_to_4_for_test(tmp_path):
    for digit in range(10):
        for speaker in ("ann", "bob"):
            for index in range(7):
                write_wav(tmp_path / "rec" / f"{digit}_{speaker}_{index}.wav", digit, rate=8000, seconds=0.5)
    (tmp_path / "rec" / "README.wav").write_bytes(b"")  # not a recording name: ignored

    data = load_dataset(config(tmp_path, name="fsdd", fsdd_dir=str(tmp_path / "rec")))

    assert data.train_x.shape == (40, 1, 50, 16) and data.test_x.shape == (100, 1, 50, 16)
    assert torch.bincount(data.test_y).tolist() == [10] * 10
    clip = speech.read_clip(tmp_path / "rec" / "3_ann_0.wav", speech.MfccSettings())
    assert clip.shape == (16000,)
    assert clip[:3000].abs().max() == 0 and clip[-3000:].abs().max() == 0  # 0.5 s centred in 1 s
    assert clip[4500:11500].abs().min() >= 0 and clip[4500:11500].abs().max() > 0.2


def test_clips_are_centred_padded_or_cropped_to_one_second():
    assert speech.fit_length(torch.ones(10), 16).tolist() == [0, 0, 0] + [1] * 10 + [0, 0, 0]
    assert speech.fit_length(torch.arange(20.0), 16).tolist() == list(range(2, 18))
    settings = speech.MfccSettings()
    assert settings.num_frames == 50
    assert speech.mfcc_transform(settings)(torch.zeros(2, 16000 + 2 * settings.edge_pad)).shape == (2, 16, 50)


def test_features_are_cached_reused_and_invalidated(tmp_path, monkeypatch):
    write_speech_folder(tmp_path / "words", train_speakers=2)
    calls = []
    original = speech.compute_features

    def counting(files, settings, **kw):
        calls.append((len(files), settings.n_mels))
        return original(files, settings, **kw)

    monkeypatch.setattr(speech, "compute_features", counting)
    cfg = config(tmp_path, name="speech_commands", speech_commands_dir=str(tmp_path / "words"))

    first = load_dataset(cfg)
    assert calls == [(20, 40), (10, 40)]  # train, then test
    cached = list((tmp_path / "data_root" / "kws_features").iterdir())
    assert len(cached) == 1 and cached[0].suffix == ".pt"  # and no partial file left behind

    again = load_dataset(cfg)
    assert len(calls) == 2  # reused: no audio touched
    assert torch.equal(first.train_x, again.train_x) and torch.equal(first.test_y, again.test_y)

    load_dataset(config(tmp_path, name="speech_commands", speech_commands_dir=str(tmp_path / "words"), mfcc_mels=32))
    assert calls[2:] == [(20, 32), (10, 32)]  # a feature setting changed: recomputed

    write_wav(tmp_path / "words" / "go" / f"{speakers('training', 3)[2]}_nohash_0.wav", 9)
    load_dataset(cfg)
    assert calls[4:] == [(21, 40), (10, 40)]  # the file list changed: recomputed
    assert len(list((tmp_path / "data_root" / "kws_features").iterdir())) == 3


@pytest.mark.skipif(not SUBSET.is_dir(), reason=f"the real Speech Commands subset is not at {SUBSET}")
def test_real_speech_commands_subset(tmp_path):
    data = load_dataset(config(tmp_path, name="speech_commands", speech_commands_dir=str(SUBSET)))

    assert len(data.train_y) + len(data.test_y) == 100
    assert data.train_x.shape[1:] == (1, 50, 16) and data.test_x.shape[1:] == (1, 50, 16)
    assert len(data.test_y) == 23  # the hash rule's testing speakers
    assert torch.bincount(data.train_y, minlength=10).min() >= 7 and torch.bincount(data.test_y, minlength=10).min() >= 2
    assert torch.isfinite(data.train_x).all() and torch.isfinite(data.test_x).all()


@pytest.mark.skipif(not FSDD.is_dir(), reason=f"the real FSDD recordings are not at {FSDD}")
def test_real_fsdd_split_is_upstreams():
    split = speech.fsdd_split(FSDD)
    assert len(split.train_files) == 2700 and len(split.test_files) == 300
    assert np.bincount(split.test_labels).tolist() == [30] * 10
    assert all(int(p.stem.split("_")[2]) < 5 for p in split.test_files)


def test_kws_cnn_shapes():
    x = torch.randn(4, 1, 50, 16)
    detector = build_architecture("kws_cnn", 1, (50, 16), 1)
    classifier = build_architecture("kws_cnn", 1, (50, 16), 10)
    assert detector(x).shape == (4, 1) and classifier(x).shape == (4, 10)
    convs = [m for m in classifier.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [16, 32, 64]
    assert [m.kernel_size for m in classifier.modules() if isinstance(m, torch.nn.MaxPool2d)] == [(1, 2)] * 3
    assert classifier.head[0].in_features == 64 * 50 * 2 and classifier.head[0].out_features == 256
    with pytest.raises(ValueError, match="square"):
        build_architecture("fashion_cnn", 1, (50, 16), 10)


def test_fedova_on_generated_speech_through_the_cli(tmp_path):
    write_speech_folder(tmp_path / "words", test_speakers=3)  # 30 training and 30 test clips
    args = tiny_args(tmp_path / "run", "--federation.rounds", "2", "--data.name", "speech_commands",
                     "--data.speech_commands_dir", str(tmp_path / "words"), "--data.root", str(tmp_path / "root"),
                     "--data.offline_roots", "[]", "--model.architecture", "kws_cnn", "--partition.num_clients", "5",
                     "--federation.client_fraction", "1.0", "--optimizer.name", "adam", "--optimizer.lr", "0.001")
    summary = main(["fit", *args])

    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert written["rounds"] == 2 and written["config"]["data"]["name"] == "speech_commands"
    assert "test/detector_acc/9" in written["history"][-1]
    # one pitch per keyword is learnable: well above chance (0.1; 12 of 30 right by chance: p < 0.001)
    assert summary["final_accuracy"] >= 0.4
