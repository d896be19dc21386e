"""ATHENA-FL's networks (Section 5): the binary detector CNN, and the multi-class
MobileNet / MobileNetV2 its FedAvg baselines train (and its clustering probe).

The paper builds them with Keras on 32x32 images; here they are PyTorch modules with the
same layer structure. Keras's MobileNets keep their ImageNet strides on 32x32 inputs
(the final feature map is 1x1), and so do these: "adapted to 32x32" means the input
channels (1 for MNIST/FMNIST) and the class count, not a re-designed stem."""

from __future__ import annotations

from torch import nn


class AthenaDetectorCNN(nn.Module):
    """The one-vs-all detector of ATHENA-FL (adapted by the authors from a cats-vs-dogs
    classifier, Sanguineti 2021; layer sizes from their public code): five 3x3 'same'
    convolutions with 16, 32, 64, 64 and 64 channels, each followed by ReLU and 2x2 max
    pooling, a 512-unit fully connected layer with ReLU, and the output layer (1 logit for a
    detector). 131k parameters on 32x32x1 inputs: 524 kB in float32 (the paper's Keras file:
    551 kB)."""

    def __init__(self, in_channels: int = 1, image_size: int = 32, num_outputs: int = 1) -> None:
        super().__init__()
        side = image_size
        layers: list[nn.Module] = []
        channels = in_channels
        for out in (16, 32, 64, 64, 64):
            layers += [nn.Conv2d(channels, out, kernel_size=3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
            channels, side = out, side // 2
        if side < 1:
            raise ValueError(f"athena_cnn pools five times and needs images of at least 32x32, got {image_size}x"
                             f"{image_size}; set data.image_size: 32 (the paper resizes MNIST/FMNIST to 32x32)")
        self.features = nn.Sequential(*layers, nn.Flatten(), nn.Linear(64 * side * side, 512), nn.ReLU())
        self.head = nn.Linear(512, num_outputs)

    def forward(self, x):
        return self.head(self.features(x))


def _conv_bn(cin: int, cout: int, kernel: int, stride: int, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, kernel, stride, padding=kernel // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU6(inplace=True))


# (output channels, stride) of MobileNet's 13 depthwise-separable blocks (Howard et al. 2017, Table 1).
_MOBILENET_BLOCKS = ((64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2),
                     (512, 1), (512, 1), (512, 1), (512, 1), (512, 1), (1024, 2), (1024, 1))


class MobileNet(nn.Module):
    """MobileNet v1 (width 1.0) as Keras builds it: a strided 3x3 conv with 32 channels, 13
    depthwise-separable blocks (depthwise 3x3 + BN + ReLU6, pointwise 1x1 + BN + ReLU6),
    global average pooling, dropout (the authors' code: 0.1 on MNIST/FMNIST, 0.3 on CIFAR-10)
    and the classifier (Keras: a 1x1 conv, here the equivalent linear layer). 3.2 M parameters;
    the last layer is 1024 x classes + classes (41 kB for 10 classes, the paper's 41.48 kB)."""

    def __init__(self, in_channels: int = 3, image_size: int = 32, num_outputs: int = 10, dropout: float = 0.1) -> None:
        super().__init__()
        layers = [_conv_bn(in_channels, 32, 3, 2)]
        channels = 32
        for out, stride in _MOBILENET_BLOCKS:
            layers += [_conv_bn(channels, channels, 3, stride, groups=channels), _conv_bn(channels, out, 1, 1)]
            channels = out
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(dropout))
        self.head = nn.Linear(1024, num_outputs)

    def forward(self, x):
        return self.head(self.features(x))


class MobileNetV2(nn.Module):
    """torchvision's MobileNetV2 (Sandler et al. 2018, width 1.0) with its first convolution
    taking ``in_channels`` channels; ``head`` is its classifier (dropout 0.2 + linear)."""

    def __init__(self, in_channels: int = 3, image_size: int = 32, num_outputs: int = 10) -> None:
        super().__init__()
        from torchvision.models import mobilenet_v2

        net = mobilenet_v2(weights=None, num_classes=num_outputs)
        stem = net.features[0][0]
        net.features[0][0] = nn.Conv2d(in_channels, stem.out_channels, stem.kernel_size, stem.stride, stem.padding,
                                       bias=False)
        self.features = nn.Sequential(net.features, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = net.classifier

    def forward(self, x):
        return self.head(self.features(x))


def last_layer_names(model: nn.Module) -> list[str]:
    """Names of the parameters of the last module (in definition order) that has its own
    parameters: ATHENA-FL's "last layer" (e.g. ``head.weight``, ``head.bias``)."""
    last: list[str] = []
    for prefix, module in model.named_modules():
        own = [f"{prefix}.{name}" if prefix else name for name, _ in module.named_parameters(recurse=False)]
        if own:
            last = own
    if not last:
        raise ValueError(f"{type(model).__name__} has no parameters")
    return last
