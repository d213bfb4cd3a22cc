"""Hugging Face `transformers` models built from small configs (no download), as a user would wrap them, and a
timm-style EfficientNet block.

Each wrapper's forward(x, y) returns the model's own loss (`outputs.loss`), so they compile with
`--loss model`; `labels_shape` says what y looks like beside the batch dimension. The `*_default` models keep their
configs' dropouts (0.1, inside attention too), as a user who changes nothing has them.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class _HF(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x, y):
        if self.pixels:
            return self.model(pixel_values=x, labels=y).loss
        return self.model(input_ids=x, labels=y).loss


def bert():
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                     max_position_embeddings=16, num_labels=3, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)
    m = _HF(BertForSequenceClassification(cfg))
    m.pixels, m.input_shape, m.input_dtype, m.input_high, m.num_classes, m.labels_shape = False, (8,), "int64", 64, 3, ()
    return m


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0)
    m = _HF(GPT2LMHeadModel(cfg))  # the LM head is tied to the token embedding
    m.pixels, m.input_shape, m.input_dtype, m.input_high, m.num_classes, m.labels_shape = False, (8,), "int64", 64, 64, (8,)
    return m


def vit():
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=2, intermediate_size=64, num_labels=4, hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=0.0)
    m = _HF(ViTForImageClassification(cfg))
    m.pixels, m.input_shape, m.num_classes, m.labels_shape = True, (3, 16, 16), 4, ()
    return m


def _tokens(m: nn.Module, classes: int, labels_shape: tuple) -> nn.Module:
    m.pixels, m.input_shape, m.input_dtype, m.input_high, m.num_classes, m.labels_shape = \
        False, (8,), "int64", 64, classes, labels_shape
    return m


def gpt2_default():
    from transformers import GPT2Config, GPT2LMHeadModel

    return _tokens(_HF(GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2))),
                   64, (8,))


def bert_default():
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                     max_position_embeddings=16, num_labels=3)
    return _tokens(_HF(BertForSequenceClassification(cfg)), 3, ())


def t5():
    """The token embedding `shared` is tied to both stacks' embeddings and the LM head, and forward never reads it
    under its own name."""
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(vocab_size=64, d_model=32, d_kv=16, d_ff=64, num_layers=1, num_heads=2, decoder_start_token_id=0)
    return _tokens(_HF(T5ForConditionalGeneration(cfg)), 64, (8,))


def bart():
    """Tied `shared` embedding, and a decoder mask helper that asks whether its all-ones mask is all ones."""
    from transformers import BartConfig, BartForConditionalGeneration

    cfg = BartConfig(vocab_size=64, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                     decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=16)
    return _tokens(_HF(BartForConditionalGeneration(cfg)), 64, (8,))


def mobilevit_default():
    """SiLU throughout, bilinear interpolation where the last feature map (1x1) is unfolded into 2x2 patches, an
    in-place classifier dropout."""
    from transformers import MobileViTConfig, MobileViTForImageClassification

    cfg = MobileViTConfig(image_size=32, hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64],
                          num_labels=4, patch_size=2)
    m = _HF(MobileViTForImageClassification(cfg))
    m.pixels, m.input_shape, m.num_classes, m.labels_shape = True, (3, 32, 32), 4, ()
    return m


def _drop_path(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Stochastic depth as timm writes it: each sample's branch kept with probability 1 - p, scaled by 1 / (1 - p)."""
    if p == 0.0 or not training:
        return x
    keep = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(1 - p)
    return x * keep.div_(1 - p)


class _MBConv(nn.Module):
    """EfficientNet's inverted residual: 1x1 expand, depthwise 3x3, squeeze-excitation, 1x1 project, each with batch
    norm and SiLU, the residual branch dropped per sample (drop path)."""

    def __init__(self, c: int, expand: int = 4, drop_path: float = 0.2) -> None:
        super().__init__()
        h = c * expand
        self.expand, self.bn1 = nn.Conv2d(c, h, 1, bias=False), nn.BatchNorm2d(h)
        self.dw, self.bn2 = nn.Conv2d(h, h, 3, padding=1, groups=h, bias=False), nn.BatchNorm2d(h)
        self.se_reduce, self.se_expand = nn.Conv2d(h, max(1, c // 4), 1), nn.Conv2d(max(1, c // 4), h, 1)
        self.project, self.bn3 = nn.Conv2d(h, c, 1, bias=False), nn.BatchNorm2d(c)
        self.p = drop_path

    def forward(self, x):
        h = F.silu(self.bn1(self.expand(x)))
        h = F.silu(self.bn2(self.dw(h)))
        h = h * torch.sigmoid(self.se_expand(F.silu(self.se_reduce(h.mean((2, 3), keepdim=True)))))
        return x + _drop_path(self.bn3(self.project(h)), self.p, self.training)


class EfficientNetStyle(nn.Module):
    input_shape, num_classes = (3, 16, 16), 5

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.bn = nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(8)
        self.blocks = nn.Sequential(_MBConv(8), _MBConv(8))
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        h = self.blocks(F.silu(self.bn(self.stem(x))))
        return self.head(F.dropout(h.mean((2, 3)), 0.2, self.training))


def efficientnet_style():
    return EfficientNetStyle()
