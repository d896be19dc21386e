"""The random numbers of one client's open-set fit, as data (Algorithm 1, lines 5-7).

Every step of FedOV's local training draws: which destruction operation each image gets and
that operation's parameters (Section 3.4), and PROSER's mixup pairs and lambda ~ Beta(alpha,
alpha). ``OpenSetDraws`` draws them on the host from the client's own generators, seeded by its
client seed, in the order of its steps, and hands them out as tensors. The objective
(objective.py) only reads them, so the per-client engine (one step at a time, through
callbacks.outliers.OutlierDraws) and the cohort engine (a window of steps for every member at
once, read inside one captured step) see the same outliers and pairs by construction.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from fl_lightning.algorithms.fedov.destruction import draw_destruction_steps


def _beta(alpha: float, generator: torch.Generator) -> Tensor:
    """lambda ~ Beta(alpha, alpha) from ``generator``: torch.distributions.Beta's own sampler
    (the first coordinate of a Dirichlet(alpha, alpha) draw, float32), on the client's generator."""
    lam = torch._sample_dirichlet(torch.tensor([float(alpha), float(alpha)]), generator=generator)[0]
    # float64: 1 - lambda is then rounded once, as with the Python float it replaced
    return lam.double()


class OpenSetDraws:
    """One client's draws, step after step. ``loss``: the client's ``OpenSetLoss``; ``seed``: its
    client seed (``fl_lightning.client.client_seed``); ``image_size``: (H, W) of its images."""

    def __init__(self, loss, seed: int, image_size: tuple[int, int]) -> None:
        self.loss, self.image_size = loss, tuple(image_size)
        self.mixing = torch.Generator().manual_seed(seed)
        self.destruction = torch.Generator()
        if loss.needs_destruction:  # the fit's first draw seeds the destruction generator
            self.destruction.manual_seed(int(torch.randint(2**62, (1,), generator=self.mixing)))
        self.next_step = 0

    def take(self, step: int, n: int, width: int = 0) -> dict[str, Tensor]:
        """Step ``step``'s draws for a batch of ``n`` real samples, padded to ``width`` rows
        (default n): ``op`` (width,) and ``op_args`` (width, ARGS) of the destruction, ``pair``
        (width,) and ``lam`` () of the mixup, each only when the loss uses it. Steps must be
        taken in order: a draw out of turn would give this client another client's randomness."""
        return self.take_steps(step, [n], width)[0]

    def take_steps(self, start: int, sizes: Sequence[int], width: int = 0) -> list[dict[str, Tensor]]:
        """Steps start, start + 1, ...'s draws (``sizes[s]`` real samples each) at once, equal to
        ``take`` step after step: the cohort engine draws a window of steps this way."""
        if start != self.next_step:
            raise RuntimeError(f"open-set draws taken out of turn: step {start} asked, step {self.next_step} is next")
        if width and max(sizes, default=0) > width:
            raise ValueError(f"a batch of {max(sizes)} samples does not fit a width of {width}")
        self.next_step += len(sizes)
        destroyed = (draw_destruction_steps(sizes, *self.image_size, self.destruction, self.loss.destruction_ops)
                     if self.loss.needs_destruction else None)
        steps = []
        for s, n in enumerate(sizes):
            rows = width or n
            out: dict[str, Tensor] = {}
            if destroyed is not None:
                op, args = destroyed[s]
                out["op"] = torch.zeros(rows, dtype=torch.long)
                out["op"][:n] = op
                out["op_args"] = torch.zeros(rows, args.shape[1])
                out["op_args"][:n] = args.float()  # what the per-client path always cast them to
            if self.loss.mixup_weight != 0:
                out["pair"] = torch.arange(rows)  # padding pairs with itself
                out["pair"][:n] = torch.randperm(n, generator=self.mixing)
                out["lam"] = _beta(self.loss.mixup_alpha, self.mixing)
            steps.append(out)
        return steps
