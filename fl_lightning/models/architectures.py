"""The papers' networks as plain ``nn.Module``s.

``num_outputs`` is 1 for a one-vs-all detector (a single logit) and ``n`` for a
multi-class classifier, so FedOVA and FedAvg train the same backbone.
"""

from __future__ import annotations

import copy
from typing import Callable

from torch import nn

from fl_lightning.models.mobilenets import AthenaDetectorCNN, MobileNet, MobileNetV2


class FashionCNN(nn.Module):
    """FedOVA's Fashion-MNIST CNN (Section IV-A): two 5x5 conv layers with 16 and 32
    channels, each followed by 2x2 max pooling and ReLU, then the output layer.

    FedOVA calls it "an architecture in [1]" (McMahan et al. 2017), whose CNN has a fully
    connected layer of 512 units with ReLU before the output; FedOVA itself names no hidden
    layer. ``hidden_units`` = 0 (the default, the network of every result so far): the
    flattened features (32 x 7 x 7 with 'same' padding) feed the output layer directly and
    ``head`` is that one ``nn.Linear``; ``hidden_units`` = h > 0: ``head`` is
    Linear(features, h), ReLU, Linear(h, outputs) (512: McMahan et al.'s layer).
    """

    def __init__(self, in_channels: int = 1, image_size: int = 28, num_outputs: int = 10, hidden_units: int = 0) -> None:
        super().__init__()
        if hidden_units < 0:
            raise ValueError(f"model.hidden_units={hidden_units} must be >= 0 (0: no hidden layer)")
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 16, kernel_size=5, padding=2),
            nn.MaxPool2d(2),
            nn.ReLU(),
            nn.Conv2d(16, 32, kernel_size=5, padding=2),
            nn.MaxPool2d(2),
            nn.ReLU(),
            nn.Flatten(),
        )
        flat = 32 * (image_size // 4) ** 2
        self.head = (nn.Sequential(nn.Linear(flat, hidden_units), nn.ReLU(), nn.Linear(hidden_units, num_outputs))
                     if hidden_units else nn.Linear(flat, num_outputs))

    def forward(self, x):
        return self.head(self.features(x))


# VGG configuration "A" (VGG-11) of Simonyan & Zisserman; "M" is 2x2 max pooling.
_VGG11_LAYERS = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")


class VGG11(nn.Module):
    """VGG-11 with the usual 32x32 head for CIFAR-10 (512 -> 512 -> 512 -> outputs).

    No batch normalisation and no dropout: FedOVA's paper uses plain VGG-11, and
    batch-norm statistics would not average meaningfully across one-vs-all clients.
    The convolutions start as in NIID-Bench's VGG (model.py, from chengyangfu's
    pytorch-vgg-cifar10): He-normal over k·k·out_channels, zero bias. Without batch
    normalisation, torch's default (uniform, variance 1/(3·fan_in): a sixth of He's where
    the channels stay equal) shrinks the signal through eleven layers to logits of std
    ~2e-5, and a detector is still at chance after 5 local epochs at any step size in
    0.001-0.1 (experiments/vgg11_init.py; the one-round FedOVA runs on an H200 agreed).
    """

    def __init__(self, in_channels: int = 3, image_size: int = 32, num_outputs: int = 10) -> None:
        super().__init__()
        if image_size < 32:
            raise ValueError(f"vgg11 pools five times and needs images of at least 32x32, got {image_size}x{image_size}; "
                             f"set data.image_size: 32 (or choose another model.architecture)")
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
        self.init_weights()

    def init_weights(self) -> None:
        """The convolutions' reference initialisation (the linear layers keep torch's)."""
        for module in self.features.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(module.bias)

    def forward(self, x):
        return self.head(self.features(x))


class KWSCNN(nn.Module):
    """FedOVA's keyword-spotting CNN (Section IV-A) for (1, frames, coefficients) MFCC
    inputs, 50 x 16 in the paper: three conv layers with 16, 32 and 64 channels, each
    followed by 1x2 max pooling (along the coefficient axis only, so the 50 frames are
    kept: 16 -> 8 -> 4 -> 2 coefficients) and ReLU, then a 256-unit fully connected layer
    with ReLU, then the output layer.

    The paper gives no kernel size; 3x3 with padding 1 (shape-preserving) is used. The
    flattened features are 64 x 50 x 2 = 6400 for 50 x 16 inputs.
    """

    rectangular_inputs = True  # build_architecture passes (H, W)

    def __init__(self, in_channels: int = 1, image_size: int | tuple[int, int] = (50, 16), num_outputs: int = 10) -> None:
        super().__init__()
        height, width = (image_size, image_size) if isinstance(image_size, int) else image_size
        layers: list[nn.Module] = []
        channels = in_channels
        for out in (16, 32, 64):
            layers += [nn.Conv2d(channels, out, kernel_size=3, padding=1), nn.MaxPool2d((1, 2)), nn.ReLU()]
            channels, width = out, width // 2
        if width < 1:
            raise ValueError(f"KWSCNN needs at least 8 coefficients (input width), got {image_size}")
        layers.append(nn.Flatten())
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.Linear(64 * height * width, 256), nn.ReLU(), nn.Linear(256, num_outputs))

    def forward(self, x):
        return self.head(self.features(x))


class SimpleCNN(nn.Module):
    """The "simple CNN" of FedAvg/NIID-Bench/FedOV (FedOV Appendix B.1): two 5x5 conv layers
    (6 and 16 channels, no padding), each followed by ReLU and 2x2 max pooling, then fully
    connected layers of 120 and 84 units with ReLU, then the output layer.

    ``features`` ends after the 120-unit layer and ``head`` holds the rest: that is where
    the FedOV reference code takes PROSER's embedding (``x_mid``) for manifold mixup.
    """

    def __init__(self, in_channels: int = 1, image_size: int = 28, num_outputs: int = 10) -> None:
        super().__init__()
        side = ((image_size - 4) // 2 - 4) // 2
        if side < 1:
            raise ValueError(f"SimpleCNN needs images of at least 12x12, got {image_size}")
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 6, kernel_size=5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, kernel_size=5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(16 * side * side, 120), nn.ReLU(),
        )
        self.head = nn.Sequential(nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, num_outputs))

    def forward(self, x):
        return self.head(self.features(x))


class LogisticRegression(nn.Module):
    """Multinomial logistic regression (one logit for a one-vs-all detector): flatten, then
    one linear layer. Its cross-entropy is convex in the weights (strongly convex with weight
    decay), the setting of the FIM-L-BFGS paper's convergence theorem (Theorem 1)."""

    rectangular_inputs = True  # any (H, W)

    def __init__(self, in_channels: int = 1, image_size: int | tuple[int, int] = 28, num_outputs: int = 10) -> None:
        super().__init__()
        height, width = (image_size, image_size) if isinstance(image_size, int) else image_size
        self.features = nn.Flatten()
        self.head = nn.Linear(in_channels * height * width, num_outputs)

    def forward(self, x):
        return self.head(self.features(x))


ARCHITECTURES: dict[str, Callable[..., nn.Module]] = {"fashion_cnn": FashionCNN, "vgg11": VGG11, "kws_cnn": KWSCNN,
                                                      "simple_cnn": SimpleCNN, "logistic": LogisticRegression,
                                                      "athena_cnn": AthenaDetectorCNN, "mobilenet": MobileNet,
                                                      "mobilenet_v2": MobileNetV2}


# Architecture options of ModelConfig beyond the architecture's name, and who takes each.
ARCHITECTURE_OPTIONS: dict[str, tuple[str, ...]] = {"hidden_units": ("fashion_cnn",)}


def check_architecture_options(name: str, options: dict[str, int]) -> None:
    """An unknown architecture, a negative option, or an option (other than 0) that
    ``name`` does not take, named with its dotted key."""
    if name not in ARCHITECTURES:
        raise ValueError(f"model.architecture={name!r} is unknown; choose one of {sorted(ARCHITECTURES)}")
    for key, value in options.items():
        if key not in ARCHITECTURE_OPTIONS:
            raise TypeError(f"unknown architecture option {key!r}")
        if value < 0:
            raise ValueError(f"model.{key}={value} must be >= 0")
        if value and name not in ARCHITECTURE_OPTIONS[key]:
            raise ValueError(f"model.{key}={value} applies to model.architecture "
                             f"{' | '.join(ARCHITECTURE_OPTIONS[key])} only, not {name!r} (set it to 0)")


def build_architecture(name: str, in_channels: int, image_size: int | tuple[int, int], num_outputs: int,
                       **options: int) -> nn.Module:
    """``image_size``: the side of square inputs, or (H, W). Architectures for square
    images (fashion_cnn, vgg11) get the side; those marked ``rectangular_inputs`` get (H, W).
    ``options``: ModelConfig's architecture options (``hidden_units``); one the architecture
    does not take is refused unless it is 0 (unset)."""
    check_architecture_options(name, options)
    options = {k: v for k, v in options.items() if v}
    cls = ARCHITECTURES[name]
    height, width = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    if getattr(cls, "rectangular_inputs", False):
        return cls(in_channels=in_channels, image_size=(height, width), num_outputs=num_outputs, **options)
    if height != width:
        raise ValueError(f"model.architecture={name!r} needs square inputs; the data are {height}x{width} "
                         f"(speech corpora need model.architecture=kws_cnn)")
    return cls(in_channels=in_channels, image_size=width, num_outputs=num_outputs, **options)


def reinitialised(template: nn.Module) -> nn.Module:
    """A copy of ``template`` with fresh parameters drawn from torch's global generator: each
    layer's default, then the ``init_weights`` of any architecture that has its own (VGG-11)."""
    model = copy.deepcopy(template)
    for module in model.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
    for module in model.modules():
        if hasattr(module, "init_weights"):
            module.init_weights()
    return model
