"""Plain ``nn.Module`` architectures, kept apart from the LightningModules that train them."""

from fl_lightning.models.architectures import (ARCHITECTURES, KWSCNN, VGG11, FashionCNN, SimpleCNN,
                                               build_architecture)

__all__ = ["ARCHITECTURES", "FashionCNN", "KWSCNN", "SimpleCNN", "VGG11", "build_architecture"]
