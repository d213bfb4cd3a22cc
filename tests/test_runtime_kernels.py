"""Every runtime kernel against torch: forward vs the functional, backward vs torch.autograd.grad.

Kernels call the same aten ops as autograd, so most comparisons are bitwise (`torch.equal`).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from edgetrain.runtime.python import KERNELS, KernelContext, dropout_apply, dropout_mask, sgd_update

torch.manual_seed(0)


def run(op, inputs, params=(), attrs=None, ctx=None):
    ctx = ctx or KernelContext()
    inputs, params = [t.detach() for t in inputs], [p.detach() for p in params]
    res = KERNELS[op](ctx, inputs, params, dict(attrs or {}))
    if res.out is not None and res.out.numel():  # out must be fresh, never a view of an operand
        ptr = res.out.untyped_storage().data_ptr()
        assert all(t.untyped_storage().data_ptr() != ptr for t in inputs + params), op
    return res


def grads_of(f, inputs, gy, n_wrt=None):
    """torch.autograd.grad of f(*inputs) wrt its first n_wrt float inputs (all by default); gy: upstream
    gradient (None for a scalar loss)."""
    n_wrt = len(inputs) if n_wrt is None else n_wrt
    xs = [t.detach().clone().requires_grad_(t.is_floating_point() and i < n_wrt) for i, t in enumerate(inputs)]
    y = f(*xs)
    wrt = [x for x in xs if x.requires_grad]
    return y.detach(), torch.autograd.grad(y, wrt, gy)


def same(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    assert torch.equal(a, b), f"max abs diff {(a.double() - b.double()).abs().max().item()}"


def bwd_attrs(attrs, x, needs=True):
    return {**attrs, "input_shape": list(x.shape), "needs_input_grad": needs}


def test_kernel_table_covers_the_op_registry():
    ops = pytest.importorskip("edgetrain.compiler.graph.ops")
    names = {r.name for r in ops.OPS.values() if r.name not in ("input", "labels")}
    names |= {r.backward for r in ops.OPS.values() if r.backward} | {ops.GRAD_SUM}
    assert names <= set(KERNELS), sorted(names - set(KERNELS))


# -- conv2d -------------------------------------------------------------------------------------------
CONV = [  # N, Cin, H, W, Cout, k, stride, pad, dil, groups, bias
    (2, 3, 9, 9, 4, 3, 1, 1, 1, 1, True),
    (3, 4, 10, 7, 6, 3, 2, 0, 1, 2, False),
    (2, 6, 8, 8, 6, 3, 1, 1, 1, 6, True),  # depthwise
    (2, 4, 11, 11, 8, 5, 2, 2, 2, 4, False),  # depthwise multiplier 2, dilation
    (1, 5, 6, 6, 7, 1, 1, 0, 1, 1, True),
    (4, 3, 7, 9, 2, (3, 1), (2, 1), (1, 0), 1, 1, True),
]


@pytest.mark.parametrize("cfg", CONV)
def test_conv2d(cfg):
    n, cin, h, w, cout, k, s, p, d, g, bias = cfg
    kh, kw = (k, k) if isinstance(k, int) else k
    x = torch.randn(n, cin, h, w)
    params = [torch.randn(cout, cin // g, kh, kw)] + ([torch.randn(cout)] if bias else [])
    attrs = {"kernel_size": [kh, kw], "stride": s, "padding": p, "dilation": d, "groups": g, "bias": bias}
    f = lambda x, w, b=None: F.conv2d(x, w, b, s, p, d, g)
    out = run("conv2d", [x], params, attrs).out
    same(out, f(x, *params))
    gy = torch.randn_like(out)
    _, ref = grads_of(f, [x, *params], gy)
    res = run("conv2d_bwd", [gy, x], params, bwd_attrs(attrs, x))
    same(res.out, ref[0])
    for a, b in zip(res.grads, ref[1:], strict=True):
        same(a, b)
    only_w = run("conv2d_bwd", [gy, x], params, bwd_attrs(attrs, x, needs=False))
    assert only_w.out is None
    same(only_w.grads[0], ref[1])


# -- linear -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("n,din,dout", [(4, 5, 3), (7, 16, 10), (1, 3, 2), (32, 64, 17)])
def test_linear(n, din, dout, bias):
    x = torch.randn(n, din)
    params = [torch.randn(dout, din)] + ([torch.randn(dout)] if bias else [])
    attrs = {"bias": bias}
    out = run("linear", [x], params, attrs).out
    same(out, F.linear(x, *params))
    gy = torch.randn_like(out)
    _, ref = grads_of(F.linear, [x, *params], gy)
    res = run("linear_bwd", [gy, x], params, bwd_attrs(attrs, x))
    same(res.out, ref[0])
    for a, b in zip(res.grads, ref[1:], strict=True):
        same(a, b)
    assert run("linear_bwd", [gy, x], params, bwd_attrs(attrs, x, needs=False)).out is None


def test_linear_column_major_input():
    x = torch.randn(6, 5).t()  # 5x6, column-major: autograd takes another mm path for its gradient
    w, b = torch.randn(4, 6), torch.randn(4)
    gy = torch.randn(5, 4)
    _, ref = grads_of(lambda x, w, b: F.linear(x, w, b), [x, w, b], gy)
    res = run("linear_bwd", [gy, x], [w, b], bwd_attrs({"bias": True}, x))
    same(res.out, ref[0])
    same(res.grads[0], ref[1])


# -- activations --------------------------------------------------------------------------------------
@pytest.mark.parametrize("op,f", [("relu", F.relu), ("relu6", F.relu6)])
def test_activations(op, f):
    x = torch.randn(3, 4, 5, 5) * 5
    x.view(-1)[:6] = torch.tensor([0.0, -0.0, 6.0, 6.0000005, -1e-30, 5.9999995])
    y = run(op, [x]).out
    same(y, f(x))
    gy = torch.randn_like(y)
    _, (ref,) = grads_of(f, [x], gy)
    same(run(op + "_bwd", [gy, y], attrs=bwd_attrs({}, x)).out, ref)


# -- batch norm ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("momentum", [0.1, 0.3, None])
def test_batch_norm_running_stats_and_recompute(momentum):
    c = 5
    bn = nn.BatchNorm2d(c, eps=1e-3, momentum=momentum).train()
    with torch.no_grad():
        bn.weight.normal_(), bn.bias.normal_()
    bufs = [bn.running_mean.clone(), bn.running_var.clone(), bn.num_batches_tracked.clone()]
    params = [bn.weight.detach().clone(), bn.bias.detach().clone()]
    attrs = {"eps": 1e-3, "momentum": momentum}
    for step in range(3):
        x = torch.randn(4, c, 6, 7) * 3 + 1
        ref = bn(x).detach()
        res = run("batch_norm", [x], params, attrs, KernelContext(first=True, buffers=bufs, step=step))
        same(res.out, ref)
        for mine, theirs in zip(bufs, [bn.running_mean, bn.running_var, bn.num_batches_tracked]):
            same(mine, theirs)
        frozen = [b.clone() for b in bufs]
        again = run("batch_norm", [x], params, attrs, KernelContext(first=False, buffers=bufs, step=step))
        same(again.out, ref)
        for a, b in zip(again.aux, res.aux):
            same(a, b)
        for b, f in zip(bufs, frozen):
            same(b, f)


@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_backward(affine):
    c, eps = 4, 1e-5
    x = torch.randn(3, c, 5, 5) * 2 - 1
    params = [torch.randn(c), torch.randn(c)] if affine else []
    attrs = {"eps": eps, "momentum": 0.1}
    fwd = run("batch_norm", [x], params, attrs, KernelContext(buffers=[torch.zeros(c), torch.ones(c),
                                                                         torch.tensor(0)]))
    f = lambda x, w=None, b=None: F.batch_norm(x, None, None, w, b, True, 0.1, eps)
    gy = torch.randn_like(fwd.out)
    y_ref, ref = grads_of(f, [x, *params], gy)
    same(fwd.out, y_ref)
    res = run("batch_norm_bwd", [gy, x], params, bwd_attrs(attrs, x), KernelContext(aux=fwd.aux))
    same(res.out, ref[0])
    for a, b in zip(res.grads, ref[1:], strict=True):
        same(a, b)


# -- max pool -----------------------------------------------------------------------------------------
POOL = [  # shape, kernel, stride, padding, dilation, ceil_mode, constant input (ties everywhere)
    ((2, 3, 8, 8), 2, 2, 0, 1, False, False),
    ((2, 3, 8, 8), 2, 2, 0, 1, False, True),
    ((1, 4, 7, 9), 3, 2, 1, 1, True, False),
    ((1, 4, 7, 9), 3, 2, 1, 1, True, True),
    ((2, 2, 10, 10), 3, 1, 1, 2, False, True),
    ((3, 2, 5, 6), (2, 3), (1, 2), (1, 1), 1, True, False),
]


@pytest.mark.parametrize("shape,k,s,p,d,ceil,const", POOL)
def test_maxpool(shape, k, s, p, d, ceil, const):
    x = torch.full(shape, 0.5) if const else torch.randn(shape).round()  # rounding: ties in random data
    attrs = {"kernel_size": k, "stride": s, "padding": p, "dilation": d, "ceil_mode": ceil}
    ref_vals, ref_idx = F.max_pool2d(x, k, s, p, d, ceil_mode=ceil, return_indices=True)
    arg = run("maxpool_argmax", [x], attrs=attrs)
    same(arg.out, ref_idx)
    same(arg.scratch[0], ref_vals)
    vals = run("maxpool_gather", [x, arg.out]).out
    same(vals, F.max_pool2d(x, k, s, p, d, ceil_mode=ceil))
    gy = torch.randn_like(vals)
    _, (ref,) = grads_of(lambda x: F.max_pool2d(x, k, s, p, d, ceil_mode=ceil), [x], gy)
    same(run("maxpool_bwd", [gy, arg.out], attrs=bwd_attrs(attrs, x)).out, ref)


# -- average pools ------------------------------------------------------------------------------------
AVG = [  # shape, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override
    ((2, 3, 8, 8), 2, 2, 0, False, True, None),
    ((2, 3, 7, 7), 3, 2, 1, True, True, None),
    ((2, 3, 7, 7), 3, 2, 1, True, False, None),
    ((1, 2, 9, 6), (3, 2), (2, 1), (1, 0), False, False, None),
    ((1, 2, 6, 6), 3, 3, 1, False, True, 5),
]


@pytest.mark.parametrize("shape,k,s,p,ceil,cip,div", AVG)
def test_avg_pool2d(shape, k, s, p, ceil, cip, div):
    x = torch.randn(shape)
    attrs = {"kernel_size": k, "stride": s, "padding": p, "ceil_mode": ceil, "count_include_pad": cip,
             "divisor_override": div}
    f = lambda x: F.avg_pool2d(x, k, s, p, ceil, cip, div)
    y = run("avg_pool2d", [x], attrs=attrs).out
    same(y, f(x))
    gy = torch.randn_like(y)
    _, (ref,) = grads_of(f, [x], gy)
    same(run("avg_pool2d_bwd", [gy], attrs=bwd_attrs(attrs, x)).out, ref)


@pytest.mark.parametrize("shape,size", [((2, 3, 7, 7), (1, 1)), ((2, 3, 7, 7), (2, 3)), ((1, 4, 9, 5), (3, 3)),
                                        ((2, 2, 6, 6), (None, 2)), ((3, 8, 4, 4), 1)])
def test_adaptive_avg_pool2d(shape, size):
    x = torch.randn(shape)
    attrs = {"output_size": size}
    f = lambda x: F.adaptive_avg_pool2d(x, size)
    y = run("adaptive_avg_pool2d", [x], attrs=attrs).out
    same(y, f(x))
    gy = torch.randn_like(y)
    _, (ref,) = grads_of(f, [x], gy)
    same(run("adaptive_avg_pool2d_bwd", [gy], attrs=bwd_attrs(attrs, x)).out, ref)


# -- structure ----------------------------------------------------------------------------------------
def test_add_cat_grad_sum():
    a, b, c = torch.randn(3, 4, 5), torch.randn(3, 4, 5), torch.randn(3, 2, 5)
    same(run("add", [a, b]).out, a + b)
    same(run("cat", [a, c, b], attrs={"dim": 1}).out, torch.cat([a, c, b], 1))
    same(run("grad_sum", [a, b, a * 3]).out, (a + b) + a * 3)
    same(run("grad_sum", [a]).out, a)


# -- dropout ------------------------------------------------------------------------------------------
def test_dropout_mask_reproducible():
    m = dropout_mask((64, 100), 0.3, seed=7, step=2, seed_id=4, device="cpu")
    assert m.dtype == torch.bool
    same(m, dropout_mask((64, 100), 0.3, 7, 2, 4, "cpu"))
    for other in [(8, 2, 4), (7, 3, 4), (7, 2, 5)]:
        assert not torch.equal(m, dropout_mask((64, 100), 0.3, *other, "cpu"))
    assert abs(m.float().mean().item() - 0.7) < 0.03
    assert dropout_mask((10, 10), 0.0, 1, 1, 1, "cpu").all()


@pytest.mark.parametrize("p", [0.0, 0.2, 0.5])
def test_dropout_forward_recompute_backward(p):
    x = torch.randn(8, 3, 5, 5)
    attrs = {"p": p, "seed_id": 3}
    ctx = KernelContext(step=5, seed=11)
    mask = dropout_mask(x.shape, p, 11, 5, 3, "cpu")
    y = run("dropout", [x], attrs=attrs, ctx=ctx).out
    same(y, dropout_apply(x, mask, p))
    same(run("dropout", [x], attrs=attrs, ctx=KernelContext(first=False, step=5, seed=11)).out, y)
    gy = torch.randn_like(y)
    _, (ref,) = grads_of(lambda x: dropout_apply(x, mask, p), [x], gy)
    same(run("dropout_bwd", [gy], attrs=bwd_attrs(attrs, x), ctx=ctx).out, ref)


# -- losses -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n,c", [(4, 3), (16, 10), (1, 7)])
def test_cross_entropy(n, c):
    logits = torch.randn(n, c) * 3
    labels = torch.randint(0, c, (n,))
    if n > 1:
        labels[0] = -100  # F.cross_entropy's ignore_index
    loss = run("cross_entropy", [logits, labels]).out
    ref_loss, (ref,) = grads_of(lambda z, t: F.cross_entropy(z, t), [logits, labels], None)
    same(loss, ref_loss)
    same(run("cross_entropy_bwd", [logits, labels], attrs=bwd_attrs({}, logits)).out, ref)


def test_mse():
    pred, target = torch.randn(6, 4), torch.randn(6, 4)
    ref_loss, (ref,) = grads_of(lambda a, b: F.mse_loss(a, b), [pred, target], None, n_wrt=1)
    same(run("mse", [pred, target]).out, ref_loss)
    same(run("mse_bwd", [pred, target], attrs=bwd_attrs({}, pred)).out, ref)


# -- SGD ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("lr,momentum,wd", [(0.1, 0.9, 5e-4), (0.05, 0.0, 0.0), (0.01, 0.0, 1e-2), (0.3, 0.5, 0.0)])
def test_sgd_update_matches_torch(lr, momentum, wd):
    shapes = [(5, 3), (7,), (2, 3, 3, 3)]
    ref = [nn.Parameter(torch.randn(s)) for s in shapes]
    mine = [p.detach().clone() for p in ref]
    bufs = [torch.zeros_like(p) if momentum else None for p in mine]
    opt = torch.optim.SGD(ref, lr=lr, momentum=momentum, weight_decay=wd, foreach=False)
    for _ in range(3):
        grads = [torch.randn(s) for s in shapes]
        for p, g in zip(ref, grads):
            p.grad = g.clone()
        opt.step()
        for p, g, b in zip(mine, grads, bufs):
            sgd_update(p, g, b, lr, momentum, wd)
        for p, q, b in zip(mine, ref, bufs):
            same(p, q.detach())
            if momentum:
                same(b, opt.state[q]["momentum_buffer"])
