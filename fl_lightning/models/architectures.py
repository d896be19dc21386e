"""The papers' networks as plain ``nn.Module``s.

``num_outputs`` is 1 for a one-vs-all detector (a single logit) and ``n`` for a
multi-class classifier, so FedOVA and FedAvg train the same backbone.
"""

from __future__ import annotations

from typing import Callable

from torch import nn


class FashionCNN(nn.Module):
    """FedOVA's Fashion-MNIST CNN (Section IV-A): two 5x5 conv layers with 16 and 32
    channels, each followed by 2x2 max pooling and ReLU, then a linear output layer.

    The paper names no hidden fully connected layer, so the flattened features
    (32 x 7 x 7 with 'same' padding) feed the output layer directly.
    """

    def __init__(self, in_channels: int = 1, image_size: int = 28, num_outputs: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 16, kernel_size=5, padding=2),
            nn.MaxPool2d(2),
            nn.ReLU(),
            nn.Conv2d(16, 32, kernel_size=5, padding=2),
            nn.MaxPool2d(2),
            nn.ReLU(),
            nn.Flatten(),
        )
        self.head = nn.Linear(32 * (image_size // 4) ** 2, num_outputs)

    def forward(self, x):
        return self.head(self.features(x))


# VGG configuration "A" (VGG-11) of Simonyan & Zisserman; "M" is 2x2 max pooling.
_VGG11_LAYERS = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")


class VGG11(nn.Module):
    """VGG-11 with the usual 32x32 head for CIFAR-10 (512 -> 512 -> 512 -> outputs).

    No batch normalisation and no dropout: FedOVA's paper uses plain VGG-11, and
    batch-norm statistics would not average meaningfully across one-vs-all clients.
    """

    def __init__(self, in_channels: int = 3, image_size: int = 32, num_outputs: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = in_channels
        for spec in _VGG11_LAYERS:
            if spec == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                layers += [nn.Conv2d(channels, spec, kernel_size=3, padding=1), nn.ReLU()]
                channels = spec
        layers.append(nn.Flatten())
        self.features = nn.Sequential(*layers)
        flat = 512 * (image_size // 32) ** 2
        self.head = nn.Sequential(
            nn.Linear(flat, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, num_outputs)
        )

    def forward(self, x):
        return self.head(self.features(x))


ARCHITECTURES: dict[str, Callable[..., nn.Module]] = {"fashion_cnn": FashionCNN, "vgg11": VGG11}


def build_architecture(name: str, in_channels: int, image_size: int, num_outputs: int) -> nn.Module:
    if name not in ARCHITECTURES:
        raise ValueError(f"model.architecture={name!r} is unknown; choose one of {sorted(ARCHITECTURES)}")
    return ARCHITECTURES[name](in_channels=in_channels, image_size=image_size, num_outputs=num_outputs)
