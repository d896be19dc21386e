"""``python -m fl_lightning compose --db_url URL --data.name ...``: ATHENA-FL's Step 6 from
the detector database alone — any process, any machine that reaches the database — and
the composed model's accuracy on a data set's test split."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch
from jsonargparse import ActionConfigFile, ArgumentParser

from fl_lightning.algorithms.athena.composition import Criterion
from fl_lightning.config import DataConfig


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="fl_lightning compose", description=__doc__)
    parser.add_argument("--config", action=ActionConfigFile)
    parser.add_argument("--db_url", type=str, required=True, help="the detector database (SQLAlchemy URL)")
    parser.add_argument("--run", type=Optional[str], default=None, help="only this run's detectors (default: all)")
    parser.add_argument("--criterion", type=Criterion, default="most_classes",
                        help="which detectors speak per class (fl_lightning.algorithms.athena.composition)")
    parser.add_argument("--converged_only", type=bool, default=False, help="skip detectors that never converged")
    parser.add_argument("--output", type=Optional[str], default=None, help="save the test predictions here (.pt)")
    parser.add_class_arguments(DataConfig, "data")
    return parser


def composed_from_database(db_url: str, run: Optional[str], criterion: str, converged_only: bool, num_classes: int):
    from fl_lightning.algorithms.athena.composition import compose
    from fl_lightning.algorithms.athena.detector_db import DetectorDatabase
    from fl_lightning.models import build_architecture

    database = DetectorDatabase(db_url)
    try:
        records = database.load(run=run, converged_only=converged_only)
    finally:
        database.close()
    if not records:
        raise ValueError(f"no detectors in {db_url!r}" + (f" for run {run!r}" if run else ""))
    kinds = {(r.architecture, r.in_channels, r.image_size) for r in records}
    if len(kinds) > 1:
        raise ValueError(f"the selected detectors mix architectures/input shapes {sorted(kinds)}; pick one --run")
    architecture, in_channels, image_size = kinds.pop()
    template = build_architecture(architecture, in_channels, image_size, 1)
    model, chosen = compose(template, records, [r.params for r in records], num_classes, criterion)
    return model.eval(), [records[i] for i in chosen], (in_channels, image_size)


def main(argv: Optional[list[str]] = None) -> dict:
    from fl_lightning.data import load_dataset
    from fl_lightning.data.preprocess import resize_images

    cfg = build_parser().parse_args(argv)
    data_cfg = DataConfig(**vars(cfg.data)) if not isinstance(cfg.data, DataConfig) else cfg.data
    data = load_dataset(data_cfg)
    if data_cfg.image_size:
        resize_images(data, data_cfg.image_size)
    model, chosen, (in_channels, image_size) = composed_from_database(cfg.db_url, cfg.run, cfg.criterion,
                                                                      cfg.converged_only, data.num_classes)
    if tuple(data.test_x.shape[1:]) != (in_channels, image_size, image_size):
        raise ValueError(f"the detectors take {in_channels}x{image_size}x{image_size} inputs, the data are "
                         f"{'x'.join(map(str, data.test_x.shape[1:]))} (set data.image_size)")
    with torch.inference_mode():
        scores = torch.cat([model(data.test_x[i:i + 500]) for i in range(0, len(data.test_x), 500)])
    predictions = scores.argmax(1)
    result = {"accuracy": float((predictions == data.test_y).float().mean()), "test_samples": len(predictions),
              "criterion": cfg.criterion,
              "detectors": [{"run": r.run, "cluster": r.cluster, "class": r.class_label, "round": r.round,
                             "converged": r.converged, "val_accuracy": r.val_accuracy} for r in chosen]}
    if cfg.output:
        Path(cfg.output).parent.mkdir(parents=True, exist_ok=True)
        torch.save({"predictions": predictions, "scores": scores}, cfg.output)
    print(json.dumps(result, indent=1))
    return result
