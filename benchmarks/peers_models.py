"""The models the peers benchmark adds to the zoo's, and what "a block" is in each model it checkpoints.

`llama`: a Hugging Face LlamaForCausalLM of about 5 M parameters from a small config (nothing downloaded),
wrapped as a user wraps a model that computes its own loss: forward(x, y) returns `outputs.loss` (compile with
`--loss model`), `labels_shape` gives y beside the batch dimension.
"""
from __future__ import annotations

import torch.nn as nn

LLAMA_SPEC = "benchmarks/peers_models.py:llama"
# 4 decoder layers, hidden 256, MLP 512, vocabulary 4096, 128 positions: 4.72 M parameters
LLAMA_CONFIG = dict(vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
                    tie_word_embeddings=False, attention_dropout=0.0, use_cache=False)  # training keeps no KV cache
LLAMA_SEQ = 128


class CausalLM(nn.Module):
    """A causal language model called with its labels: forward(ids, labels) -> the model's own loss."""

    def __init__(self, model: nn.Module, seq: int, vocab: int) -> None:
        super().__init__()
        self.model = model
        self.input_shape, self.input_dtype, self.input_high = (seq,), "int64", vocab
        self.num_classes, self.labels_shape = vocab, (seq,)

    def forward(self, x, y):
        return self.model(input_ids=x, labels=y).loss


def llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**LLAMA_CONFIG)
    cfg._attn_implementation = "eager"  # the attention written out in aten ops, as every method here runs it
    return CausalLM(LlamaForCausalLM(cfg), LLAMA_SEQ, cfg.vocab_size)


def block_types() -> tuple[type, ...]:
    """The module classes `torch.utils.checkpoint` wraps one call each of: a residual block of a ResNet, an
    inverted residual of MobileNetV2, a transformer block. (A Hugging Face model checkpoints its own layers:
    peers_methods.CheckpointStep turns that on.)"""
    from edgetrain.compiler.frontend.zoo import BasicBlock, Bottleneck, InvertedResidual
    from edgetrain.compiler.frontend.zoo_transformers import Block

    return (BasicBlock, Bottleneck, InvertedResidual, Block)
