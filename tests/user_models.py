"""Models written the way PyTorch users write them (importable as `tests.user_models:<factory>`).

Each factory returns a module with `input_shape` (and, for token models, `input_dtype` / `input_high`) and
`num_classes`, small enough that a compile and two checked steps take a second or two.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class _Facts:
    input_shape: tuple = (3, 16, 16)
    num_classes: int = 5


class Activations(nn.Module, _Facts):
    """Sigmoid, SiLU, Hardswish, Hardsigmoid, LeakyReLU, GELU, Mish, and a mean head."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1, stride=2)
        self.acts = nn.ModuleList([nn.SiLU(), nn.Hardswish(), nn.LeakyReLU(0.1), nn.GELU(), nn.Mish()])
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        x = self.acts[0](self.c1(x))
        x = self.acts[1](x) * torch.sigmoid(x) + F.hardsigmoid(x)
        x = self.acts[2](self.c2(x))
        x = self.acts[4](self.acts[3](x))
        return self.fc(x.mean((2, 3)))


class SqueezeExcite(nn.Module, _Facts):
    """A MobileNetV3-style block: depthwise conv, BatchNorm, Hardswish, squeeze-excitation (x * gate)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.Hardswish())
        self.dw = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(16, 4, 1), nn.ReLU(), nn.Conv2d(4, 16, 1),
                                nn.Hardsigmoid())
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        x = self.dw(self.stem(x))
        x = x * self.se(x)
        return self.head(x.sum((2, 3)) / 256.0)


class Norms(nn.Module, _Facts):
    """GroupNorm, InstanceNorm, LayerNorm over channels-last, BatchNorm1d on features."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.gn = nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(2, 8)
        self.c2, self.inorm = nn.Conv2d(8, 8, 3, padding=1), nn.InstanceNorm2d(8, affine=True)
        self.ln = nn.LayerNorm(8)
        self.fc1, self.bn1d, self.fc2 = nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 5)

    def forward(self, x):
        x = F.relu(self.gn(self.c1(x)))
        x = F.relu(self.inorm(self.c2(x)))
        x = self.ln(x.permute(0, 2, 3, 1)).mean((1, 2))
        return self.fc2(F.relu(self.bn1d(self.fc1(x))))


class Segmenter(nn.Module, _Facts):
    """Encoder-decoder with ConvTranspose2d, nn.Upsample and F.interpolate; per-pixel classes (B, C, H, W)."""

    def __init__(self) -> None:
        super().__init__()
        self.down = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(),
                                  nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU())
        self.up1 = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.up2 = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.skip = nn.Conv2d(3, 8, 1)
        self.out = nn.Conv2d(8, 5, 1)

    def forward(self, x):
        y = self.up2(F.relu(self.up1(self.down(x))))
        y = y + F.interpolate(self.skip(x), size=y.shape[-2:], mode="nearest")
        return self.out(y)


class Recurrent(nn.Module):
    """A GRU then an LSTM over a sequence of feature vectors; classifies from the last step."""

    input_shape, num_classes = (6, 4), 3

    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(4, 8, batch_first=True)
        self.lstm = nn.LSTM(8, 8, batch_first=True)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        x, _ = self.gru(x)
        x, _ = self.lstm(x)
        return self.fc(x[:, -1])


class Encoder(nn.Module):
    """nn.TransformerEncoderLayer (nn.MultiheadAttention inside) on token ids, a bare nn.Parameter as the
    positional embedding, dropout 0.1 in its nn.Dropout modules (attention's own dropout_p is 0: torch draws
    that mask inside the attention op, where no eager reference can draw the same one)."""

    input_shape, input_dtype, input_high, num_classes = (8,), "int64", 40, 4

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(40, 16)
        self.pos = nn.Parameter(torch.randn(1, 8, 16) * 0.02)
        self.layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.1, batch_first=True)
        self.layer.self_attn.dropout = 0.0
        self.head = nn.Linear(16, 4)

    def forward(self, ids):
        return self.head(self.layer(self.tok(ids) + self.pos).mean(1))


class TiedLM(nn.Module):
    """A small causal LM whose output head shares the embedding's weight (tied): next-token loss."""

    input_shape, input_dtype, input_high, num_classes = (8,), "int64", 32, 32

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(32, 16)
        self.mha = nn.MultiheadAttention(16, 2, batch_first=True)
        self.ln = nn.LayerNorm(16)
        self.head = nn.Linear(16, 32, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("mask", torch.triu(torch.full((8, 8), float("-inf")), diagonal=1))

    def forward(self, ids):
        x = self.emb(ids)
        a, _ = self.mha(x, x, x, attn_mask=self.mask, need_weights=False)
        return self.head(self.ln(x + a))


class MixedDropout(nn.Module, _Facts):
    """nn.Dropout modules (one called twice) beside functional F.dropout calls, each with its own p."""

    input_shape = (12,)
    num_classes = 4

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(12, 48), nn.Linear(48, 48), nn.Linear(48, 4)
        self.drop = nn.Dropout(0.3)

    def forward(self, x):
        h = self.drop(torch.relu(self.fc1(x)))
        h = F.dropout(torch.relu(self.fc2(h)), 0.25, self.training)
        return self.fc3(self.drop(F.dropout(h, 0.5, self.training)))


def _backbone() -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 16, 3, padding=1, stride=2), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())


class Backbone(nn.Module, _Facts):
    """A small CNN backbone with a linear head. `frozen=True` freezes the backbone's first two conv blocks
    (fine-tuning its last block and the head; the frozen batch-norm layers stay in training mode, as a
    user's model.train() leaves them); `bias_only=True` trains only the backbone's biases and the head."""

    def __init__(self, frozen: bool = False, bias_only: bool = False) -> None:
        super().__init__()
        self.features = _backbone()
        self.head = nn.Linear(16, 5)
        for name, p in self.features.named_parameters():
            if (frozen and int(name.split(".")[0]) < 6) or (bias_only and not name.endswith("bias")):
                p.requires_grad_(False)

    def forward(self, x):
        return self.head(self.features(x).mean((2, 3)))


class WideConvs(nn.Module, _Facts):
    """Wide 3x3 convolutions on small maps: megabytes of weights beside kilobytes of activations, so a step's
    memory is mostly the state and the kernels' re-laid-out weights. `wide`, `stride`: the last two layers'
    channels and the stride into them (512 and 4: 2x2 maps, where at several threads oneDNN sums the weight
    gradient from one weight-sized buffer per thread, so its scratch grows with the thread count)."""

    input_shape = (3, 8, 8)

    def __init__(self, wide: int = 256, stride: int = 2) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 128, 3, padding=1), nn.ReLU(),
                                      nn.Conv2d(128, wide, 3, padding=1, stride=stride), nn.ReLU(),
                                      nn.Conv2d(wide, wide, 3, padding=1), nn.ReLU())
        self.head = nn.Linear(wide, 5)

    def forward(self, x):
        return self.head(self.features(x).mean((2, 3)))


class ConvBnReluPool(nn.Module):
    """conv-BN-ReLU-pool twice over 3x32x32 images (16 and 32 channels), global average pool, a linear head: the
    README's kind of CNN, whose backward chains ReLU's, batch norm's and the convolution's backward per block."""

    input_shape, num_classes = (3, 32, 32), 10

    def __init__(self) -> None:
        super().__init__()

        def block(cin, cout):
            return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

        self.net = nn.Sequential(*block(3, 16), nn.MaxPool2d(2), *block(16, 32), nn.MaxPool2d(2),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))

    def forward(self, x):
        return self.net(x)


class InvertedResidual(nn.Module):
    """MobileNetV2's block over 3x16x16 images: a conv-BN-ReLU6 stem, then 1x1 expand, depthwise 3x3 (each with
    BN and ReLU6), a 1x1 projection with its BN alone and a residual add; average pool, a linear head."""

    input_shape, num_classes = (3, 16, 16), 5

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU6())
        self.block = nn.Sequential(nn.Conv2d(8, 32, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU6(),
                                   nn.Conv2d(32, 32, 3, padding=1, groups=32, bias=False), nn.BatchNorm2d(32),
                                   nn.ReLU6(), nn.Conv2d(32, 8, 1, bias=False), nn.BatchNorm2d(8))
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        x = self.stem(x)
        return self.head((x + self.block(x)).mean((2, 3)))


# -- written as users write them: no num_classes anywhere; the class count is read from the output ----------

def image_classifier():
    """A small CNN over 3x32x32 images with 10 classes (its last Linear's), deep enough that half of plain
    backprop's activation memory is a feasible budget."""
    def block(cin, cout):
        return [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]

    return nn.Sequential(*block(3, 8), *(m for _ in range(6) for m in block(8, 8)), nn.MaxPool2d(2),
                         *block(8, 16), *block(16, 16), nn.MaxPool2d(2), *block(16, 32), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(32, 10))


class TokenClassifier(nn.Module):
    """A GRU over token ids (a vocabulary of 100) that sorts each sequence into one of 5 classes: (B, 5) logits,
    so labels are 0..4, not vocabulary ids."""

    input_shape, input_dtype, input_high = (12,), "int64", 100

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 16)
        self.gru = nn.GRU(16, 16, batch_first=True)
        self.out = nn.Linear(16, 5)

    def forward(self, ids):
        h, _ = self.gru(self.emb(ids))
        return self.out(h[:, -1])


class TransformerClassifier(nn.Module):
    """nn.TransformerEncoder over token ids (a vocabulary of 80), mean-pooled into 5 classes."""

    input_shape, input_dtype, input_high = (10,), "int64", 80

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(80, 16)
        layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 6, enable_nested_tensor=False)
        self.out = nn.Linear(16, 5)

    def forward(self, ids):
        return self.out(self.enc(self.emb(ids)).mean(1))


class PixelClassifier(nn.Module):
    """A segmentation net: each pixel of a 3x16x16 image into one of 4 classes, (B, 4, 16, 16) logits."""

    input_shape = (3, 16, 16)

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                                  *(m for _ in range(20) for m in (nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())),
                                  nn.Conv2d(8, 4, 1))

    def forward(self, x):
        return self.body(x)


def token_classifier():
    return TokenClassifier()


def transformer_classifier():
    return TransformerClassifier()


def pixel_classifier():
    return PixelClassifier()


def too_many_classes():
    """An encoder (4 output classes) whose num_classes attribute claims 9: refused."""
    m = Encoder()
    m.num_classes = 9
    return m


def fewer_classes():
    """An encoder (4 output classes) trained on 3 of them: its num_classes attribute says so."""
    m = Encoder()
    m.num_classes = 3
    return m


def activations():
    return Activations()


def squeeze_excite():
    return SqueezeExcite()


def norms():
    return Norms()


def segmenter():
    return Segmenter()


def recurrent():
    return Recurrent()


def encoder():
    return Encoder()


def tied_lm():
    return TiedLM()


def mixed_dropout():
    return MixedDropout()


def backbone():
    return Backbone()


def wide_convs():
    return WideConvs()


def wide_small_maps():
    return WideConvs(wide=512, stride=4)


def frozen_backbone():
    return Backbone(frozen=True)


def bias_only():
    return Backbone(bias_only=True)


class GatedMLP(nn.Module):
    """A transformer's feed-forward half as Llama writes it: RMSNorm by hand (pow, mean, rsqrt, scale), a SwiGLU
    (silu(a) * b) and a residual: chains of pointwise ops forward and backward (`compile --fuse`)."""

    input_shape, num_classes = (16, 32), 5

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.Parameter(torch.ones(32))
        self.gate, self.up, self.down = nn.Linear(32, 64, bias=False), nn.Linear(32, 64, bias=False), nn.Linear(64, 32)
        self.head = nn.Linear(32, 5)

    def forward(self, x):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.norm
        x = x + self.down(F.silu(self.gate(h)) * self.up(h))
        return self.head(torch.tanh(x) * 0.5 + x).mean(1)


def gated_mlp():
    return GatedMLP()


def smoothed_cross_entropy(output, labels):
    """A user's own loss (`--loss tests/user_models.py:smoothed_cross_entropy`)."""
    return F.cross_entropy(output, labels, label_smoothing=0.1) + 1e-3 * output.pow(2).mean()


def conv_bn_relu_pool():
    return ConvBnReluPool()


class SharedGradient(nn.Module):
    """A parameter of a hidden activation's shape (batch 8) added to it: its gradient is that activation's
    gradient itself, which its node holds (ReLU's backward reads it), so SGD's weight decay cannot go into it:
    the update allocates `grad + wd * param` (512 KiB)."""

    input_shape, num_classes = (64,), 4

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 16384), nn.Linear(16384, 4)
        self.a = nn.Parameter(torch.zeros(8, 16384))

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)) + self.a)


def shared_gradient():
    return SharedGradient()
