"""The C runtime's kernels for MCU CNNs beyond the basic set - batch norm, sigmoid, hardsigmoid, hardswish,
SiLU, leaky ReLU, GELU, layer norm, multiply (incl. squeeze-excitation's channel broadcast) and mean over
H x W - held against the very ATen ops of torch's AOTAutograd joint graph (`torch.ops.aten.<op>`), which is
what the code generator lowers to them.

The library, the buffers and the comparison are those of tests/test_c_kernels.py (imported, one build per
module); its compile tests and the host-vs-QEMU selftest cover these sources too. `pytest -s` prints the
error table.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from test_c_kernels import (  # noqa: F401 - lib_path, lib, _error_table are fixtures
    ERRORS, SgdParams, _error_table, empty, f32, fp, lib, lib_path, record)

A = torch.ops.aten
T = torch.from_numpy


def _t(a):
    return None if a is None else T(a.copy())


# -- batch norm ---------------------------------------------------------------------------------------

# n, c, h, w, affine; torch's contiguous kernel for h*w > 1 (double accumulators: bit-identical), its
# channels-last kernel for h*w == 1 (float partial sums: agreement to rounding)
BN_CASES = [(1, 3, 4, 5, True), (4, 8, 7, 7, True), (2, 16, 14, 14, True), (3, 5, 9, 11, False),
            (2, 4, 16, 16, True), (8, 4, 1, 1, True), (16, 6, 1, 1, False)]


def _bn_inputs(rng, n, c, h, w, affine):
    # Per-channel offsets and scales: the mean is far from 0 in some channels, as after a conv.
    x = f32(rng.standard_normal((n, c, h, w)) * rng.uniform(0.5, 3, (1, c, 1, 1)) + rng.uniform(-2, 2, (1, c, 1, 1)))
    wt = f32(rng.uniform(0.5, 1.5, c)) if affine else None
    b = f32(rng.uniform(-0.5, 0.5, c)) if affine else None
    rm, rv = f32(rng.standard_normal(c) * 0.1), f32(rng.uniform(0.5, 2.0, c))
    return x, wt, b, rm, rv


@pytest.mark.parametrize("case", BN_CASES, ids=str)
@pytest.mark.parametrize("momentum", [0.1, 0.01])
def test_batch_norm_forward_and_running_stats_match_aten(lib, case, momentum):
    n, c, h, w, affine = case
    rng = np.random.default_rng(n * 100 + c * 10 + h)
    x, wt, b, rm, rv = _bn_inputs(rng, n, c, h, w, affine)
    eps = 1e-5
    out, save_mean, save_rstd, new_rm, new_rv = A._native_batch_norm_legit_functional(
        _t(x), _t(wt), _t(b), _t(rm), _t(rv), True, momentum, eps)
    y, mean, invstd, var_sum = empty(n, c, h, w), empty(c), empty(c), empty(c)
    lib.et_batch_norm_forward(n, c, h * w, fp(x), fp(wt), fp(b), eps, fp(y), fp(mean), fp(invstd), fp(var_sum))
    exact = h * w > 1
    tag = "" if exact else " [hw 1]"
    record("batch_norm_forward out" + tag, y, out, exact=exact)
    record("batch_norm_forward save_mean" + tag, mean, save_mean, exact=exact)
    record("batch_norm_forward save_invstd" + tag, invstd, save_rstd, exact=exact)
    lib.et_batch_norm_update_running_stats(c, n * h * w, momentum, fp(mean), fp(var_sum), fp(rm), fp(rv))
    record("batch_norm_update_running_stats mean" + tag, rm, new_rm, exact=exact)
    record("batch_norm_update_running_stats var" + tag, rv, new_rv, exact=exact)
    # A recompute without var_sum gives the same forward values.
    y2, mean2, invstd2 = empty(n, c, h, w), empty(c), empty(c)
    lib.et_batch_norm_forward(n, c, h * w, fp(x), fp(wt), fp(b), eps, fp(y2), fp(mean2), fp(invstd2), None)
    assert np.array_equal(y2, y) and np.array_equal(mean2, mean) and np.array_equal(invstd2, invstd)


def test_batch_norm_is_the_module_in_train_mode(lib):
    """nn.BatchNorm2d.train() over three steps: outputs and running statistics (the update in place)."""
    rng = np.random.default_rng(21)
    bn = torch.nn.BatchNorm2d(5, momentum=0.2)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    wt, b = f32(bn.weight), f32(bn.bias)
    rm, rv = f32(bn.running_mean), f32(bn.running_var)
    for _ in range(3):
        x = f32(rng.standard_normal((2, 5, 6, 6)) * 2 + 1)
        ref = bn(T(x.copy()))
        y, mean, invstd, vs = empty(2, 5, 6, 6), empty(5), empty(5), empty(5)
        lib.et_batch_norm_forward(2, 5, 36, fp(x), fp(wt), fp(b), bn.eps, fp(y), fp(mean), fp(invstd), fp(vs))
        lib.et_batch_norm_update_running_stats(5, 72, bn.momentum, fp(mean), fp(vs), fp(rm), fp(rv))
        record("batch_norm_forward out", y, ref, exact=True)
    record("batch_norm_update_running_stats mean", rm, bn.running_mean, exact=True)
    record("batch_norm_update_running_stats var", rv, bn.running_var, exact=True)


def _bn_backward_ref(x, wt, rm, rv, gy, eps=1e-5, mask=(True, True, True)):
    _, save_mean, save_rstd = A.native_batch_norm(_t(x), _t(wt), None, _t(rm), _t(rv), True, 0.1, eps)
    gx, gw, gb = A.native_batch_norm_backward(_t(gy), _t(x), _t(wt), _t(rm), _t(rv), save_mean, save_rstd, True,
                                              eps, list(mask))
    return f32(save_mean), f32(save_rstd), gx, gw, gb


@pytest.mark.parametrize("case", BN_CASES, ids=str)
def test_batch_norm_backward_matches_aten(lib, case):
    n, c, h, w, affine = case
    rng = np.random.default_rng(7 + n * 100 + c * 10 + h)
    x, wt, _, rm, rv = _bn_inputs(rng, n, c, h, w, affine)
    gy = f32(rng.standard_normal((n, c, h, w)))
    save_mean, save_rstd, ref_gx, ref_gw, ref_gb = _bn_backward_ref(x, wt, rm, rv, gy)
    gx, gw, gb = empty(n, c, h, w), empty(c), empty(c)
    lib.et_batch_norm_backward(n, c, h * w, fp(gy), fp(x), fp(wt), fp(save_mean), fp(save_rstd), fp(gx), fp(gw), fp(gb))
    # The sums' size without cancellation: root-sum-square of their terms (per channel).
    xc = (x.astype(np.float64) - save_mean.reshape(1, c, 1, 1)) * gy
    rss_dotp = np.sqrt((xc ** 2).sum((0, 2, 3)))
    rss_sum = np.sqrt((gy.astype(np.float64) ** 2).sum((0, 2, 3)))
    record("batch_norm_backward grad_weight", gw, ref_gw, scale=rss_dotp * save_rstd)
    record("batch_norm_backward grad_bias", gb, ref_gb, scale=rss_sum)
    # gx's per-channel terms k and grad_mean carry those sums' rounding, times invstd * w.
    wv = np.ones(c) if wt is None else wt.astype(np.float64)
    count = n * h * w
    sx = (np.abs(x - save_mean.reshape(1, c, 1, 1)) * (rss_dotp * save_rstd ** 3 * wv / count).reshape(1, c, 1, 1)
          + (rss_sum * save_rstd * wv / count).reshape(1, c, 1, 1))
    record("batch_norm_backward grad_input", gx, ref_gx, scale=sx)

    # Frozen affine parameters: grad_input alone, the same values.
    gx_only = empty(n, c, h, w)
    lib.et_batch_norm_backward(n, c, h * w, fp(gy), fp(x), fp(wt), fp(save_mean), fp(save_rstd), fp(gx_only),
                               None, None)
    assert np.array_equal(gx_only, gx)


def test_batch_norm_backward_is_bitwise_on_exact_sums(lib):
    """Dyadic data and a power-of-two count: every sum is exact in any order, so what remains - k,
    grad_mean and the per-element formula - must give torch's bits."""
    rng = np.random.default_rng(22)
    n, c, h, w = 2, 6, 4, 4
    x = f32(rng.integers(-8, 9, (n, c, h, w)) / 4)
    gy = f32(rng.integers(-8, 9, (n, c, h, w)) / 8)
    wt = f32(rng.integers(2, 9, c) / 4)
    rm, rv = np.zeros(c, np.float32), np.ones(c, np.float32)
    save_mean, save_rstd, ref_gx, ref_gw, ref_gb = _bn_backward_ref(x, wt, rm, rv, gy)
    gx, gw, gb = empty(n, c, h, w), empty(c), empty(c)
    lib.et_batch_norm_backward(n, c, h * w, fp(gy), fp(x), fp(wt), fp(save_mean), fp(save_rstd), fp(gx), fp(gw), fp(gb))
    record("batch_norm_backward grad_input (exact sums)", gx, ref_gx, exact=True)
    record("batch_norm_backward grad_weight (exact sums)", gw, ref_gw, exact=True)
    record("batch_norm_backward grad_bias (exact sums)", gb, ref_gb, exact=True)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_batch_norm_backward_sgd_equals_backward_then_sgd(lib, momentum):
    rng = np.random.default_rng(23)
    n, c, h, w = 3, 7, 5, 6
    x, wt, b, rm, rv = _bn_inputs(rng, n, c, h, w, True)
    gy = f32(rng.standard_normal((n, c, h, w)))
    y, mean, invstd = empty(n, c, h, w), empty(c), empty(c)
    lib.et_batch_norm_forward(n, c, h * w, fp(x), fp(wt), fp(b), 1e-5, fp(y), fp(mean), fp(invstd), None)
    gx, gw, gb = empty(n, c, h, w), empty(c), empty(c)
    lib.et_batch_norm_backward(n, c, h * w, fp(gy), fp(x), fp(wt), fp(mean), fp(invstd), fp(gx), fp(gw), fp(gb))
    opt = SgdParams(0.05, momentum, 1e-3)
    w_sep, b_sep, w_fused, b_fused = wt.copy(), b.copy(), wt.copy(), b.copy()
    bufs = [f32(rng.standard_normal(c) * 0.1) for _ in range(2)] if momentum else [None, None]
    wbuf_sep, bbuf_sep = [None if t is None else t.copy() for t in bufs]
    wbuf_fused, bbuf_fused = [None if t is None else t.copy() for t in bufs]
    lib.et_sgd_step(opt, c, fp(w_sep), fp(gw), fp(wbuf_sep))
    lib.et_sgd_step(opt, c, fp(b_sep), fp(gb), fp(bbuf_sep))
    gx_fused = empty(n, c, h, w)
    lib.et_batch_norm_backward_sgd(n, c, h * w, fp(gy), fp(x), fp(mean), fp(invstd), opt, fp(gx_fused),
                                   fp(w_fused), fp(wbuf_fused), fp(b_fused), fp(bbuf_fused))
    assert np.array_equal(gx_fused, gx), "the fused input gradient must use the weights before the update"
    for got, want in ((w_fused, w_sep), (b_fused, b_sep), (wbuf_fused, wbuf_sep), (bbuf_fused, bbuf_sep)):
        if got is not None:
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    # Without the input gradient (the first layer's BN: no one needs gx) the update is the same.
    w2, b2 = wt.copy(), b.copy()
    wbuf2, bbuf2 = [None if t is None else t.copy() for t in bufs]
    lib.et_batch_norm_backward_sgd(n, c, h * w, fp(gy), fp(x), fp(mean), fp(invstd), opt, None,
                                   fp(w2), fp(wbuf2), fp(b2), fp(bbuf2))
    assert np.array_equal(w2, w_fused) and np.array_equal(b2, b_fused)


# -- layer norm ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,normalized", [((4, 64), 1), ((2, 8, 5, 5), 3), ((3, 7, 33), 1), ((1, 16, 4, 4), 3),
                                              ((5, 768), 1)])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_matches_aten(lib, shape, normalized, affine):
    rng = np.random.default_rng(sum(shape) + normalized)
    norm_shape = list(shape[-normalized:])
    cols = int(np.prod(norm_shape))
    rows = int(np.prod(shape)) // cols
    x = f32(rng.standard_normal(shape) * 2 + rng.uniform(-3, 3))
    wt = f32(rng.uniform(0.5, 1.5, norm_shape)) if affine else None
    b = f32(rng.uniform(-0.5, 0.5, norm_shape)) if affine else None
    out, mean, rstd = A.native_layer_norm(_t(x), norm_shape, _t(wt), _t(b), 1e-5)
    y, m, r = empty(*shape), empty(rows), empty(rows)
    lib.et_layer_norm_forward(rows, cols, fp(x), fp(wt), fp(b), 1e-5, fp(y), fp(m), fp(r))
    record("layer_norm_forward out", y, out)
    record("layer_norm_forward mean", m, mean, scale=np.sqrt((x.reshape(rows, cols).astype(np.float64) ** 2).sum(1)) / cols)
    record("layer_norm_forward rstd", r, rstd)
    gy = f32(rng.standard_normal(shape))
    ref_gx, ref_gw, ref_gb = A.native_layer_norm_backward(_t(gy), _t(x), norm_shape, mean, rstd, _t(wt), _t(b),
                                                          [True, affine, affine])
    gx = empty(*shape)
    gw, gb = (empty(*norm_shape), empty(*norm_shape)) if affine else (None, None)
    lib.et_layer_norm_backward(rows, cols, fp(gy), fp(x), fp(f32(mean)), fp(f32(rstd)), fp(wt), fp(gx), fp(gw),
                               fp(gb))
    # gx's per-row sums ds, db: their rounding reaches every element through b_ * x + c_ (sum scale / cols).
    g2 = gy.reshape(rows, cols).astype(np.float64) * (1.0 if wt is None else wt.reshape(1, cols))
    xr = x.reshape(rows, cols).astype(np.float64)
    rs = f32(rstd).reshape(rows, 1).astype(np.float64)
    sx = (np.sqrt(((g2 * xr) ** 2).sum(1, keepdims=True)) + np.abs(xr.mean(1, keepdims=True)) * np.sqrt((g2 ** 2).sum(
        1, keepdims=True))) * rs ** 3 * (np.abs(xr) + np.abs(xr.mean(1, keepdims=True))) / cols
    record("layer_norm_backward grad_input", gx, ref_gx, scale=sx.reshape(shape))
    if affine:
        gr = gy.reshape(rows, cols).astype(np.float64)
        record("layer_norm_backward grad_weight", gw, ref_gw,
               scale=np.sqrt(((gr * (xr - xr.mean(1, keepdims=True)) * rs) ** 2).sum(0)).reshape(norm_shape))
        record("layer_norm_backward grad_bias", gb, ref_gb, scale=np.sqrt((gr ** 2).sum(0)).reshape(norm_shape))


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_layer_norm_backward_sgd_equals_backward_then_sgd(lib, momentum):
    """The fused update (the C runtime keeps no gradient buffer) is bit-identical to the backward, then SGD;
    its input gradient reads the weights before the update. NULL statistics in the forward change nothing."""
    rng = np.random.default_rng(29)
    rows, cols = 12, 8
    x, gy = f32(rng.standard_normal((rows, cols)) * 2 + 1), f32(rng.standard_normal((rows, cols)))
    wt, b = f32(rng.uniform(0.5, 1.5, cols)), f32(rng.uniform(-0.5, 0.5, cols))
    y, y2, mean, rstd = empty(rows, cols), empty(rows, cols), empty(rows), empty(rows)
    lib.et_layer_norm_forward(rows, cols, fp(x), fp(wt), fp(b), 1e-5, fp(y), fp(mean), fp(rstd))
    lib.et_layer_norm_forward(rows, cols, fp(x), fp(wt), fp(b), 1e-5, fp(y2), None, None)
    assert np.array_equal(y, y2)
    gx, gw, gb = empty(rows, cols), empty(cols), empty(cols)
    lib.et_layer_norm_backward(rows, cols, fp(gy), fp(x), fp(mean), fp(rstd), fp(wt), fp(gx), fp(gw), fp(gb))
    opt = SgdParams(0.05, momentum, 1e-3)
    bufs = [f32(rng.standard_normal(cols) * 0.1) for _ in range(2)] if momentum else [None, None]
    w_sep, b_sep = wt.copy(), b.copy()
    wbuf_sep, bbuf_sep = [None if t is None else t.copy() for t in bufs]
    lib.et_sgd_step(opt, cols, fp(w_sep), fp(gw), fp(wbuf_sep))
    lib.et_sgd_step(opt, cols, fp(b_sep), fp(gb), fp(bbuf_sep))
    for with_gx in (True, False):
        w_f, b_f = wt.copy(), b.copy()
        wbuf_f, bbuf_f = [None if t is None else t.copy() for t in bufs]
        gx_f = empty(rows, cols)
        lib.et_layer_norm_backward_sgd(rows, cols, fp(gy), fp(x), fp(mean), fp(rstd), opt,
                                       fp(gx_f) if with_gx else None, fp(w_f), fp(wbuf_f), fp(b_f), fp(bbuf_f))
        if with_gx:
            assert np.array_equal(gx_f, gx), "the fused input gradient must use the weights before the update"
        for got, want in ((w_f, w_sep), (b_f, b_sep), (wbuf_f, wbuf_sep), (bbuf_f, bbuf_sep)):
            if got is not None:
                assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


# -- element-wise activations -------------------------------------------------------------------------

def _act_input(rng, n=2003):
    """Normal * 4 (an odd size: torch's vector loop and its scalar tail) with the boundaries and edge
    values of every activation here: +-3 (hard*), 0 and -0, one ulp either side of +-3, large values
    (exp overflow and underflow)."""
    x = rng.standard_normal(n) * 4
    edge = np.array([-3.0, 3.0, 0.0, -0.0, np.nextafter(np.float32(3), np.float32(4)),
                     np.nextafter(np.float32(3), np.float32(0)), np.nextafter(np.float32(-3), np.float32(-4)),
                     np.nextafter(np.float32(-3), np.float32(0)), -100.0, 100.0, -88.0, 89.0, 1e-30, -1e-30,
                     6.0, -6.0, 20.0, -20.0], np.float32)
    x[:edge.size] = edge
    x[-edge.size:] = edge  # also in the scalar tail
    x[100:300:7] = 3.0
    x[101:300:7] = -3.0
    return f32(x)


ACTIVATIONS = {  # name: (aten forward, aten backward, does the backward read the output?, bitwise?)
    "sigmoid": (A.sigmoid, lambda g, x, y: A.sigmoid_backward(g, y), True, False),
    "hardsigmoid": (A.hardsigmoid, lambda g, x, y: A.hardsigmoid_backward(g, x), False, True),
    "hardswish": (A.hardswish, lambda g, x, y: A.hardswish_backward(g, x), False, True),
    "silu": (A.silu, lambda g, x, y: A.silu_backward(g, x), False, False),
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activations_match_aten(lib, name):
    fwd_ref, bwd_ref, reads_output, bitwise = ACTIVATIONS[name]
    rng = np.random.default_rng(31)
    x, gy = _act_input(rng), f32(rng.standard_normal(2003))
    fwd, bwd = getattr(lib, f"et_{name}_forward"), getattr(lib, f"et_{name}_backward")
    y = empty(x.size)
    fwd(x.size, fp(x), fp(y))
    ref_y = fwd_ref(T(x))
    record(f"{name}_forward", y, ref_y, exact=bitwise)
    gx = empty(x.size)
    bwd(x.size, fp(gy), fp(y if reads_output else x), fp(gx))
    record(f"{name}_backward", gx, bwd_ref(T(gy), T(x), T(y)), exact=bitwise)
    if reads_output:  # given torch's own output, the backward formula is torch's bit for bit
        yt = f32(ref_y)
        bwd(x.size, fp(gy), fp(yt), fp(gx))
        record(f"{name}_backward (torch's y)", gx, bwd_ref(T(gy), T(x), T(yt)), exact=True)
    inplace = x.copy()
    fwd(x.size, fp(inplace), fp(inplace))
    assert np.array_equal(inplace, y, equal_nan=True)


def test_hard_activations_at_their_boundaries(lib):
    """Exactly -3 and +3 (and the neighbours): torch's hardswish_backward gives 0 at -3 and gy at +3,
    hardsigmoid_backward 0 at both. Checked against the aten op, and against those values themselves."""
    x = np.array([-3.0, 3.0, np.nextafter(np.float32(-3), 0), np.nextafter(np.float32(3), 0), -4, 4], np.float32)
    gy = np.full(x.size, 2.0, np.float32)
    gx = empty(x.size)
    lib.et_hardswish_backward(x.size, fp(gy), fp(x), fp(gx))
    record("hardswish_backward", gx, A.hardswish_backward(T(gy), T(x)), exact=True)
    assert gx[0] == 0.0 and gx[1] == 2.0 and gx[4] == 0.0 and gx[5] == 2.0
    lib.et_hardsigmoid_backward(x.size, fp(gy), fp(x), fp(gx))
    record("hardsigmoid_backward", gx, A.hardsigmoid_backward(T(gy), T(x)), exact=True)
    assert gx[0] == 0.0 and gx[1] == 0.0 and gx[2] == gx[3] == np.float32(2.0) * np.float32(1 / 6)


def test_tanh_and_erf_are_accurate(lib):
    """et_tanhf and et_erff (GELU's) against float64 numpy/math, in ulps of the float32 result."""
    rng = np.random.default_rng(34)
    xs = np.concatenate([rng.uniform(-10, 10, 4000), rng.uniform(-1, 1, 4000), rng.uniform(-0.3, 0.3, 2000),
                         [0.0, 0.25, -0.25, 0.5, -0.5, 4.0, -4.0, 9.0, 1e-20, 3.99]]).astype(np.float32)
    for name, ref_fn in (("et_tanhf", math.tanh), ("et_erff", math.erf)):
        fn = getattr(lib, name)
        got = np.array([fn(float(v)) for v in xs], np.float32)
        ref = np.array([ref_fn(float(v)) for v in xs])
        ulp = np.spacing(np.abs(ref.astype(np.float32))).astype(np.float64)
        err = float((np.abs(got - ref) / ulp).max())
        ERRORS[f"{name} (max abs = ulps vs exact)"] = {"max_abs": err, "max_rel": 0.0, "worst_tol_ratio": 0.0,
                                                       "exact": False}
        assert err < (3.0 if name == "et_tanhf" else 8.0), (name, err)
        assert np.isnan(fn(float("nan")))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_matches_aten(lib, approximate):
    rng = np.random.default_rng(35)
    x, gy = _act_input(rng), f32(rng.standard_normal(2003))
    tanh = int(approximate == "tanh")
    y, gx = empty(x.size), empty(x.size)
    lib.et_gelu_forward(x.size, fp(x), tanh, fp(y))
    record(f"gelu_forward ({approximate})", y, A.gelu(T(x), approximate=approximate))
    if not tanh:  # torch's vectorized erf is itself ~1e-6 off near x = -3.5; the exact value, in float64:
        xd = x.astype(np.float64)
        exact = xd * 0.5 * (1 + np.array([math.erf(v / math.sqrt(2)) for v in xd]))
        record("gelu_forward (none) vs float64 exact", y, exact)
    lib.et_gelu_backward(x.size, fp(gy), fp(x), tanh, fp(gx))
    scale = None
    if tanh:  # torch's 1 - t*t multiplies an ulp of t ~ 1 by |dgx/dt| (~10 near |x| = 5): as a sum's terms
        xd = x.astype(np.float64)
        t = np.tanh(np.sqrt(2 / np.pi) * (xd + 0.044715 * xd ** 3))
        scale = np.abs(gy * xd * t * np.sqrt(2 / np.pi) * (1 + 3 * 0.044715 * xd ** 2))
    record(f"gelu_backward ({approximate})", gx, A.gelu_backward(T(gy), T(x), approximate=approximate),
           scale=scale)


@pytest.mark.parametrize("slope", [0.01, 0.2, 0.0, 1.5, -0.1])
def test_leaky_relu_matches_aten_bitwise(lib, slope):
    rng = np.random.default_rng(32)
    x, gy = _act_input(rng), f32(rng.standard_normal(2003))
    y, gx = empty(x.size), empty(x.size)
    lib.et_leaky_relu_forward(x.size, fp(x), slope, fp(y))
    record("leaky_relu_forward", y, A.leaky_relu(T(x), slope), exact=True)
    lib.et_leaky_relu_backward(x.size, fp(gy), fp(x), slope, fp(gx))
    record("leaky_relu_backward", gx, A.leaky_relu_backward(T(gy), T(x), slope, False), exact=True)
    if slope >= 0:  # self_is_result (in-place leaky_relu_): the output read in place of the input
        lib.et_leaky_relu_backward(x.size, fp(gy), fp(y), slope, fp(gx))
        record("leaky_relu_backward", gx, A.leaky_relu_backward(T(gy), T(y), slope, True), exact=True)


# -- multiply -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("n,c,h,w", [(1, 16, 7, 7), (2, 8, 14, 14), (3, 5, 1, 1), (1, 32, 28, 28), (2, 3, 5, 3)])
def test_mul_broadcast_and_its_joint_graph_backward(lib, n, c, h, w):
    rng = np.random.default_rng(n * 1000 + c + h)
    x, s = f32(rng.standard_normal((n, c, h, w))), f32(rng.uniform(0, 1, (n, c, 1, 1)))
    gy = f32(rng.standard_normal((n, c, h, w)))
    y = empty(n, c, h, w)
    lib.et_mul_bcast_forward(n * c, h * w, fp(x), fp(s), fp(y))
    record("mul_bcast_forward", y, A.mul.Tensor(T(x), T(s)), exact=True)
    record("mul_bcast_forward", y, A.mul.Tensor(T(s), T(x)), exact=True)  # either argument order
    # The joint graph's backward of y = x * s: grad_x = mul(gy, s); grad_s = sum(mul(gy, x), [2, 3], keepdim).
    gx = empty(n, c, h, w)
    lib.et_mul_bcast_forward(n * c, h * w, fp(gy), fp(s), fp(gx))
    record("mul_bcast_forward (grad_x)", gx, A.mul.Tensor(T(gy), T(s)), exact=True)
    gs = empty(n, c, 1, 1)
    lib.et_mul_bcast_backward_scale(n * c, h * w, fp(gy), fp(x), fp(gs))
    ref_gs = A.sum.dim_IntList(A.mul.Tensor(T(gy), T(x)), [2, 3], True)
    rss = np.sqrt(((gy.astype(np.float64) * x) ** 2).sum((2, 3)))
    record("mul_bcast_backward_scale", gs, ref_gs, scale=rss)
    # ... which is autograd's gradient of x * s.
    xt, st = T(x.copy()).requires_grad_(True), T(s.copy()).requires_grad_(True)
    agx, ags = torch.autograd.grad(xt * st, [xt, st], T(gy))
    assert np.array_equal(gx, agx.numpy())
    record("mul_bcast_backward_scale", gs, ags, scale=rss)


def test_mul_same_shape_is_bitwise(lib):
    rng = np.random.default_rng(33)
    a, b = f32(rng.standard_normal(999)), f32(rng.standard_normal(999) * 3)
    y = empty(999)
    lib.et_mul_forward(999, fp(a), fp(b), fp(y))
    record("mul_forward", y, A.mul.Tensor(T(a), T(b)), exact=True)
    lib.et_mul_forward(999, fp(a), fp(b), fp(a))  # in place
    assert np.array_equal(a, y)


# -- mean over H x W ----------------------------------------------------------------------------------

@pytest.mark.parametrize("n,c,h,w", [(1, 8, 7, 7), (2, 16, 14, 14), (3, 5, 2, 3), (2, 4, 1, 1), (1, 3, 4, 4)])
@pytest.mark.parametrize("dims", [[-1, -2], [2, 3]])
@pytest.mark.parametrize("keepdim", [True, False])
def test_mean_hw_is_global_avgpool(lib, n, c, h, w, dims, keepdim):
    """aten.mean.dim(x, [-1, -2] or [2, 3], keepdim) -> et_global_avgpool_forward; its joint-graph backward
    div.Scalar(expand(gy), h*w) -> et_global_avgpool_backward, bitwise (both divide)."""
    rng = np.random.default_rng(n * 100 + c + h * w)
    x = f32(rng.standard_normal((n, c, h, w)) + 0.5)
    ref = A.mean.dim(T(x), dims, keepdim)
    assert tuple(ref.shape) == ((n, c, 1, 1) if keepdim else (n, c))
    y = empty(*ref.shape)
    lib.et_global_avgpool_forward(n, c, h * w, fp(x), fp(y))
    # torch's sum kernel adds in a vectorized, multi-accumulator order even for short rows (the C loop is
    # sequential), then divides by h*w as the C loop does: agreement to float32 rounding of the sum.
    record("mean.dim [h, w]", y, ref, exact=h * w == 1,
           scale=np.sqrt((x.astype(np.float64) ** 2).sum((2, 3))) / (h * w))
    gy = f32(rng.standard_normal(ref.shape))
    g = T(gy) if keepdim else A.unsqueeze(A.unsqueeze(T(gy), -1), -1)  # keepdim=False: unsqueezed first
    ref_gx = A.div.Scalar(A.expand(g, [n, c, h, w]), h * w)
    gx = empty(n, c, h, w)
    lib.et_global_avgpool_backward(n, c, h * w, fp(gy), fp(gx))
    record("mean.dim backward (div.Scalar)", gx, ref_gx, exact=True)
    xt = T(x.copy()).requires_grad_(True)
    (agx,) = torch.autograd.grad(xt.mean(dims, keepdim=keepdim), [xt], T(gy))
    assert np.array_equal(gx, agx.numpy())

