"""Small models for the C code generator's tests (importable as `tests.c_models:<factory>`).

`tiny_cnn` and `tiny_branchy` are small enough that their generated plan.c can be committed as a snapshot
(tests/snapshots/); together they use every kernel of runtime/c. `evil_names` names its modules like an
attacker would: the generated C must turn them into harmless identifiers and comments.
"""
from __future__ import annotations

import torch
from torch import nn


class TinyCNN(nn.Module):
    """1x6x6 -> conv3x3(2)+ReLU -> max-pool 2 -> linear(3)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, padding=1)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(2 * 3 * 3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.relu(self.conv(x))), 1))


class TinyBranchy(nn.Module):
    """1x4x4 -> conv(2, no bias)+ReLU6 -> [depthwise conv, 1x1 conv] -> concat -> + residual of a conv ->
    ReLU -> avg-pool 2 -> global average pool -> linear(3): concat, add, gradient sums, relu6, pools."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, 2, 3, padding=1, bias=False)
        self.act = nn.ReLU6()
        self.dw = nn.Conv2d(2, 2, 3, padding=1, groups=2)
        self.pw = nn.Conv2d(2, 2, 1)
        self.skip = nn.Conv2d(2, 4, 1)
        self.relu = nn.ReLU()
        self.pool = nn.AvgPool2d(2)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.stem(x))
        y = torch.cat([self.dw(x), self.pw(x)], dim=1) + self.skip(x)
        y = self.gap(self.pool(self.relu(y)))
        return self.fc(y.view(y.size(0), -1))


class TinyDropoutCNN(nn.Module):
    """1x6x6 -> conv3x3(4)+ReLU -> Dropout(0.25) -> conv3x3(4)+ReLU -> max-pool 2 -> linear(8)+ReLU ->
    Dropout(0.5) -> linear(3): dropout on feature maps (whose output the second conv's weight gradient
    reads: below store-all it is recomputed from the ReLU's output) and on features."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.drop1 = nn.Dropout(0.25)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(4 * 3 * 3, 8)
        self.drop2 = nn.Dropout(0.5)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.drop1(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        return self.fc2(self.drop2(torch.relu(self.fc1(torch.flatten(x, 1)))))


class DropoutZero(nn.Module):
    """nn.Dropout(0.0), as model configs often have it: torch traces a copy (clone), which the C runtime makes."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(36, 8)
        self.drop = nn.Dropout(0.0)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(torch.relu(self.fc1(torch.flatten(x, 1)))))


class FunctionalDropout(nn.Module):
    """F.dropout called in forward: --emit c must refuse it, naming the line below."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(36, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(nn.functional.dropout(torch.relu(self.fc1(torch.flatten(x, 1))), 0.5, self.training))


EVIL = "x; system('echo pwned > /tmp/edgetrain-pwned')"  # torch.fx cannot trace a name with double quotes
EVIL_2 = "*/ int main(void) { return 1; } /* ??/"


class EvilNames(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.add_module(EVIL, nn.Conv2d(1, 2, 3, padding=1))
        self.add_module(EVIL_2, nn.Linear(2 * 6 * 6, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(getattr(self, EVIL)(x))
        return getattr(self, EVIL_2)(torch.flatten(x, 1))


def _zoo_like(cls, shape):
    def make(**kwargs) -> nn.Module:
        torch.manual_seed(0)
        return cls(**kwargs)

    make.input_shape = shape  # type: ignore[attr-defined]
    make.num_classes = 3  # type: ignore[attr-defined]
    return make


tiny_cnn = _zoo_like(TinyCNN, (1, 6, 6))
tiny_branchy = _zoo_like(TinyBranchy, (1, 4, 4))
evil_names = _zoo_like(EvilNames, (1, 6, 6))
tiny_dropout_cnn = _zoo_like(TinyDropoutCNN, (1, 6, 6))
functional_dropout = _zoo_like(FunctionalDropout, (1, 6, 6))
dropout_zero = _zoo_like(DropoutZero, (1, 6, 6))
# Tanh has no C kernel: --emit c must refuse these, naming the container's module or the line below.
tiny_tanh = _zoo_like(lambda: nn.Sequential(nn.Flatten(), nn.Linear(36, 8), nn.Tanh(), nn.Linear(8, 3)), (1, 6, 6))


class TinyTanhLine(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(36, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(torch.flatten(x, 1))))


tiny_tanh_line = _zoo_like(TinyTanhLine, (1, 6, 6))


class TinySE(nn.Module):
    """1x6x6 -> conv + hardswish -> squeeze-excitation (mean, 1x1 conv, SiLU, 1x1 conv, hardsigmoid, broadcast
    multiply) -> LeakyReLU -> GELU -> sigmoid -> mean over H,W -> linear(3): the activations of MCU CNNs."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.act = nn.Hardswish()
        self.squeeze = nn.Conv2d(4, 2, 1)
        self.se_act = nn.SiLU()
        self.excite = nn.Conv2d(2, 4, 1)
        self.gate = nn.Hardsigmoid()
        self.leaky = nn.LeakyReLU(0.1)
        self.gelu = nn.GELU()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.conv(x))
        s = self.gate(self.excite(self.se_act(self.squeeze(x.mean((2, 3), keepdim=True)))))
        x = self.gelu(self.leaky(x * s))
        return self.fc(torch.sigmoid(x).mean((2, 3)))


tiny_se = _zoo_like(TinySE, (1, 6, 6))


class TinyTokenMLP(nn.Module):
    """4 tokens x 8 features -> pre-norm channel-MLP block (LayerNorm, linear(16), GELU, linear(8), residual)
    -> LayerNorm -> flatten -> linear(3): a one-layer attention-free transformer block."""

    def __init__(self) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(8)
        self.up = nn.Linear(8, 16)
        self.act = nn.GELU()
        self.down = nn.Linear(16, 8)
        self.ln2 = nn.LayerNorm(8)
        self.head = nn.Linear(4 * 8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.down(self.act(self.up(self.ln1(x))))
        return self.head(torch.flatten(self.ln2(x), 1))


tiny_token_mlp = _zoo_like(TinyTokenMLP, (4, 8))


class TinyNarrowNorm(nn.Module):
    """LayerNorm over 4 features: its statistics are too large a share of its output to ride as aux."""

    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(4)
        self.head = nn.Linear(4 * 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.ln(x), 1))


tiny_narrow_norm = _zoo_like(TinyNarrowNorm, (4, 4))


class TinyBNOnFewPositions(nn.Module):
    """A batch norm after global pooling (at batch 2: two positions per channel, so torch keeps its statistics
    as nodes of their own) beside one on a feature map."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Conv2d(4, 8, 1)
        self.bn_head = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.gap(torch.relu(self.bn(self.conv(x))))
        return self.fc(torch.flatten(torch.relu(self.bn_head(self.head(x))), 1))


tiny_bn_on_few_positions = _zoo_like(TinyBNOnFewPositions, (1, 6, 6))


class FrozenWideHead(nn.Module):
    """Frozen 1x1 convolutions whose weights outgrow a 1 MB flash, one of them (1.31 MB) the 256 KB RAM as well:
    it is paged in from storage by blocks of output channels. Its batch norm and the classifier train."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.expand = nn.Conv2d(16, 1024, 1)
        self.wide = nn.Conv2d(1024, 320, 1)
        self.bn = nn.BatchNorm2d(320)
        self.fc = nn.Linear(320, num_classes)
        for p in (*self.expand.parameters(), *self.wide.parameters()):
            p.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn(self.wide(torch.relu(self.expand(x)))))
        return self.fc(x.mean((2, 3)))


def frozen_wide_head() -> nn.Module:
    torch.manual_seed(0)
    return FrozenWideHead()


class FrozenChain(nn.Module):
    """A frozen chain of convolutions (kernel, stride, dilation, depthwise or not), ReLU/ReLU6 and residual adds
    where shapes allow, from `layers` [(kind, ...)], then a trainable classifier: what tiling may replace."""

    def __init__(self, layers: list, channels: int = 3, num_classes: int = 4) -> None:
        super().__init__()
        self.convs = nn.ModuleList()
        self.layers = layers
        for kind, *a in layers:
            if kind == "conv":
                cout, k, s, d, depthwise = a
                cout = channels if depthwise else cout
                self.convs.append(nn.Conv2d(channels, cout, k, stride=s, padding=d * (k // 2), dilation=d,
                                            groups=channels if depthwise else 1, bias=bool(len(self.convs) % 2)))
                channels = cout
        self.fc = nn.Linear(channels, num_classes)
        for p in self.convs.parameters():
            p.requires_grad_(False)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        convs = iter(self.convs)
        for kind, *a in self.layers:
            if kind == "conv":
                y = next(convs)(x)
                x = x + y if a[-1] and y.shape == x.shape and a[2] == 1 else y  # a residual around a depthwise conv
            else:
                x = torch.relu(x) if kind == "relu" else nn.functional.relu6(x)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x).mean((2, 3)))


def frozen_chain(layers: list, channels: int = 3) -> nn.Module:
    torch.manual_seed(len(layers))
    return FrozenChain([tuple(v) for v in layers], channels)
