"""Clients' local splits (``federation.local_split``): a paper's code that scores each client on
a split of its own data instead of the global test set. The loop only asks for the split by the
setting's value (``apply_local_split``); each value's data handling lives in its own module."""

from __future__ import annotations

from typing import Optional

import numpy as np

from fl_lightning.data import athena_local_split

#: setting value -> (the function that builds the clients' pools and local test splits, the
#: data sets it applies to)
LOCAL_SPLITS = {"athena_code": (athena_local_split.use_local_split, athena_local_split.IMAGE_SETS)}


def check_local_split(name: str, data_name: str) -> None:
    """A clear error for an unknown value or a data set the split cannot build."""
    if name == "none":
        return
    if name not in LOCAL_SPLITS:
        raise ValueError(f"federation.local_split={name!r} must be none or one of {sorted(LOCAL_SPLITS)}")
    sets = LOCAL_SPLITS[name][1]
    if data_name not in sets:
        raise ValueError(f"federation.local_split={name} augments image pixels; data.name={data_name} is not one of "
                         f"the image sets {sets}")


def apply_local_split(name: str, data, clients: list[np.ndarray], seed: int
                      ) -> tuple[list[np.ndarray], Optional[list[np.ndarray]]]:
    """(each client's training indices, each client's local test indices or None for ``none``);
    the split may replace ``data``'s training tensors with the clients' pools."""
    if name == "none":
        return clients, None
    return LOCAL_SPLITS[name][0](data, clients, seed)
