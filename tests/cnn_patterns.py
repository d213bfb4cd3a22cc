"""Small CNNs with the patterns of the mobile architectures users fine-tune on microcontrollers, written
here, small enough for the fast tests (tests/timm_models.py has the libraries' own):

- `ghost_like`: GhostNet's ghost module (a 1x1 conv's channels and a cheap depthwise conv's, concatenated,
  sliced to the output width), its bottleneck with squeeze-excitation (hard-sigmoid gate) and a depthwise
  shortcut;
- `repvit_like`: RepViT's re-parameterizable depthwise mixer (3x3 depthwise conv + BN, 1x1 depthwise conv and
  identity, summed, then BN), a GELU channel mixer with a residual, and its classifier with a distillation
  head averaged in ((x + x_dist) / 2);
- `mbv3_like`: MobileNetV3's hardswish stem, an inverted residual with squeeze-excitation, a last conv's BN
  on a 2x2 map and a conv head after global pooling.
"""
from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F


def _conv_bn(cin, cout, k=1, stride=1, groups=1, act=None) -> nn.Sequential:
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, *([act()] if act else []))


class SqueezeExcite(nn.Module):
    def __init__(self, ch: int, reduced: int) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(ch, reduced, 1)
        self.expand = nn.Conv2d(reduced, ch, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.mean((2, 3), keepdim=True)
        return x * F.hardsigmoid(self.expand(F.relu(self.reduce(s))))


class GhostModule(nn.Module):
    def __init__(self, cin: int, cout: int, relu: bool = True) -> None:
        super().__init__()
        self.cout = cout
        init = (cout + 1) // 2
        act = nn.ReLU if relu else None
        self.primary = _conv_bn(cin, init, 1, act=act)
        self.cheap = _conv_bn(init, init, 3, groups=init, act=act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1 = self.primary(x)
        out = torch.cat([x1, self.cheap(x1)], dim=1)
        return out[:, :self.cout]


class GhostBottleneck(nn.Module):
    def __init__(self, cin: int, mid: int, cout: int, stride: int) -> None:
        super().__init__()
        self.ghost1 = GhostModule(cin, mid)
        self.dw = _conv_bn(mid, mid, 3, stride, groups=mid)
        self.se = SqueezeExcite(mid, max(mid // 4, 4))
        self.ghost2 = GhostModule(mid, cout, relu=False)
        self.shortcut = nn.Sequential(_conv_bn(cin, cin, 3, stride, groups=cin), _conv_bn(cin, cout, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ghost2(self.se(self.dw(self.ghost1(x))))
        return y + self.shortcut(x)


class GhostLike(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = _conv_bn(3, 8, 3, 2, act=nn.ReLU)
        self.block = GhostBottleneck(8, 16, 11, 2)
        self.head = nn.Conv2d(11, 16, 1)
        self.classifier = nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.adaptive_avg_pool2d(self.block(self.stem(x)), 1)
        return self.classifier(torch.flatten(F.relu(self.head(x)), 1))


class RepVggDw(nn.Module):
    def __init__(self, ch: int) -> None:
        super().__init__()
        self.conv = _conv_bn(ch, ch, 3, groups=ch)
        self.conv1 = nn.Conv2d(ch, ch, 1, groups=ch)
        self.bn = nn.BatchNorm2d(ch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x) + self.conv1(x) + x)


class RepViTBlock(nn.Module):
    def __init__(self, ch: int) -> None:
        super().__init__()
        self.token_mixer = RepVggDw(ch)
        self.se = SqueezeExcite(ch, 4)
        self.channel_mixer = nn.Sequential(_conv_bn(ch, 2 * ch, 1, act=nn.GELU), _conv_bn(2 * ch, ch, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.se(self.token_mixer(x))
        return x + self.channel_mixer(x)


class RepViTLike(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(_conv_bn(3, 8, 3, 2, act=nn.GELU), _conv_bn(8, 16, 3, 2))
        self.block = RepViTBlock(16)
        self.head = nn.Linear(16, num_classes)
        self.head_dist = nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(F.adaptive_avg_pool2d(self.block(self.stem(x)), 1), 1)
        return (self.head(x) + self.head_dist(x)) / 2


class InvertedResidual(nn.Module):
    def __init__(self, ch: int, mid: int) -> None:
        super().__init__()
        self.expand = _conv_bn(ch, mid, 1, act=nn.Hardswish)
        self.dw = _conv_bn(mid, mid, 3, groups=mid, act=nn.Hardswish)
        self.se = SqueezeExcite(mid, 8)
        self.project = _conv_bn(mid, ch, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.project(self.se(self.dw(self.expand(x))))


class MbV3Like(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = _conv_bn(3, 8, 3, 2, act=nn.Hardswish)
        self.block = InvertedResidual(8, 16)
        self.down = _conv_bn(8, 16, 3, 4, act=nn.Hardswish)
        self.last = _conv_bn(16, 32, 1, act=nn.Hardswish)
        self.conv_head = nn.Conv2d(32, 32, 1)
        self.classifier = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.last(self.down(self.block(self.stem(x))))
        x = F.hardswish(self.conv_head(F.adaptive_avg_pool2d(x, 1)))
        return self.classifier(torch.flatten(x, 1))


def _factory(cls, shape):
    def make() -> nn.Module:
        torch.manual_seed(0)
        return cls()

    make.input_shape = shape  # type: ignore[attr-defined]
    make.num_classes = 10  # type: ignore[attr-defined]
    return make


ghost_like = _factory(GhostLike, (3, 16, 16))
repvit_like = _factory(RepViTLike, (3, 16, 16))
mbv3_like = _factory(MbV3Like, (3, 16, 16))
