"""Transformer-ish models for the tests (importable as `tests.transformer_models:<factory>`)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class HandAttentionEncoder(nn.Module):
    """Attention written out as Hugging Face's BERT writes it: q @ k^T / sqrt(d), softmax, @ v, then
    permute + .contiguous() + view (a real copy in torch); positions broadcast from torch.arange."""

    input_shape, input_dtype, input_high, num_classes = (8,), "int64", 50, 3

    def __init__(self, hidden: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.tok, self.pos = nn.Embedding(50, hidden), nn.Embedding(8, hidden)
        self.q, self.k, self.v, self.o = (nn.Linear(hidden, hidden) for _ in range(4))
        self.ln = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, 3)

    def split(self, x, b, t, d):
        return x.view(b, t, self.heads, d).permute(0, 2, 1, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b, t = ids.size(0), ids.size(1)
        x = self.tok(ids) + self.pos(torch.arange(t))
        c = x.size(2)
        d = c // self.heads
        q, k, v = self.split(self.q(x), b, t, d), self.split(self.k(x), b, t, d), self.split(self.v(x), b, t, d)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d)
        ctx = torch.matmul(F.softmax(scores, dim=-1), v)
        ctx = ctx.permute(0, 2, 1, 3).contiguous().view(b, t, c)
        x = self.ln(x + self.o(ctx))
        return self.head(x[:, 0])


def hand_attention() -> nn.Module:
    return HandAttentionEncoder()


class DropoutAttention(nn.Module):
    input_shape, input_dtype, input_high, num_classes = (8,), "int64", 50, 3

    def __init__(self) -> None:
        super().__init__()
        self.tok, self.q, self.head = nn.Embedding(50, 8), nn.Linear(8, 8), nn.Linear(8, 3)

    def forward(self, ids):
        x = self.q(self.tok(ids)).view(ids.size(0), 8, 2, 4).transpose(1, 2)
        y = F.scaled_dot_product_attention(x, x, x, dropout_p=0.1)  # dropout inside attention: refused
        return self.head(y.transpose(1, 2).reshape(ids.size(0), 8, 8)[:, 0])


class SplitQKV(nn.Module):
    input_shape, input_dtype, input_high, num_classes = (8,), "int64", 50, 3

    def __init__(self) -> None:
        super().__init__()
        self.tok, self.qkv, self.head = nn.Embedding(50, 8), nn.Linear(8, 24), nn.Linear(8, 3)

    def forward(self, ids):
        q, k, v = self.qkv(self.tok(ids)).split(8, dim=2)  # nanoGPT's fused projection: refused
        return self.head((q + k + v)[:, 0])


class TorchMHA(nn.Module):
    input_shape, input_dtype, input_high, num_classes = (8,), "int64", 50, 3

    def __init__(self) -> None:
        super().__init__()
        self.tok, self.mha, self.head = nn.Embedding(50, 8), nn.MultiheadAttention(8, 2, batch_first=True), nn.Linear(8, 3)

    def forward(self, ids):
        x = self.tok(ids)
        return self.head(self.mha(x, x, x, need_weights=False)[0][:, 0])


def dropout_attention() -> nn.Module:
    return DropoutAttention()


def split_qkv() -> nn.Module:
    return SplitQKV()


def torch_mha() -> nn.Module:
    return TorchMHA()


class TiedHead(nn.Module):
    input_shape, input_dtype, input_high, num_classes = (8,), "int64", 50, 50

    def __init__(self) -> None:
        super().__init__()
        self.tok, self.head = nn.Embedding(50, 8), nn.Linear(8, 50, bias=False)
        self.head.weight = self.tok.weight  # GPT-2's tied embedding: refused

    def forward(self, ids):
        return self.head(self.tok(ids))


def tied_head() -> nn.Module:
    return TiedHead()


class PaddedLabelsLM(nn.Module):
    """A token model that shifts its labels as Hugging Face's causal LMs do: pad with -100, drop the first. The
    padded labels are a forward tensor made of the labels, which live only until their last forward reader."""

    input_shape, input_dtype, input_high, num_classes, labels_shape = (8,), "int64", 40, 40, (8,)

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.tok = nn.Embedding(40, hidden)
        self.mid = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, 40)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.head(torch.tanh(self.mid(self.tok(ids))))
        shifted = F.pad(labels, (0, 1), value=-100)[:, 1:]
        return F.cross_entropy(logits.flatten(0, 1), shifted.flatten(), ignore_index=-100)


def padded_labels_lm() -> nn.Module:
    return PaddedLabelsLM()
