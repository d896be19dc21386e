"""Training accuracy of the global model after each round's server step (``train/accuracy``).

The FedOVA journal's Table II reports accuracies near 98 % on Fashion-MNIST, above what the
network reaches on the test set; they read as training accuracy. So the server also scores
the new global model on the clients' pooled training data. Scoring all of it every round costs
a pass over the whole training set, so a fixed random subsample is scored instead: drawn once
from the run's seed, the same samples every round, so the curve's steps are the model's.
"""

from __future__ import annotations

import numpy as np
import torch

from fl_lightning.callbacks.base import FederatedCallback

BATCH = 1000


class TrainingAccuracy(FederatedCallback):
    """Args:
        samples: how many pooled training samples to score (all of them when the clients
            hold fewer); must be >= 1.
    """

    def __init__(self, samples: int = 10_000) -> None:
        if samples < 1:
            raise ValueError(f"training accuracy samples={samples} must be >= 1")
        self.samples = samples
        self.index: torch.Tensor | None = None

    def on_fit_start(self, federation) -> None:
        pooled = np.concatenate([np.asarray(ix, dtype=np.int64) for ix in federation.client_indices])
        if len(pooled) > self.samples:
            # its own stream, so drawing it changes no other random number of the run
            pooled = np.random.default_rng(federation.seed).choice(pooled, self.samples, replace=False)
        self.index = torch.from_numpy(np.sort(pooled))

    @torch.inference_mode()
    def on_clients_end(self, federation, round_index, results):
        data = federation._data  # the loaded data set: the server holds it for evaluation too
        x_all, y_all = data.train_x, data.train_y
        index = self.index.to(x_all.device)
        state = {k: v.to(federation.device) for k, v in federation.state.items()}
        correct = 0
        for start in range(0, len(index), BATCH):
            part = index[start:start + BATCH]
            xb = x_all[part].to(federation.device).contiguous(memory_format=torch.channels_last)
            scores = federation.strategy.predict_logits(state, xb)
            correct += int((scores.argmax(1) == y_all[part].to(federation.device)).sum())
        return {"train/accuracy": correct / len(index)}
