"""Microcontroller-sized models (1x28x28 inputs) whose every op has a kernel in the C runtime.

`mcu_cnn` and `mcu_resnet` train every parameter. `mcu_mobilenetv2` and `mcu_mobilenetv3` are fine-tuning
models: their early layers come frozen (requires_grad=False, the weights kept in flash by the C firmware) and
their last blocks and classifier train, the way on-device training adapts a pretrained network within a few
hundred KB of RAM. `--train` chooses otherwise (`--train all` trains everything). `mcu_wide_mlp` has more
frozen float32 weights than a 1 MB flash holds: the C firmware streams some of them from storage.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from .zoo_init import init_weights


class McuCNN(nn.Module):
    """Three conv3x3(+bias)+ReLU+max-pool stages (28 -> 14 -> 7 -> 3, 4/16/32 channels) and one linear layer:
    8.2k parameters, so weights, momentum and a training step's activations fit a 256 KB microcontroller.
    Few channels at full resolution and more below it keep the deeper layers' saved activations the larger
    part of store-all's peak, so budgets below it exist (recompute or page the middle of the network)."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.relu1 = nn.ReLU()
        self.pool1 = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(4, 16, 3, padding=1)
        self.relu2 = nn.ReLU()
        self.pool2 = nn.MaxPool2d(2)
        self.conv3 = nn.Conv2d(16, 32, 3, padding=1)
        self.relu3 = nn.ReLU()
        self.pool3 = nn.MaxPool2d(2)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(32 * 3 * 3, num_classes)
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool1(self.relu1(self.conv1(x)))
        x = self.pool2(self.relu2(self.conv2(x)))
        x = self.pool3(self.relu3(self.conv3(x)))
        return self.fc(self.flatten(x))


class McuBlock(nn.Module):
    """A residual block without batch-norm: conv3x3+ReLU, conv3x3, plus the shortcut (a strided 1x1 conv
    when the shape changes), ReLU. One in-place ReLU module called twice, as torchvision writes it."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Conv2d(cin, cout, 1, stride=stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv2(self.relu(self.conv1(x)))
        return self.relu(out + self.shortcut(x))


class McuResNet(nn.Module):
    """Stride-2 stem conv3x3+ReLU (28 -> 14), two residual blocks (8 channels, then 16 at stride 2: 7x7 with a
    1x1 shortcut conv), global average pool and a linear head: residual adds and gradient sums on a MCU."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, 8, 3, stride=2, padding=1)
        self.relu = nn.ReLU()
        self.block1 = McuBlock(8, 8, 1)
        self.block2 = McuBlock(8, 16, 2)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, num_classes)
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.stem(x))
        x = self.block2(self.block1(x))
        return self.fc(torch.flatten(self.gap(x), 1))


def _conv_bn(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1,
             act: Callable[[], nn.Module] | None = None) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, groups=groups,
                                         bias=False), nn.BatchNorm2d(cout)]
    if act is not None:
        layers.append(act())
    return nn.Sequential(*layers)


class SqueezeExcite(nn.Module):
    """x * hardsigmoid(conv(relu(conv(mean over H, W of x)))): a per-channel gate (MobileNetV3)."""

    def __init__(self, channels: int, squeezed: int) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(channels, squeezed, 1)
        self.relu = nn.ReLU()
        self.expand = nn.Conv2d(squeezed, channels, 1)
        self.gate = nn.Hardsigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate(self.expand(self.relu(self.reduce(x.mean((2, 3), keepdim=True)))))


class McuInvertedResidual(nn.Module):
    """1x1 expand (unless `expand` is 1) -> depthwise -> optional squeeze-excitation -> 1x1 linear projection,
    with a residual when shapes match; `act` after the expansion and the depthwise conv (ReLU6 in MobileNetV2,
    ReLU or hardswish in MobileNetV3)."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int, act: Callable[[], nn.Module],
                 kernel: int = 3, se: bool = False) -> None:
        super().__init__()
        hidden = cin * expand
        layers: list[nn.Module] = [_conv_bn(cin, hidden, 1, act=act)] if expand != 1 else []
        layers.append(_conv_bn(hidden, hidden, kernel, stride, groups=hidden, act=act))
        if se:
            layers.append(SqueezeExcite(hidden, max(hidden // 4, 4)))
        layers.append(_conv_bn(hidden, cout, 1))  # no activation: MobileNetV2's linear bottleneck
        self.block = nn.Sequential(*layers)
        self.use_residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return x + out if self.use_residual else out


class McuMobileNetV2(nn.Module):
    """MobileNetV2 for 28x28: stride-2 stem (14x14), five inverted residual blocks (ReLU6; 7x7 and 4x4 after
    the strided ones), a 1x1 head conv, global average pool and a linear classifier (47k parameters)."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        relu6 = nn.ReLU6
        self.features = nn.Sequential(
            _conv_bn(1, 16, 3, stride=2, act=relu6),
            McuInvertedResidual(16, 16, 1, 1, relu6),
            McuInvertedResidual(16, 24, 2, 4, relu6),
            McuInvertedResidual(24, 24, 1, 4, relu6),
            McuInvertedResidual(24, 32, 2, 4, relu6),
            McuInvertedResidual(32, 32, 1, 4, relu6),
            _conv_bn(32, 128, 1, act=relu6),
        )
        self.classifier = nn.Linear(128, num_classes)
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).mean((2, 3)))


class McuMobileNetV3(nn.Module):
    """MobileNetV3-small for 28x28: stride-2 stem with hardswish, inverted residuals with ReLU then hardswish
    and squeeze-excitation (hardsigmoid gates), a 1x1 head conv, global average pool and a two-layer
    classifier with hardswish (no dropout: the C runtime has none)."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        hs, relu = nn.Hardswish, nn.ReLU
        self.features = nn.Sequential(
            _conv_bn(1, 16, 3, stride=2, act=hs),
            McuInvertedResidual(16, 16, 2, 1, relu, se=True),
            McuInvertedResidual(16, 24, 1, 3, relu),
            McuInvertedResidual(24, 32, 2, 3, hs, kernel=5, se=True),
            McuInvertedResidual(32, 32, 1, 2, hs, kernel=5, se=True),
            _conv_bn(32, 96, 1, act=hs),
        )
        self.classifier = nn.Sequential(nn.Linear(96, 64), nn.Hardswish(), nn.Linear(64, num_classes))
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).mean((2, 3)))


class McuWideMLP(nn.Module):
    """A trainable conv stem (conv3x3 stride 2 + ReLU + max-pool: 4x7x7 = 196 features), eight frozen
    Linear(196, 196)+ReLU layers (1,235,584 B of float32 weights and biases, more than a 1 MB flash holds) and
    a trainable linear classifier. The stem trains, so the backward runs through every frozen layer: each
    frozen weight is read by its forward and by its input-gradient backward."""

    def __init__(self, num_classes: int = 10, width: int = 196, depth: int = 8) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 4, 3, stride=2, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        layers: list[nn.Module] = [nn.Flatten()]
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU()]
        self.body = nn.Sequential(*layers)
        self.classifier = nn.Linear(width, num_classes)
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.body(self.stem(x)))


def _freeze_but(model: nn.Module, trained: tuple[str, ...]) -> nn.Module:
    """Fine-tuning's default: only the parameters under the `trained` module prefixes train."""
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith(trained))
    return model


# The modules a fine-tuning model trains by default: its last blocks and its classifier.
MOBILENETV2_TRAINED = ("features.5.", "features.6.", "classifier.")
MOBILENETV3_TRAINED = ("features.4.", "features.5.", "classifier.")
WIDE_MLP_TRAINED = ("stem.", "classifier.")


def mcu_cnn(num_classes: int = 10) -> nn.Module:
    return McuCNN(num_classes)


def mcu_resnet(num_classes: int = 10) -> nn.Module:
    return McuResNet(num_classes)


def mcu_mobilenetv2(num_classes: int = 10) -> nn.Module:
    return _freeze_but(McuMobileNetV2(num_classes), MOBILENETV2_TRAINED)


def mcu_mobilenetv3(num_classes: int = 10) -> nn.Module:
    return _freeze_but(McuMobileNetV3(num_classes), MOBILENETV3_TRAINED)


def mcu_wide_mlp(num_classes: int = 10) -> nn.Module:
    return _freeze_but(McuWideMLP(num_classes), WIDE_MLP_TRAINED)


def _conv_folded(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1,
                 act: Callable[[], nn.Module] | None = nn.ReLU6) -> nn.Sequential:
    """A frozen layer as a deployed network holds it: its batch norm folded into the conv's bias."""
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, groups=groups)]
    return nn.Sequential(*layers, act()) if act is not None else nn.Sequential(*layers)


class FoldedInvertedResidual(nn.Module):
    """MobileNetV2's inverted residual with its batch norms folded into the convs (a frozen, deployed block)."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        layers = [_conv_folded(cin, hidden, 1)] if expand != 1 else []
        layers += [_conv_folded(hidden, hidden, 3, stride, groups=hidden), _conv_folded(hidden, cout, 1, act=None)]
        self.block = nn.Sequential(*layers)
        self.use_residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return x + out if self.use_residual else out


class McuMbV2Finetune(nn.Module):
    """A MobileNetV2-style network for fine-tuning on a microcontroller: a frozen backbone of inverted residuals
    (batch norms folded into the convs, as deployed), then a 1x1 head conv whose batch norm and the linear
    classifier train (tiny-training's setting). `config`: (expansion, channels, repeats, first stride)."""

    def __init__(self, num_classes: int, stem: int, config: tuple, head: int, in_channels: int = 3) -> None:
        super().__init__()
        layers: list[nn.Module] = [_conv_folded(in_channels, stem, 3, stride=2)]
        cin = stem
        for t, c, n, s in config:
            for i in range(n):
                layers.append(FoldedInvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.Conv2d(cin, head, 1, bias=False), nn.BatchNorm2d(head), nn.ReLU6())
        self.classifier = nn.Linear(head, num_classes)
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.head(self.features(x)).mean((2, 3)))


# MobileNetV2 (ImageNet strides) at width 0.35: channels rounded to multiples of 8 as the paper does.
MBV2_W035_CONFIG = ((1, 8, 1, 1), (6, 8, 2, 2), (6, 16, 3, 2), (6, 24, 4, 2), (6, 32, 3, 1), (6, 56, 3, 2),
                    (6, 112, 1, 1))
MBV2_TRAINED = ("head.1.", "classifier.")  # the last conv's batch norm and the classifier


def mcu_mbv2_40(num_classes: int = 10) -> nn.Module:
    """3x40x40: stem to 20x20 with 16 channels, one 8x expansion (128 channels at 20x20), then 24 and 32 channels
    at 10x10 and 5x5; the backbone frozen."""
    config = ((8, 16, 1, 1), (4, 24, 1, 2), (4, 32, 1, 2))
    return _freeze_but(McuMbV2Finetune(num_classes, 16, config, 128), MBV2_TRAINED)


def mcu_mbv2_w035(num_classes: int = 10) -> nn.Module:
    """MbV2-w0.35 at 3x128x128 (tiny-training's setting): 16x64x64 after the stem, a 112 -> 1280 head conv."""
    return _freeze_but(McuMbV2Finetune(num_classes, 16, MBV2_W035_CONFIG, 1280), MBV2_TRAINED)


def mcu_entries(entry, shape: tuple[int, ...]) -> list:
    """The registry's entries for these models (`entry`: the zoo's entry class)."""
    return [
        entry("mcu_cnn", mcu_cnn, shape, 10, "Cortex-M CNN: 3x(conv3x3+ReLU+maxpool), linear; no BN"),
        entry("mcu_resnet", mcu_resnet, shape, 10,
              "Cortex-M residual CNN: stride-2 stem, 2 residual blocks, GAP, linear; no BN"),
        entry("mcu_mobilenetv2", mcu_mobilenetv2, shape, 10,
              "Cortex-M MobileNetV2 (BN, ReLU6, inverted residuals); fine-tunes its last blocks and classifier"),
        entry("mcu_mobilenetv3", mcu_mobilenetv3, shape, 10,
              "Cortex-M MobileNetV3-small (hardswish, squeeze-excitation); fine-tunes its last blocks and head"),
        entry("mcu_wide_mlp", mcu_wide_mlp, shape, 10,
              "Cortex-M wide MLP: 1.2 MB of frozen weights (more than its flash), trainable conv stem and classifier"),
        entry("mcu_mbv2_40", mcu_mbv2_40, (3, 40, 40), 10,
              "Cortex-M MobileNetV2-style, 3x40x40, 128-channel expansion at 20x20; frozen backbone, head BN + classifier train"),
        entry("mcu_mbv2_w035", mcu_mbv2_w035, (3, 128, 128), 10,
              "MobileNetV2 width 0.35 at 3x128x128 (tiny-training's setting); frozen backbone, head BN + classifier train"),
    ]
