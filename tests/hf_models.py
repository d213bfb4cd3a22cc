"""Hugging Face `transformers` models built from small configs (no download), as a user would wrap them.

Each wrapper's forward(x, y) returns the model's own loss (`outputs.loss`), so they compile with
`--loss model`; `labels_shape` says what y looks like beside the batch dimension.
"""
from __future__ import annotations

import torch.nn as nn


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
