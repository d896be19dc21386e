"""Plain ``nn.Module`` architectures, kept apart from the LightningModules that train them."""

from fl_lightning.models.architectures import ARCHITECTURES, FashionCNN, VGG11, build_architecture

__all__ = ["ARCHITECTURES", "FashionCNN", "VGG11", "build_architecture"]
