"""edgetrain's own model zoo (torchvision does not import beside torch 2.13 here).

The models are written for the frontend to trace, so they use a deliberately small set of ops:
Conv2d, Linear, ReLU, ReLU6, BatchNorm2d, MaxPool2d, AvgPool2d, AdaptiveAvgPool2d, Flatten,
view/reshape/torch.flatten, ``+`` for residuals, torch.cat, Dropout and Identity. A few user-model
habits are kept on purpose because the compiler must cope with them: ``nn.ReLU(inplace=True)`` and
one ReLU module called twice per block (ResNet, as torchvision writes it), and ``x.view`` instead of
a Flatten module (MobileNetV2).

Transformers (token-id inputs) live in ``zoo_transformers.py`` and are registered here.

Initialisation uses only torch's RNG, so ``torch.manual_seed(s); build(name)`` is deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import nn

from edgetrain.compiler.errors import ModelSpecError
from .zoo_init import init_weights
from .zoo_mcu import mcu_entries
from .zoo_transformers import transformer_entries

__all__ = ["ZOO", "ZooEntry", "UnknownModelError", "build", "names"]


# -- building blocks -----------------------------------------------------------------------------


def conv_bn_relu(cin: int, cout: int, *, stride: int = 1, inplace: bool = False) -> list[nn.Module]:
    """3x3 'same' conv + BatchNorm + ReLU; the conv has no bias because BN would cancel it."""
    return [
        nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=inplace),
    ]


# -- MNIST-sized models (1x28x28) ----------------------------------------------------------------


def mlp(num_classes: int = 10) -> nn.Module:
    """784-512-512-512-512-classes perceptron with one Dropout (exercises mask replay on recompute).

    Deep enough that no single backward stage needs most of the activations: the first layer's weight
    gradient needs the whole input batch, so a shallow MLP cannot go much below store-all.
    """
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(28 * 28, 512),
        nn.ReLU(),
        nn.Dropout(0.1),
        nn.Linear(512, 512),
        nn.ReLU(),
        nn.Linear(512, 512),
        nn.ReLU(),
        nn.Linear(512, 512),
        nn.ReLU(),
        nn.Linear(512, num_classes),
    )


def small_cnn(num_classes: int = 10) -> nn.Module:
    """Two stages of two conv+BN+ReLU and a max-pool (28 -> 14 -> 7), global average pool, linear head.

    Two convs per resolution: with one, a backward stage of the first layer would need more than half of
    store-all's activations and no 50% budget could exist.
    """
    model = nn.Sequential(
        *conv_bn_relu(1, 8),
        *conv_bn_relu(8, 8),
        nn.MaxPool2d(2),
        *conv_bn_relu(8, 16),
        *conv_bn_relu(16, 16),
        nn.MaxPool2d(2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, num_classes),
    )
    init_weights(model)
    return model


# -- VGG (CIFAR, 3x32x32) ------------------------------------------------------------------------

# Channel counts of the 3x3 conv layers; "M" is a 2x2 max-pool. Five pools take 32x32 to 1x1, so
# the classifier is a single Linear(512, classes) as in the usual CIFAR adaptation.
_VGG_CONFIGS: dict[str, tuple[int | str, ...]] = {
    "vgg11": (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    "vgg16": (64, 64, "M", 128, 128, "M", 256, 256, 256, "M",
              512, 512, 512, "M", 512, 512, 512, "M"),
    "vgg19": (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M",
              512, 512, 512, 512, "M", 512, 512, 512, 512, "M"),
}


class VGG(nn.Module):
    def __init__(self, config: Sequence[int | str], num_classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        cin = 3
        for item in config:
            if item == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                layers += conv_bn_relu(cin, int(item))
                cin = int(item)
        self.features = nn.Sequential(*layers)
        self.flatten = nn.Flatten()
        self.classifier = nn.Linear(cin, num_classes)
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.flatten(self.features(x)))


def vgg11(num_classes: int = 10) -> nn.Module:
    return VGG(_VGG_CONFIGS["vgg11"], num_classes)


def vgg16(num_classes: int = 10) -> nn.Module:
    return VGG(_VGG_CONFIGS["vgg16"], num_classes)


def vgg19(num_classes: int = 10) -> nn.Module:
    return VGG(_VGG_CONFIGS["vgg19"], num_classes)


# -- ResNet-18 (CIFAR) ---------------------------------------------------------------------------


def _shortcut(cin: int, cout: int, stride: int) -> nn.Module:
    """A residual block's shortcut: identity, or a 1x1 conv+BN when the shape changes."""
    if stride == 1 and cin == cout:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))


class BasicBlock(nn.Module):
    """Two 3x3 convs with a shortcut; a 1x1 conv+BN shortcut when the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        # In-place and called twice, as torchvision writes it: the frontend must lower both habits.
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = _shortcut(cin, cout, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.downsample(x))


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carrying the stride), 1x1 expand by 4, with a shortcut (ResNet-50's block)."""

    expansion = 4

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _shortcut(cin, cout, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + self.downsample(x))


class ResNet(nn.Module):
    """CIFAR ResNet: 3x3 stride-1 stem and no stem max-pool, so 32x32 inputs keep their detail."""

    def __init__(self, blocks: Sequence[int], num_classes: int = 10, block: type = BasicBlock) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        stages: list[nn.Module] = []
        cin = 64
        expansion = getattr(block, "expansion", 1)
        for i, (width, n) in enumerate(zip((64, 128, 256, 512), blocks)):
            stride = 1 if i == 0 else 2
            layer = [block(cin, width, stride)]
            cin = width * expansion
            layer += [block(cin, width, 1) for _ in range(n - 1)]
            stages.append(nn.Sequential(*layer))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512 * expansion, num_classes)
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet10(num_classes: int = 10) -> nn.Module:
    """One basic block per stage: ResNet-18's structure at half the depth (benchmarks/relaxation.py proves its
    smallest-budget schedule, a small copy of ResNet-18's hardest case)."""
    return ResNet((1, 1, 1, 1), num_classes)


def resnet18(num_classes: int = 10) -> nn.Module:
    return ResNet((2, 2, 2, 2), num_classes)


def resnet50(num_classes: int = 10) -> nn.Module:
    """ResNet-50 in its CIFAR shape: Bottleneck blocks [3, 4, 6, 3]."""
    return ResNet([3, 4, 6, 3], num_classes, block=Bottleneck)


# -- MobileNetV2 (CIFAR) -------------------------------------------------------------------------


def _make_divisible(value: float, divisor: int = 8) -> int:
    """Round a scaled channel count to a multiple of ``divisor`` without losing more than 10%."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


def _conv_bn_relu6(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1) -> list[nn.Module]:
    return [
        nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU6(),
    ]


class InvertedResidual(nn.Module):
    """1x1 expand -> 3x3 depthwise -> 1x1 linear projection, with a residual when shapes match."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers += _conv_bn_relu6(cin, hidden, 1)
        layers += _conv_bn_relu6(hidden, hidden, 3, stride=stride, groups=hidden)  # depthwise
        # No activation after the projection: the "linear bottleneck" of the MobileNetV2 paper.
        layers += [nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.conv = nn.Sequential(*layers)
        self.use_residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv(x)
        return x + out if self.use_residual else out


# (expansion t, output channels c, repeats n, first stride s). The second stage's stride is 1
# instead of ImageNet's 2, which with the stride-1 stem leaves a 4x4 map from a 32x32 input.
_MOBILENETV2_CONFIG = (
    (1, 16, 1, 1),
    (6, 24, 2, 1),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


class MobileNetV2(nn.Module):
    def __init__(self, num_classes: int = 10, width_mult: float = 1.0) -> None:
        super().__init__()
        if width_mult <= 0:
            raise ValueError(f"width_mult must be > 0, got {width_mult}")
        cin = _make_divisible(32 * width_mult)
        # Like the paper, the last conv is never narrowed below 1280 channels.
        self.last_channels = _make_divisible(1280 * max(1.0, width_mult))
        layers: list[nn.Module] = _conv_bn_relu6(3, cin, 3, stride=1)
        for t, c, n, s in _MOBILENETV2_CONFIG:
            cout = _make_divisible(c * width_mult)
            for i in range(n):
                layers.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        layers += _conv_bn_relu6(cin, self.last_channels, 1)
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(self.last_channels, num_classes)
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.features(x))
        return self.classifier(x.view(x.size(0), -1))


def mobilenetv2(num_classes: int = 10, width_mult: float = 1.0) -> nn.Module:
    return MobileNetV2(num_classes, width_mult)


# -- registry ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ZooEntry:
    name: str
    factory: Callable[..., nn.Module]
    input_shape: tuple[int, ...]  # (C, H, W) of one sample; (T,) token ids for a transformer
    num_classes: int
    description: str
    input_dtype: str = "float32"  # "int64": token ids in [0, input_high); a built model may refine these
    input_high: int | None = None


class UnknownModelError(ModelSpecError, KeyError):
    """A model name not in ``ZOO``: a KeyError for dict-like callers, a ModelSpecError for the CLI."""

    def __str__(self) -> str:
        # KeyError's default str() wraps the message in quotes; show it as written.
        return str(self.args[0]) if self.args else super().__str__()


_MNIST = (1, 28, 28)
_CIFAR = (3, 32, 32)

ZOO: dict[str, ZooEntry] = {
    e.name: e
    for e in (
        ZooEntry("mlp", mlp, _MNIST, 10, "784-512-512-512-512-10 MLP with ReLU and Dropout(0.1)"),
        ZooEntry("small_cnn", small_cnn, _MNIST, 10, "two stages of 2x(conv3x3+BN+ReLU)+maxpool, GAP, linear"),
        ZooEntry("vgg11", vgg11, _CIFAR, 10, "VGG-11 with BatchNorm, CIFAR variant"),
        ZooEntry("vgg16", vgg16, _CIFAR, 10, "VGG-16 with BatchNorm, CIFAR variant"),
        ZooEntry("vgg19", vgg19, _CIFAR, 10, "VGG-19 with BatchNorm, CIFAR variant"),
        ZooEntry("resnet10", resnet10, _CIFAR, 10, "ResNet-10, CIFAR variant (one basic block per stage)"),
        ZooEntry("resnet18", resnet18, _CIFAR, 10, "ResNet-18, CIFAR variant (3x3 stem, no stem pool)"),
        ZooEntry("resnet50", resnet50, _CIFAR, 10, "ResNet-50, CIFAR variant (Bottleneck [3,4,6,3])"),
        ZooEntry("mobilenetv2", mobilenetv2, _CIFAR, 10, "MobileNetV2, CIFAR variant (stride-1 stem), width_mult"),
    )
}
ZOO.update({e.name: e for e in mcu_entries(ZooEntry, _MNIST)})
ZOO.update({e.name: e for e in transformer_entries(ZooEntry)})


def names() -> list[str]:
    return list(ZOO)


def build(name: str, **kwargs) -> nn.Module:
    """Instantiate a zoo model; keyword arguments go to its factory (e.g. ``num_classes``)."""
    try:
        entry = ZOO[name]
    except KeyError:
        raise UnknownModelError(f"unknown model {name!r}; known models: {', '.join(ZOO)}") from None
    return entry.factory(**kwargs)
