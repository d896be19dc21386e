"""ATHENA-FL's detector database (Step 5): every trained detector with its class, cluster,
round, validation metrics, size and parameters, in a real SQL store.

SQLAlchemy Core speaks to SQLite (the default, a file in the run folder) and to a shared
server such as PostgreSQL (``postgresql+psycopg://user@host/db``, with the driver installed)
when clients sit on several machines. Each write is one transaction: a crash leaves the
previous version of a detector or the new one, never half of one. Parameters are stored
as ``torch.save`` bytes and read back with ``weights_only=True`` (no code runs on load)."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor


@dataclass
class DetectorRecord:
    run: str
    cluster: int
    class_label: int
    round: int
    converged: bool
    val_accuracy: float
    val_samples: int
    cluster_classes: tuple[int, ...]  # the classes the detector's cluster holds (its negatives)
    architecture: str
    in_channels: int
    image_size: int
    params: dict[str, Tensor] = field(repr=False)

    @property
    def byte_size(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.params.values())


def _tables():
    from sqlalchemy import (Boolean, Column, Float, Integer, LargeBinary, MetaData, String, Table, Text,
                            UniqueConstraint)

    metadata = MetaData()
    detectors = Table(
        "detectors", metadata,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("run", String(255), nullable=False),
        Column("cluster", Integer, nullable=False),
        Column("class_label", Integer, nullable=False),
        Column("round", Integer, nullable=False),
        Column("converged", Boolean, nullable=False),
        Column("val_accuracy", Float, nullable=False),
        Column("val_samples", Integer, nullable=False),
        Column("cluster_classes", Text, nullable=False),
        Column("architecture", String(64), nullable=False),
        Column("in_channels", Integer, nullable=False),
        Column("image_size", Integer, nullable=False),
        Column("byte_size", Integer, nullable=False),
        Column("params", LargeBinary, nullable=False),
        UniqueConstraint("run", "cluster", "class_label", name="one_detector_per_cluster_class"),
    )
    return metadata, detectors


class DetectorDatabase:
    """``put`` upserts detectors (one per run, cluster and class), ``load`` reads them back."""

    def __init__(self, url: str) -> None:
        from sqlalchemy import create_engine
        from sqlalchemy.exc import ArgumentError, SQLAlchemyError

        self.url = url
        try:
            self.engine = create_engine(url)
            self.metadata, self.table = _tables()
            self.metadata.create_all(self.engine)
        except (ArgumentError, SQLAlchemyError, ModuleNotFoundError, ValueError) as error:
            raise ValueError(f"detector database url {url!r} cannot be opened: {error}") from error

    def put(self, records: list[DetectorRecord]) -> None:
        """All of ``records`` in one transaction, replacing earlier versions."""
        from sqlalchemy import and_, delete, insert

        with self.engine.begin() as connection:
            for r in records:
                t = self.table
                connection.execute(delete(t).where(and_(t.c.run == r.run, t.c.cluster == r.cluster,
                                                        t.c.class_label == r.class_label)))
                buffer = io.BytesIO()
                torch.save({k: v.detach().cpu().contiguous() for k, v in r.params.items()}, buffer)
                connection.execute(insert(t).values(
                    run=r.run, cluster=r.cluster, class_label=r.class_label, round=r.round, converged=r.converged,
                    val_accuracy=r.val_accuracy, val_samples=r.val_samples,
                    cluster_classes=json.dumps(list(r.cluster_classes)), architecture=r.architecture,
                    in_channels=r.in_channels, image_size=r.image_size, byte_size=r.byte_size,
                    params=buffer.getvalue()))

    def load(self, run: Optional[str] = None, converged_only: bool = False) -> list[DetectorRecord]:
        from sqlalchemy import select

        query = select(self.table).order_by(self.table.c.run, self.table.c.cluster, self.table.c.class_label)
        if run is not None:
            query = query.where(self.table.c.run == run)
        if converged_only:
            query = query.where(self.table.c.converged.is_(True))
        with self.engine.connect() as connection:
            rows = connection.execute(query).mappings().all()
        return [DetectorRecord(
            run=row["run"], cluster=row["cluster"], class_label=row["class_label"], round=row["round"],
            converged=bool(row["converged"]), val_accuracy=row["val_accuracy"], val_samples=row["val_samples"],
            cluster_classes=tuple(json.loads(row["cluster_classes"])), architecture=row["architecture"],
            in_channels=row["in_channels"], image_size=row["image_size"],
            params=torch.load(io.BytesIO(row["params"]), map_location="cpu", weights_only=True),
        ) for row in rows]

    def close(self) -> None:
        self.engine.dispose()
