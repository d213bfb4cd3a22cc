"""The transformer kernels against torch: forward vs the functional, backward vs torch.autograd.grad.

They call the aten ops autograd calls, so every comparison is bitwise (`torch.equal`).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from edgetrain.runtime.python import KERNELS, KernelContext
from tests.test_runtime_kernels import bwd_attrs, grads_of, same

torch.manual_seed(0)


def run(op, inputs, params=(), attrs=None, ctx=None):
    """Run one kernel; its output (or each of a tuple of outputs) must own its memory."""
    inputs, params = [t.detach() for t in inputs], [p.detach() for p in params]
    res = KERNELS[op](ctx or KernelContext(), inputs, params, dict(attrs or {}))
    outs = res.out if isinstance(res.out, tuple) else (res.out,)
    ptrs = {t.untyped_storage().data_ptr() for t in inputs + params}
    assert all(o is None or o.untyped_storage().data_ptr() not in ptrs for o in outs), op
    return res


def test_embedding():
    w, ids = torch.randn(20, 6), torch.randint(0, 20, (3, 7))
    ids[0, :3] = 4  # repeated ids: their gradients are summed
    for pad in (-1, 4):
        attrs = {"padding_idx": pad}
        out = run("embedding", [ids], [w], attrs).out
        same(out, F.embedding(ids, w, padding_idx=None if pad < 0 else pad))
        gy = torch.randn_like(out)
        _, ref = grads_of(lambda w: F.embedding(ids, w, padding_idx=None if pad < 0 else pad), [w], gy)
        res = run("embedding_bwd", [gy, ids], [w], bwd_attrs(attrs, ids, needs=False))
        assert res.out is None
        same(res.grads[0], ref[0])


def test_arange():
    same(run("arange", [], attrs={"start": 2, "end": 11, "step": 3}).out, torch.arange(2, 11, 3))


@pytest.mark.parametrize("needs", [True, False])
def test_layer_norm(needs):
    x, w, b = torch.randn(3, 5, 8), torch.randn(8), torch.randn(8)
    attrs = {"normalized_shape": [8], "eps": 1e-5}
    res = run("layer_norm", [x], [w, b], attrs)
    same(res.out, F.layer_norm(x, (8,), w, b, 1e-5))
    gy = torch.randn_like(x)
    _, ref = grads_of(lambda x, w, b: F.layer_norm(x, (8,), w, b, 1e-5), [x, w, b], gy)
    ctx = KernelContext(aux=res.aux)
    g = run("layer_norm_bwd", [gy, x], [w, b], bwd_attrs(attrs, x, needs), ctx=ctx)
    if needs:
        same(g.out, ref[0])
    else:
        assert g.out is None
    same(g.grads[0], ref[1])
    same(g.grads[1], ref[2])


@pytest.mark.parametrize("op,f,attrs,saved", [
    ("gelu", lambda x: F.gelu(x), {"approximate": "none"}, "in"),
    ("gelu", lambda x: F.gelu(x, approximate="tanh"), {"approximate": "tanh"}, "in"),
    ("tanh", torch.tanh, {}, "out"),
    ("softmax", lambda x: F.softmax(x, -1), {"dim": 2}, "out"),
    ("softmax", lambda x: F.softmax(x, 1), {"dim": 1}, "out"),
    ("scale", lambda x: x / 4.0, {"value": 4.0, "divide": True}, None),
    ("scale", lambda x: x * 0.125, {"value": 0.125, "divide": False}, None),
])
def test_elementwise(op, f, attrs, saved):
    x = torch.randn(2, 6, 9)
    out = run(op, [x], attrs=attrs).out
    same(out, f(x))
    gy = torch.randn_like(out)
    _, ref = grads_of(f, [x], gy)
    operands = [gy] + ([x] if saved == "in" else [out] if saved == "out" else [])
    same(run(f"{op}_bwd", operands, attrs=bwd_attrs(attrs, x)).out, ref[0])


def _heads(t, b, s, h, d):
    return t.view(b, s, h, d).transpose(1, 2)  # strided, as a model's q/k/v are


@pytest.mark.parametrize("causal,scale", [(False, None), (True, None), (True, 0.3)])
def test_sdpa(causal, scale):
    b, t, h, d = 2, 7, 3, 4
    qkv = [torch.randn(b, t, h * d) for _ in range(3)]

    def f(q, k, v):
        return F.scaled_dot_product_attention(*(_heads(a, b, t, h, d) for a in (q, k, v)), is_causal=causal,
                                              scale=scale)

    attrs = {"is_causal": causal, "scale": scale}
    q, k, v = (_heads(a, b, t, h, d) for a in qkv)
    res = run("sdpa", [q, k, v], attrs=attrs)
    same(res.out, f(*qkv))
    same(run("sdpa", [q, k, v], attrs=attrs).out, res.out)  # deterministic: a recompute is exact
    gy = torch.randn_like(res.out)
    _, ref = grads_of(f, qkv, gy)
    g = run("sdpa_bwd", [gy, q, k, v, res.out], attrs=bwd_attrs(attrs, q), ctx=KernelContext(aux=res.aux))
    assert isinstance(g.out, tuple) and len(g.out) == 3
    for got, want in zip(g.out, ref, strict=True):
        same(got.transpose(1, 2).reshape(b, t, h * d), want)


@pytest.mark.parametrize("sa,sb,transpose_b", [((5, 4), (4, 3), False), ((2, 5, 4), (2, 4, 3), False),
                                               ((2, 3, 5, 4), (2, 3, 5, 4), True)])
def test_matmul(sa, sb, transpose_b):
    a, b = torch.randn(*sa), torch.randn(*sb)
    f = (lambda a, b: a @ b.transpose(-1, -2)) if transpose_b else (lambda a, b: a @ b)
    bb = b.transpose(-1, -2) if transpose_b else b
    out = run("matmul", [a, bb]).out
    same(out, f(a, b))
    gy = torch.randn_like(out)
    _, ref = grads_of(f, [a, b], gy)
    ga, gb = run("matmul_bwd", [gy, a, bb]).out
    same(ga, ref[0])
    same(gb.transpose(-1, -2) if transpose_b else gb, ref[1])


@pytest.mark.parametrize("index,f", [([["all"], ["int", 0]], lambda x: x[:, 0]),
                                     ([["all"], ["range", 2, 5]], lambda x: x[:, 2:5]),
                                     ([["range", 1, 3], ["int", 6]], lambda x: x[1:, -1])])
def test_slice(index, f):
    x = torch.randn(3, 7, 4)
    out = run("slice", [x], attrs={"index": index}).out
    same(out, f(x))
    assert out.is_contiguous()
    gy = torch.randn_like(out)
    _, ref = grads_of(f, [x], gy)
    same(run("slice_bwd", [gy], attrs=bwd_attrs({"index": index}, x)).out, ref[0])


def test_expand_then_add_is_a_broadcast_add():
    tok, pos = torch.randn(3, 5, 4), torch.randn(5, 4)
    e = run("expand", [pos], attrs={"shape": [3, 5, 4]}).out
    same(run("add", [tok, e]).out, tok + pos)
    gy = torch.randn(3, 5, 4)
    _, ref = grads_of(lambda t, p: t + p, [tok, pos], gy)
    same(run("expand_bwd", [gy], attrs=bwd_attrs({"shape": [3, 5, 4]}, pos)).out, ref[1])


def test_copy_of_a_permuted_view():
    x = torch.randn(2, 6, 8)  # (B, T, C) seen as heads (B, H, T, d), made contiguous, merged back
    view = [["reshape", [2, 6, 2, 4]], ["permute", [0, 2, 1, 3]], ["reshape", [2, 2, 24]]]
    f = lambda x: x.view(2, 6, 2, 4).permute(0, 2, 1, 3).reshape(2, 2, 24)  # noqa: E731
    attrs = {"view": view, "grad_view": [["reshape", [2, 2, 6, 4]], ["permute", [0, 2, 1, 3]], ["reshape", [2, 6, 8]]]}
    out = run("copy", [x], attrs=attrs).out
    same(out, f(x))
    gy = torch.randn_like(out)
    _, ref = grads_of(f, [x], gy)
    g = run("copy_bwd", [gy], attrs=bwd_attrs(attrs, x)).out
    same(g, ref[0])
    assert g.is_contiguous()


@pytest.mark.parametrize("bias", [True, False])
def test_linear_on_3d_input(bias):
    x, w = torch.randn(3, 5, 8), torch.randn(6, 8)
    params = [w] + ([torch.randn(6)] if bias else [])
    f = lambda x, w, b=None: F.linear(x, w, b)  # noqa: E731
    out = run("linear", [x], params, {"bias": bias}).out
    same(out, f(x, *params))
    gy = torch.randn_like(out)
    _, ref = grads_of(f, [x, *params], gy)
    res = run("linear_bwd", [gy, x], params, bwd_attrs({"bias": bias}, x))
    same(res.out, ref[0])
    for a, b in zip(res.grads, ref[1:], strict=True):
        same(a, b)


def test_every_transformer_kernel_is_registered():
    from edgetrain.compiler.graph.ops import TRANSFORMER_RULES

    names = {r.name for r in TRANSFORMER_RULES} | {r.backward for r in TRANSFORMER_RULES if r.backward}
    assert names <= set(KERNELS), sorted(names - set(KERNELS))
