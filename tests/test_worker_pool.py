"""fl_lightning/worker_pool.py: forked workers over pipes of their own."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from fl_lightning.worker_pool import WorkerPool

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts /proc/self/fd")


def _many_tensors(seed: int) -> dict[str, torch.Tensor]:
    """A result the size of a client's kept Adam state: many small tensors."""
    g = torch.Generator().manual_seed(seed)
    return {f"p{k}": torch.randn(3, generator=g) for k in range(400)}


def _open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_results_held_by_the_parent_hold_no_file_descriptors():
    """Results travel by value: holding 2,000 received tensors (and sending them back out as
    jobs) opens no descriptor per tensor, which torch's shared-memory pickling would (errno 24
    once a run kept every client's optimizer state)."""
    pool = WorkerPool(2, _many_tensors)
    try:
        before = _open_files()
        held = {job: result for job, result, error in pool.imap_unordered(range(5)) if error is None}
        echoed = list(pool.imap_unordered([held[0]] * 2))
        assert _open_files() - before < 20
    finally:
        pool.close()
    assert sorted(held) == list(range(5))
    for job, result in held.items():  # what the worker computed, intact
        expected = _many_tensors(job)
        assert all(torch.equal(result[k], expected[k]) for k in expected)
    assert all(error is not None for _, _, error in echoed)  # a dict is no seed: the job's error comes back
