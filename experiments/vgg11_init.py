"""Does one FedOVA detector (VGG-11, no batch normalisation) learn in one round's local
training, with torch's default initialisation and with NIID-Bench's He-normal convolutions?

One client's job in FedOVA's CIFAR-10 setting (non-IID-2): 250 images of each of two classes
(cat = positive, horse = negative), 5 epochs, B = 15, SGD with momentum 0.9, at the three step
sizes of the reproduction's grid. Prints and writes the standard deviation of the logits at
initialisation and the mean training loss of each epoch (chance: ln 2 = 0.693). One thread,
about 4 minutes.

    python experiments/vgg11_init.py --config configs/fedova_cifar.yaml [--data.image_pack PACK] --out reports/vgg11_init.json
"""
from __future__ import annotations

import argparse
import json
import time

import torch
from torch import nn

from fl_lightning.data.datasets import load_dataset
from fl_lightning.models import VGG11
from fl_lightning.config import DataConfig
from fl_lightning.settings import settings_parser


def torch_default(model: nn.Module) -> nn.Module:
    """The layers' own reset_parameters, without the architecture's init_weights."""
    for module in model.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
    return model


def one_client(model: nn.Module, x, y, lr: float, epochs: int = 5, batch: int = 15) -> list[float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for epoch in range(epochs):
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch))
        total = 0.0
        for start in range(0, len(x), batch):
            index = order[start:start + batch]
            loss = nn.functional.binary_cross_entropy_with_logits(model(x[index]).squeeze(1), y[index])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * len(index)
        losses.append(round(total / len(x), 4))
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="reports/vgg11_init.json")
    args, data_args = parser.parse_known_args()
    torch.set_num_threads(1)
    data = load_dataset(DataConfig(**settings_parser().parse_args(data_args).data.as_dict()))
    generator = torch.Generator().manual_seed(0)
    picks = [torch.nonzero(data.train_y == c).flatten() for c in (3, 7)]
    index = torch.cat([p[torch.randperm(len(p), generator=generator)[:250]] for p in picks])
    x, y = data.train_x[index], (data.train_y[index] == 3).float()
    rows = []
    for init in ("torch default", "He-normal convolutions (VGG11.init_weights)"):
        for lr in (0.001, 0.01, 0.1):
            torch.manual_seed(0)
            model = VGG11(in_channels=3, image_size=32, num_outputs=1)
            if init == "torch default":
                torch_default(model)
            with torch.no_grad():
                logit_std = model(x[:64]).std().item()
            started = time.time()
            losses = one_client(model, x, y, lr)
            rows.append({"init": init, "lr": lr, "logit_std_at_init": logit_std, "epoch_losses": losses,
                         "seconds": round(time.time() - started, 1)})
            print(json.dumps(rows[-1]), flush=True)
    with open(args.out, "w") as handle:
        json.dump({"setting": "one FedOVA client, CIFAR-10 cat vs horse, 250 + 250 images, 5 epochs, B = 15, "
                              "SGD momentum 0.9, one CPU thread", "chance_loss": 0.6931, "runs": rows},
                  handle, indent=1)


if __name__ == "__main__":
    main()
