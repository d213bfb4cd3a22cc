"""How zoo models initialize their weights (one rule for every family)."""
from __future__ import annotations

from torch import nn


def init_weights(model: nn.Module) -> None:
    """He init for convs (good for ReLU nets), BN as identity; Linear keeps torch's default."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
