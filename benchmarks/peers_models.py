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


def llama_1b_slice_fp32() -> nn.Module:
    """tests/llm_models.py's llama_1b_slice (two layers of Llama-3.2-1B's shape, vocabulary 32000, sequence 512,
    LoRA r=16 on q and v) with its base in float32: a CPU without bf16 instructions (AVX2 only) multiplies bf16
    matrices ~50x slower than float32 ones, which makes a bf16 step there take many minutes."""
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "llm_models.py")
    spec = importlib.util.spec_from_file_location("edgetrain_llm_models", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.llama("float32", True, hidden=2048, mlp=8192, layers=2, heads=32, kv_heads=8, vocab=32000, seq=512,
                     r=16)


def block_types() -> tuple[type, ...]:
    """The module classes `torch.utils.checkpoint` wraps one call each of: a residual block of a ResNet, an
    inverted residual of MobileNetV2, a transformer block. (A Hugging Face model checkpoints its own layers:
    peers_methods.CheckpointStep turns that on.)"""
    from edgetrain.compiler.frontend.zoo import BasicBlock, Bottleneck, InvertedResidual
    from edgetrain.compiler.frontend.zoo_transformers import Block

    return (BasicBlock, Bottleneck, InvertedResidual, Block)
