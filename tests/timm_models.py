"""Real CNNs as their libraries build them, untrained (nothing downloaded), for the C firmware's tests and the
table in docs/cortex-m.md: Hugging Face's ResNet from a small config and timm's MobileNetV3, GhostNet, RepViT and
an EfficientNet (TinyNet-E), each with a 10-class head. Import as `tests/timm_models.py:<factory>`.
"""
from __future__ import annotations

import torch
from torch import nn


class Logits(nn.Module):
    """A Hugging Face image classifier's logits (the loss is --loss cross_entropy)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(pixel_values=x).logits


def _shaped(m: nn.Module, size: int) -> nn.Module:
    m.input_shape, m.num_classes = (3, size, size), 10
    return m


def hf_resnet() -> nn.Module:
    """transformers' ResNetForImageClassification: a 16-channel stem, two stages of one bottleneck each."""
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(0)
    cfg = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="bottleneck",
                       num_labels=10)
    return _shaped(Logits(ResNetForImageClassification(cfg)), 64)


def _timm(name: str, size: int, **kw) -> nn.Module:
    torch.manual_seed(0)
    import timm

    return _shaped(timm.create_model(name, pretrained=False, num_classes=10, **kw), size)


def mobilenetv3_small_050() -> nn.Module:
    return _timm("mobilenetv3_small_050", 64)


def ghostnet_050() -> nn.Module:
    return _timm("ghostnet_050", 64)


def repvit_m0_9() -> nn.Module:
    return _timm("repvit_m0_9", 64)


def repvit_tiny() -> nn.Module:
    """RepViT with a quarter of repvit_m0_9's widths (16 to 128) and one block a stage: its 4.7 M weights are
    18.9 MB, beyond any flash here."""
    return _timm("repvit_m0_9", 64, embed_dim=(16, 32, 64, 128), depth=(1, 1, 1, 1))


def tinynet_e() -> nn.Module:
    return _timm("tinynet_e", 64)


def efficientnet_test() -> nn.Module:
    """timm's smallest EfficientNet (stem, edge residuals, inverted residuals with SE, SiLU): 0.1 M weights."""
    return _timm("test_efficientnet", 64)
