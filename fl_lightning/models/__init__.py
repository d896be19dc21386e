"""Plain ``nn.Module`` architectures, kept apart from the LightningModules that train them."""

from fl_lightning.models.architectures import (ARCHITECTURES, KWSCNN, VGG11, FashionCNN, SimpleCNN,
                                               build_architecture, check_architecture_options, reinitialised)
from fl_lightning.models.mobilenets import AthenaDetectorCNN, MobileNet, MobileNetV2, last_layer_names

__all__ = ["ARCHITECTURES", "AthenaDetectorCNN", "MobileNet", "MobileNetV2", "last_layer_names", "FashionCNN", "KWSCNN", "SimpleCNN", "VGG11", "build_architecture", "check_architecture_options", "reinitialised"]
