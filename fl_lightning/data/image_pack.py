"""A compact copy of an image data set: every image as JPEG bytes in one ``.npz`` file.

It exists to carry a data set to a machine that has none and little room to receive one
(the GPU machine takes 64 MiB per call): CIFAR-10's 60,000 images are 177 MB as pickles and
37 MB here. JPEG is lossy, so a pack is meant for copies that are lossy already, such as
shared/data's CIFAR-10 (a JPEG quality-75 rebuild): re-encoding it at quality 75 with the same
chroma subsampling left 60 % of the images bit-identical (of the first 2,000) and changed a pixel
by 0.16 grey levels on average (all 60,000); ``write`` records that mean absolute change in the
pack, so nobody has to take it on trust.

Write one with ``python -m fl_lightning.data.image_pack --data cifar10 --out FILE`` (data read
as a run would read it: ``--root`` / ``--offline-roots``); read it with ``data.image_pack: FILE``.
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from fl_lightning.atomic_file import write_atomic

FORMAT = "fl_lightning.image_pack/1"


class ImagePackError(ValueError):
    """A file that is not an image pack of the requested data set."""


def _encode(images: Tensor, quality: int) -> tuple[np.ndarray, np.ndarray]:
    """uint8 (N, C, H, W) images -> (all JPEG bytes concatenated, N + 1 offsets)."""
    from PIL import Image

    chunks, offsets = [], [0]
    for image in images.permute(0, 2, 3, 1).numpy():
        buffer = io.BytesIO()
        Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image).save(
            buffer, "JPEG", quality=quality, optimize=True)
        chunks.append(buffer.getvalue())
        offsets.append(offsets[-1] + len(chunks[-1]))
    return np.frombuffer(b"".join(chunks), dtype=np.uint8), np.asarray(offsets, dtype=np.int64)


def _decode(blob: np.ndarray, offsets: np.ndarray, shape: tuple[int, int, int]) -> Tensor:
    from PIL import Image

    channels = shape[0]
    out = np.empty((len(offsets) - 1, *shape), dtype=np.uint8)
    data = blob.tobytes()
    for i in range(len(out)):
        image = np.asarray(Image.open(io.BytesIO(data[offsets[i]:offsets[i + 1]])))
        out[i] = image[None] if channels == 1 else image.transpose(2, 0, 1)
    return torch.from_numpy(out)


def write(path: str | Path, name: str, train: tuple[Tensor, Tensor], test: tuple[Tensor, Tensor],
          quality: int = 75) -> dict:
    """Save uint8 (N, C, H, W) images and their labels; returns the pack's header, which holds
    the mean absolute pixel change the JPEG coding made (``mean_abs_change``)."""
    if not 1 <= quality <= 100:
        raise ValueError(f"quality={quality} must be in 1..100")
    arrays, change = {}, {}
    for split, (images, labels) in (("train", train), ("test", test)):
        if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] not in (1, 3):
            raise ImagePackError(f"{split} images must be uint8 (N, 1 or 3, H, W); got {images.dtype} "
                                 f"{tuple(images.shape)}")
        blob, offsets = _encode(images, quality)
        arrays[f"{split}_jpeg"], arrays[f"{split}_offsets"] = blob, offsets
        arrays[f"{split}_labels"] = labels.numpy().astype(np.int64)
        decoded = _decode(blob, offsets, tuple(images.shape[1:]))
        change[split] = float((decoded.int() - images.int()).abs().float().mean())
    header = {"format": FORMAT, "name": name, "shape": list(train[0].shape[1:]), "quality": quality,
              "mean_abs_change": change}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # np.savez writes into an open file: given a name without .npz, it would append one
    write_atomic(path, lambda f: np.savez(f, header=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8),
                                          **arrays))
    return header


def read(path: str | Path, name: str) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """The (images, labels) of the training and test splits: uint8 (N, C, H, W), int64 (N,)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"data.image_pack={str(path)!r} does not exist")
    try:
        with np.load(path) as pack:
            header = json.loads(pack["header"].tobytes().decode())
            arrays = {key: pack[key] for key in pack.files if key != "header"}
    except (OSError, ValueError, KeyError) as err:
        raise ImagePackError(f"data.image_pack={str(path)!r} is not an image pack ({type(err).__name__}: {err}); "
                             f"write one with `python -m fl_lightning.data.image_pack`") from err
    if header.get("format") != FORMAT:
        raise ImagePackError(f"data.image_pack={str(path)!r} has format {header.get('format')!r}; expected {FORMAT!r}")
    if header["name"] != name:
        raise ImagePackError(f"data.image_pack={str(path)!r} holds {header['name']!r}, but data.name is {name!r}")
    splits = []
    for split in ("train", "test"):
        try:
            offsets, labels = arrays[f"{split}_offsets"], arrays[f"{split}_labels"]
            if len(offsets) != len(labels) + 1:
                raise ImagePackError(f"data.image_pack={str(path)!r}: {len(labels)} {split} labels but "
                                     f"{len(offsets) - 1} {split} images")
            images = _decode(arrays[f"{split}_jpeg"], offsets, tuple(header["shape"]))
        except (OSError, ValueError, KeyError) as err:  # a missing array, a corrupt JPEG, a wrong shape
            if isinstance(err, ImagePackError):
                raise
            raise ImagePackError(f"data.image_pack={str(path)!r}: its {split} split cannot be read "
                                 f"({type(err).__name__}: {err})") from err
        splits.append((images, torch.from_numpy(labels)))
    return splits[0], splits[1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fl_lightning.data.image_pack", description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True, choices=["cifar10", "svhn", "mnist", "fashion_mnist"])
    parser.add_argument("--out", required=True, help="the .npz file to write")
    parser.add_argument("--root", default=None, help="data.root (default: $FL_LIGHTNING_DATA)")
    parser.add_argument("--offline-roots", nargs="*", default=["../shared/data"])
    parser.add_argument("--quality", type=int, default=75)
    args = parser.parse_args(argv)
    from fl_lightning.config import DataConfig
    from fl_lightning.data.datasets import load_uint8_splits

    cfg = DataConfig(name=args.data, root=args.root, offline_roots=args.offline_roots, check_integrity=False)
    train, test = load_uint8_splits(cfg)
    header = write(args.out, args.data, train, test, quality=args.quality)
    size = Path(args.out).stat().st_size
    print(json.dumps({**header, "file": args.out, "bytes": size, "train": len(train[1]), "test": len(test[1])}))


if __name__ == "__main__":
    main()
