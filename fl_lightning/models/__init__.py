"""Plain ``nn.Module`` architectures, kept apart from the LightningModules that train them."""

from fl_lightning.models.architectures import ARCHITECTURES, KWSCNN, VGG11, FashionCNN, build_architecture

__all__ = ["ARCHITECTURES", "FashionCNN", "KWSCNN", "VGG11", "build_architecture"]
