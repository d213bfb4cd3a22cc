"""Frontend handlers for the ops transformers use, mixed into the frontend's `_Builder`.

Each maps one fx construct to registry ops through the builder's `emit` / `permute` / `fail`; the tables
in `compiler/graph/forward.py` point at them. Attention must be `F.scaled_dot_product_attention` without a
mask or dropout (its CPU flash kernel is what autograd runs); matmul takes equal ranks without broadcasting.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F


class TransformerHandlers:
    def arg(self, n, k: int, name: str, default=None):
        return n.args[k] if len(n.args) > k else n.kwargs.get(name, default)

    def const(self, n, v):
        """A Python constant of this trace (an int from x.size(), a float), or a failure."""
        if isinstance(v, fx.Node):
            v = self.values.get(v.name)
            if isinstance(v, torch.Tensor):
                raise self.fail(n, f"`{n.target}` with a tensor where a constant is expected")
        return v

    def m_embedding(self, n, m: nn.Embedding):
        if m.max_norm is not None or m.scale_grad_by_freq or m.sparse:
            raise self.fail(n, "Embedding(max_norm / scale_grad_by_freq / sparse)", "Use the defaults.")
        ids = self.ref(n.args[0], n)
        if self.values[n.args[0].name].dtype != torch.int64:
            raise self.fail(n, "Embedding of a non-int64 tensor", "Token ids must be int64.")
        q = self.claim_module(n)
        self.module_of[n.name] = q
        pad = -1 if m.padding_idx is None else int(m.padding_idx)
        self.emit(n, "embedding", [ids], params=(f"{q}.weight",), attrs={"padding_idx": pad})

    def m_layernorm(self, n, m: nn.LayerNorm):
        if not m.elementwise_affine or m.bias is None:
            raise self.fail(n, "LayerNorm(elementwise_affine=False / bias=False)", "Use the defaults.")
        q = self.claim_module(n)
        self.module_of[n.name] = q
        self.emit(n, "layer_norm", [self.ref(n.args[0], n)], params=(f"{q}.weight", f"{q}.bias"),
                  attrs={"normalized_shape": list(m.normalized_shape), "eps": float(m.eps)})

    def m_gelu(self, n, m: nn.GELU):
        self.emit(n, "gelu", [self.ref(n.args[0], n)], attrs={"approximate": m.approximate})

    def f_gelu(self, n, *_):
        self.emit(n, "gelu", [self.ref(n.args[0], n)], attrs={"approximate": n.kwargs.get("approximate", "none")})

    def f_tanh(self, n, *_):
        self.emit(n, "tanh", [self.ref(n.args[0], n)])

    def m_tanh(self, n, m):
        self.f_tanh(n)

    def softmax(self, n, x, dim):
        if dim is None:
            raise self.fail(n, "softmax without dim")
        self.emit(n, "softmax", [x], attrs={"dim": int(dim) % len(self.shape(n))})

    def m_softmax(self, n, m: nn.Softmax):
        self.softmax(n, self.ref(n.args[0], n), m.dim)

    def f_softmax(self, n, *_):
        if self.arg(n, 3 if n.target is F.softmax else 2, "dtype") is not None:
            raise self.fail(n, "softmax with a dtype")
        self.softmax(n, self.ref(n.args[0], n), self.const(n, self.arg(n, 1, "dim")))

    def f_sdpa(self, n, *_):
        q, k, v = (self.arg(n, i, name) for i, name in enumerate(("query", "key", "value")))
        mask, p = self.arg(n, 3, "attn_mask"), self.const(n, self.arg(n, 4, "dropout_p", 0.0))
        if mask is not None or p or n.kwargs.get("enable_gqa"):
            raise self.fail(n, "scaled_dot_product_attention with attn_mask, dropout_p > 0 or enable_gqa",
                            "Use is_causal=True for a causal mask; dropout elsewhere.")
        vals = [self.values[t.name] for t in (q, k, v)]
        if any(t.dim() != 4 or t.stride(-1) != 1 or t.dtype != torch.float32 for t in vals):
            raise self.fail(n, "scaled_dot_product_attention on inputs that are not 4-D float32 with a unit "
                            "last stride", "Its CPU flash kernel (the one autograd uses) needs them.")
        scale = self.const(n, self.arg(n, 6, "scale"))
        self.emit(n, "sdpa", [self.ref(t, n) for t in (q, k, v)], attrs={
            "is_causal": bool(self.const(n, self.arg(n, 5, "is_causal", False))),
            "scale": None if scale is None else float(scale)})

    def f_matmul(self, n, *_):
        a, b = n.args[0], n.args[1]
        sa, sb = (tuple(self.values[t.name].shape) if isinstance(t, fx.Node) else () for t in (a, b))
        if len(sa) != len(sb) or len(sa) < 2 or sa[:-2] != sb[:-2]:
            raise self.fail(n, f"matmul of shapes {sa} and {sb}",
                            "Both operands need the same rank (>= 2) and batch dims (no broadcasting).")
        self.emit(n, "matmul", [self.ref(a, n), self.ref(b, n)])

    def f_scale(self, n, *_):
        a, b = n.args[0], n.args[1]
        b = self.values.get(b.name) if isinstance(b, fx.Node) else b  # a constant of the trace (a size)
        if not isinstance(a, fx.Node) or not isinstance(b, (int, float)) or n.kwargs.get("rounding_mode"):
            raise self.fail(n, f"`{n.target}` of two tensors (or of a constant by a tensor)",
                            "Only a tensor times (or divided by) a Python number.")
        divide = n.target in (operator.truediv, torch.div, "div")
        self.emit(n, "scale", [self.ref(a, n)], attrs={"value": float(b), "divide": divide})

    def f_arange(self, n, *_):
        v = self.values[n.name]
        if v.dtype != torch.int64 or v.dim() != 1 or v.numel() == 0:
            raise self.fail(n, "torch.arange that is not a non-empty int64 range")
        step = int(v[1] - v[0]) if v.numel() > 1 else 1
        start = int(v[0])
        self.emit(n, "arange", [], attrs={"start": start, "end": start + step * v.numel(), "step": step})

    def f_getitem(self, n, *_):
        x, idx = n.args
        idx = idx if isinstance(idx, tuple) else (idx,)
        spec = []
        for e in idx:
            if isinstance(e, int):
                spec.append(["int", e])
            elif isinstance(e, slice) and e.step in (None, 1) and not any(
                    isinstance(b, fx.Node) for b in (e.start, e.stop)):
                spec.append(["all"] if e.start is None and e.stop is None else ["range", e.start or 0, e.stop])
            else:
                raise self.fail(n, f"indexing with {e!r}", "Use ints and unit-step slices with constant bounds.")
        shape = self.values[x.name].shape
        for d, e in enumerate(spec):  # normalise to non-negative bounds, so the kernels need no sizes
            if e[0] == "int":
                e[1] %= shape[d]
            elif e[0] == "range":
                e[1:] = list(slice(e[1], e[2]).indices(shape[d])[:2])
        self.emit(n, "slice", [self.ref(x, n)], attrs={"index": spec})

    def f_transpose(self, n, *_):
        x = self.ref(n.args[0], n)
        rank = len(self.ref_shape(x))
        d0, d1 = (self.const(n, d) % rank for d in n.args[1:3])
        dims = list(range(rank))
        dims[d0], dims[d1] = dims[d1], dims[d0]
        self.permute(n, x, dims)

    def f_permute(self, n, *_):
        dims = n.args[1:] if len(n.args) > 2 or not isinstance(n.args[1], (tuple, list)) else n.args[1]
        self.permute(n, self.ref(n.args[0], n), [int(self.const(n, d)) for d in dims])
