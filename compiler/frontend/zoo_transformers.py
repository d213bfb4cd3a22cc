"""Transformers of the zoo: a BERT-style encoder (classifies from the [CLS] token) and a GPT-style causal
decoder (next-token language model), written for the frontend to trace.

Both take int64 token ids of shape (batch, seq) and carry `input_shape`, `input_dtype`, `input_high` (the
vocabulary: ids lie in [0, vocab)) and `num_classes`, which `edgetrain compile` and `run --data random`
read. Attention is `F.scaled_dot_product_attention` (one op; on CPU its flash kernel, as autograd runs it),
q, k, v and the output projection are separate Linear layers, positions a learned embedding of
`torch.arange(seq)` broadcast over the batch. Every size is a keyword argument.
"""
from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn


class SelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, causal: bool) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden {hidden} is not a multiple of heads {heads}")
        self.heads, self.causal = heads, causal
        self.q, self.k, self.v, self.o = (nn.Linear(hidden, hidden) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.size(0), x.size(1), x.size(2)  # not `b, t, c = x.shape`: fx cannot unpack a proxy
        h = self.heads
        q = self.q(x).view(b, t, h, c // h).transpose(1, 2)
        k = self.k(x).view(b, t, h, c // h).transpose(1, 2)
        v = self.v(x).view(b, t, h, c // h).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.o(y.transpose(1, 2).reshape(b, t, c))


class FeedForward(nn.Module):
    def __init__(self, hidden: int, ffn: int, dropout: float) -> None:
        super().__init__()
        self.up, self.act, self.down, self.drop = nn.Linear(hidden, ffn), nn.GELU(), nn.Linear(ffn, hidden), nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.down(self.act(self.up(x))))


class Block(nn.Module):
    """Post-LN (BERT: x = LN(x + f(x))) or pre-LN (GPT: x = x + f(LN(x)))."""

    def __init__(self, hidden: int, heads: int, ffn: int, causal: bool, pre_ln: bool, dropout: float) -> None:
        super().__init__()
        self.pre_ln = pre_ln
        self.attn, self.ln1 = SelfAttention(hidden, heads, causal), nn.LayerNorm(hidden)
        self.ff, self.ln2 = FeedForward(hidden, ffn, dropout), nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre_ln:
            x = x + self.attn(self.ln1(x))
            return x + self.ff(self.ln2(x))
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.ff(x))


class Transformer(nn.Module):
    def __init__(self, *, layers: int, hidden: int, heads: int, ffn: int | None, seq: int, vocab: int,
                 num_classes: int | None, causal: bool, dropout: float = 0.0) -> None:
        super().__init__()
        self.causal = causal
        self.input_shape, self.input_dtype, self.input_high = (seq,), "int64", vocab
        self.num_classes = vocab if causal else num_classes
        ffn = ffn or 4 * hidden
        self.tok, self.pos = nn.Embedding(vocab, hidden), nn.Embedding(seq, hidden)
        self.ln_emb = nn.Identity() if causal else nn.LayerNorm(hidden)
        self.blocks = nn.Sequential(*(Block(hidden, heads, ffn, causal, causal, dropout) for _ in range(layers)))
        if causal:
            self.ln_f, self.head = nn.LayerNorm(hidden), nn.Linear(hidden, vocab)
        else:
            self.pooler, self.pool_act = nn.Linear(hidden, hidden), nn.Tanh()
            self.head = nn.Linear(hidden, num_classes)
        for m in self.modules():  # GPT-2/BERT initialisation: N(0, 0.02) weights, zero biases
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.size(1), device=ids.device))
        x = self.blocks(self.ln_emb(x))
        if self.causal:
            return self.head(self.ln_f(x))  # (batch, seq, vocab): next-token logits
        return self.head(self.pool_act(self.pooler(x[:, 0])))  # the [CLS] token


def bert(*, layers: int = 12, hidden: int = 768, heads: int = 12, ffn: int | None = 3072, seq: int = 128,
         vocab: int = 30522, num_classes: int = 2, dropout: float = 0.0) -> nn.Module:
    return Transformer(layers=layers, hidden=hidden, heads=heads, ffn=ffn, seq=seq, vocab=vocab,
                       num_classes=num_classes, causal=False, dropout=dropout)


def gpt(*, layers: int = 6, hidden: int = 384, heads: int = 6, ffn: int | None = 1536, seq: int = 128,
        vocab: int = 8192, dropout: float = 0.0) -> nn.Module:
    return Transformer(layers=layers, hidden=hidden, heads=heads, ffn=ffn, seq=seq, vocab=vocab,
                       num_classes=None, causal=True, dropout=dropout)


_TINY = {"layers": 2, "hidden": 32, "heads": 2, "ffn": 64, "seq": 16, "vocab": 100}


def transformer_entries(entry_type) -> list:
    """Zoo entries (ZooEntry is passed in: zoo.py imports this module)."""
    def e(name, factory, seq, classes, vocab, text):
        return entry_type(name, factory, (seq,), classes, text, input_dtype="int64", input_high=vocab)

    return [
        e("bert_base", bert, 128, 2, 30522, "BERT-base-like encoder: 12 layers, hidden 768, 12 heads, FFN 3072, "
          "vocab 30522, seq 128, [CLS] pooler + classifier"),
        e("gpt_small", gpt, 128, 8192, 8192, "GPT-style causal decoder: 6 layers, hidden 384, 6 heads, FFN 1536, "
          "vocab 8192, seq 128, next-token LM head"),
        e("bert_tiny", partial(bert, **_TINY, num_classes=4), 16, 4, 100, "BERT-style encoder for tests: 2 layers, "
          "hidden 32, 2 heads, seq 16, vocab 100, 4 classes"),
        e("gpt_tiny", partial(gpt, **_TINY), 16, 100, 100, "GPT-style decoder for tests: 2 layers, hidden 32, "
          "2 heads, seq 16, vocab 100"),
    ]
