"""Causal language models with peft LoRA adapters, built from configs (nothing downloaded), as a user wraps them.

Each wrapper's forward(x, y) returns the model's own loss (`--loss model`). The factories take the base's dtype
(`bfloat16`, `float16` or `float32`) and whether peft upcasts the adapters to float32 beside a half-precision
base (its default, `autocast_adapter_dtype=True`) or keeps them in the base's dtype.
"""
from __future__ import annotations

import torch
import torch.nn as nn


class CausalLM(nn.Module):
    def __init__(self, model: nn.Module, seq: int, vocab: int) -> None:
        super().__init__()
        self.model = model
        self.input_shape, self.input_dtype, self.input_high, self.labels_shape = (seq,), "int64", vocab, (seq,)
        self.num_classes = vocab

    def forward(self, x, y):
        return self.model(input_ids=x, labels=y).loss


def _lora(base: nn.Module, dtype: str, targets: list[str], r: int, upcast: bool) -> nn.Module:
    from peft import LoraConfig, get_peft_model

    base = base.to(getattr(torch, dtype))
    model = get_peft_model(base, LoraConfig(r=r, lora_alpha=2 * r, target_modules=targets, lora_dropout=0.0),
                           autocast_adapter_dtype=upcast)
    # peft starts lora_B at zero, which leaves lora_A's first gradient zero: a check would hold less.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.02)
    return model


def llama(dtype: str = "float32", upcast: bool = True, lora: bool = True, hidden: int = 32, mlp: int = 64,
          layers: int = 2, heads: int = 4, kv_heads: int = 2, vocab: int = 256, seq: int = 16, r: int = 4):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=seq,
                      tie_word_embeddings=True, attention_dropout=0.0)
    base = LlamaForCausalLM(cfg)
    model = _lora(base, dtype, ["q_proj", "v_proj"], r, upcast) if lora else base.to(getattr(torch, dtype))
    return CausalLM(model, seq, vocab)


def gpt2(dtype: str = "float32", upcast: bool = True, vocab: int = 256, seq: int = 16):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=vocab, n_positions=seq, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0)
    return CausalLM(_lora(GPT2LMHeadModel(cfg), dtype, ["c_attn"], 4, upcast), seq, vocab)


def llama_1b_slice():
    """Two layers of Llama-3.2-1B's shape (hidden 2048, MLP 8192, 32/8 heads, tied embedding) at vocabulary
    32000 and sequence 512, bf16 base, LoRA r=16 on q and v (float32 adapters, peft's default)."""
    return llama("bfloat16", True, hidden=2048, mlp=8192, layers=2, heads=32, kv_heads=8, vocab=32000, seq=512,
                 r=16)


def llama_1b(layers: int = 16, vocab: int = 128256, seq: int = 1024, hidden: int = 2048, heads: int = 32):
    """Llama-3.2-1B's shape (16 layers, hidden 2048, MLP 8192, 32/8 heads, tied embedding, vocabulary 128,256) at
    sequence 1024, bf16 base built in bf16 (never a float32 copy of the weights), LoRA r=16 on q and v."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=8192, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=8, max_position_embeddings=seq,
                      tie_word_embeddings=True, attention_dropout=0.0)
    base = LlamaForCausalLM._from_config(cfg, dtype=torch.bfloat16)
    model = get_peft_model(base, LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    return CausalLM(model, seq, vocab)


def llama_3b(seq: int = 2048):
    """Llama-3.2-3B's shape (28 layers, hidden 3072, MLP 8192, 24/8 heads, tied embedding, vocabulary 128,256) at
    context 2048, bf16 base built in bf16, LoRA r=16 on q and v."""
    return llama_1b(layers=28, seq=seq, hidden=3072, heads=24)


def llama_7b(layers: int = 32, vocab: int = 32000, seq: int = 512):
    """LLaMA-2-7B's shape (32 layers, hidden 4096, MLP 11008, 32 heads, untied head, vocabulary 32,000; `layers`
    takes a slice) at sequence `seq`, bf16 base built in bf16 (never a float32 copy), LoRA r=16 on q and v."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=4096, intermediate_size=11008, num_hidden_layers=layers,
                      num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=seq,
                      tie_word_embeddings=False, attention_dropout=0.0)
    base = LlamaForCausalLM._from_config(cfg, dtype=torch.bfloat16)
    model = get_peft_model(base, LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    return CausalLM(model, seq, vocab)


def llama_7b_4():
    """Four layers of LLaMA-2-7B's shape (the rest as llama_7b)."""
    return llama_7b(layers=4)


def llama_7b_8():
    """Eight layers of LLaMA-2-7B's shape (the rest as llama_7b)."""
    return llama_7b(layers=8)


def _real_adapters(model: nn.Module, seed: int = 0) -> None:
    """peft makes each adapter beside its layer's weight, on the meta device there: the trainable parameters
    (the adapters) made real, drawn from `seed` (lora_B nonzero, as in `_lora`)."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in list(model.named_parameters()):
        if p.requires_grad and p.is_meta:
            owner, _, leaf = name.rpartition(".")
            value = torch.empty(p.shape, dtype=p.dtype).normal_(std=0.02, generator=gen)
            model.get_submodule(owner)._parameters[leaf] = nn.Parameter(value)


def llama_meta(source: str | None = None, dtype: str = "bfloat16", hidden: int = 32, mlp: int = 64, layers: int = 2,
               heads: int = 4, kv_heads: int = 2, vocab: int = 256, seq: int = 16, r: int = 4, tied: bool = True):
    """`llama`'s shape with its frozen base (weights and buffers) on the meta device and LoRA adapters real, the
    base's values in the safetensors file `source` (the model's `weights_source`, keyed by its own names)."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=seq,
                      tie_word_embeddings=tied, attention_dropout=0.0)
    with torch.device("meta"):  # built as `llama` builds it (float32, then the base's dtype), on meta
        base = LlamaForCausalLM(cfg).to(getattr(torch, dtype))
        model = get_peft_model(base, LoraConfig(r=r, lora_alpha=2 * r, target_modules=["q_proj", "v_proj"],
                                                lora_dropout=0.0))
    _real_adapters(model)
    lm = CausalLM(model, seq, vocab)
    lm.weights_source = source
    return lm


def llama_7b_meta(source: str | None = None, layers: int = 32, seq: int = 512):
    """llama_7b built on the meta device (no memory for its 13.5 GB of frozen bf16 weights), their values in
    `source`; its adapters real (std 0.02, lora_B nonzero)."""
    return llama_meta(source, "bfloat16", hidden=4096, mlp=11008, layers=layers, heads=32, kv_heads=32,
                      vocab=32000, seq=seq, r=16, tied=False)


def write_deterministic_source(model: nn.Module, path: str, seed: int = 0) -> int:
    """A safetensors file of deterministic values for every meta tensor of `model` (a normal draw of std 0.02 for a
    weight, ones for a norm, the rotary buffer computed), written one tensor at a time: bytes written."""
    import json
    import struct

    metas = {**{k: p for k, p in model.named_parameters() if p.is_meta},
             **{k: b for k, b in model.named_buffers() if b.is_meta}}
    names = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.int64: "I64"}
    header, at = {}, 0
    for k, t in metas.items():
        n = t.numel() * t.element_size()
        header[k] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [at, at + n]}
        at += n
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    gen = torch.Generator().manual_seed(seed)
    with open(path + ".partial", "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for k, t in metas.items():
            if k.endswith("inv_freq"):
                d = 2 * t.numel()
                v = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
            elif k.endswith("norm.weight"):
                v = torch.ones(t.shape)
            else:
                v = torch.empty(t.shape).normal_(std=0.02, generator=gen)
            v = v.to(t.dtype).contiguous()
            f.write(memoryview(v.reshape(-1).view(torch.uint8).numpy()))
            del v
    import os

    os.replace(path + ".partial", path)
    return at
