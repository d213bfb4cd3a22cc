"""The int8 kernels (runtime/c/kernels/q8_*) held bit for bit against the numpy integer reference
(runtime/python/int8_reference.py), and the reference against torch's float convolution.

The kernels are built with the host gcc twice: as they build on any host (the public functions fall back to the
plain loops), and with -DET_Q8_EMULATE_DSP, which builds the fast (SMLAD/SXTB16) variants with those instructions
written in C, so the fast kernels' data movement is checked on the host too. Both builds, and the plain `_ref`
functions, must equal the reference exactly on random shapes. With the ARM toolchain and QEMU, the selftest
harness runs the real DSP instructions on the emulated Cortex-M4F and its results must match again.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from ctypes import POINTER, c_int, c_int32
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from edgetrain.runtime.python import int8_reference as ref
from edgetrain.targets.boards import DEFAULT_BOARD, load_board

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import int8_kernels as harness  # noqa: E402

C_DIR = ROOT / "runtime" / "c"
# q8_patch.c reads a tile's crop of the batch through the input reader (storage_input.c)
Q8_SOURCES = [*sorted((C_DIR / "kernels").glob("q8_*.c")), C_DIR / "storage_input.c"]
WARN = ["-Wall", "-Wextra", "-Werror", "-std=c99", "-pedantic", "-Wvla"]
BOARD = load_board(DEFAULT_BOARD)

# A loop over et_q8_requantize (static inline in q8_arith.h) so the test can call it on arrays.
_HELPERS = r"""
#include "kernels/q8_arith.h"
void t_requantize(int count, const int32_t *v, const int32_t *mult, const int32_t *shift, int32_t *out)
{
    int i;
    for (i = 0; i < count; ++i)
        out[i] = et_q8_requantize(v[i], mult[i], shift[i]);
}
"""


class ConvShape(ctypes.Structure):
    _fields_ = [(f, c_int) for f in ("n", "c_in", "h_in", "w_in", "c_out", "h_out", "w_out", "k_h", "k_w", "stride_h",
                                     "stride_w", "pad_h", "pad_w", "dil_h", "dil_w", "groups")]


class PoolShape(ctypes.Structure):
    _fields_ = [(f, c_int) for f in ("n", "c", "h_in", "w_in", "h_out", "w_out", "k_h", "k_w", "stride_h", "stride_w",
                                     "pad_h", "pad_w", "dil_h", "dil_w", "count_include_pad")]


class Requant(ctypes.Structure):
    _fields_ = [("mult", POINTER(c_int32)), ("shift", POINTER(c_int32)), ("out_zp", c_int32), ("act_min", c_int32),
                ("act_max", c_int32)]


_P = ctypes.c_void_p
_SIGNATURES = {
    "t_requantize": [c_int, _P, _P, _P, _P],
    "et_q8_conv2d_scratch_size": [POINTER(ConvShape)],
    "et_q8_conv2d_input_grad_scratch_size": [POINTER(ConvShape)],
    "et_q8_conv2d_forward_ref": [POINTER(ConvShape), _P, c_int32, _P, _P, POINTER(Requant), _P],
    "et_q8_conv2d_forward": [POINTER(ConvShape), _P, c_int32, _P, _P, POINTER(Requant), _P, _P],
    "et_q8_conv2d_backward_input_ref": [POINTER(ConvShape), _P, _P, POINTER(Requant), _P],
    "et_q8_conv2d_backward_input": [POINTER(ConvShape), _P, _P, POINTER(Requant), _P, _P],
    "et_q8_conv2d_backward_weight_ref": [POINTER(ConvShape), _P, _P, c_int32, _P, _P],
    "et_q8_conv2d_backward_weight": [POINTER(ConvShape), _P, _P, c_int32, _P, _P, _P],
    "et_q8_conv2d_weight_grad_scratch_size": [POINTER(ConvShape)],
    "et_q8_linear_forward_ref": [c_int, c_int, c_int, _P, c_int32, _P, _P, POINTER(Requant), _P],
    "et_q8_linear_forward": [c_int, c_int, c_int, _P, c_int32, _P, _P, POINTER(Requant), _P],
    "et_q8_linear_backward_input_ref": [c_int, c_int, c_int, _P, _P, POINTER(Requant), _P],
    "et_q8_linear_backward_input": [c_int, c_int, c_int, _P, _P, POINTER(Requant), _P],
    "et_q8_linear_backward_weight": [c_int, c_int, c_int, _P, _P, c_int32, _P, _P],
    "et_q8_linear_backward_weight_ref": [c_int, c_int, c_int, _P, _P, c_int32, _P, _P],
    "et_q8_maxpool2d_forward": [POINTER(PoolShape), _P, _P, _P],
    "et_q8_maxpool2d_backward": [POINTER(PoolShape), _P, _P, _P],
    "et_q8_avgpool2d_forward": [POINTER(PoolShape), _P, c_int32, _P],
    "et_q8_avgpool2d_backward": [POINTER(PoolShape), _P, _P],
    "et_q8_avgpool2d_backward_ref": [POINTER(PoolShape), _P, _P],
    **{f"et_q8_{op}_forward{v}": [c_int, _P, c_int32, _P] for op in ("relu",) for v in ("", "_ref")},
    **{f"et_q8_{op}_backward{v}": [c_int, _P, _P, c_int32, _P] for op in ("relu",) for v in ("", "_ref")},
    **{f"et_q8_relu6_forward{v}": [c_int, _P, c_int32, c_int32, _P] for v in ("", "_ref")},
    **{f"et_q8_relu6_backward{v}": [c_int, _P, _P, c_int32, c_int32, _P] for v in ("", "_ref")},
}


def _gcc() -> str:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("host gcc is not installed (apt-get install gcc): the C runtime cannot be built")
    return gcc


def _build(out: Path, name: str, extra: list[str]) -> ctypes.CDLL:
    helpers = out / "helpers.c"
    helpers.write_text(_HELPERS)
    so = out / name
    cmd = [_gcc(), *WARN, "-O2", "-fPIC", "-shared", *extra, f"-I{C_DIR}", *map(str, Q8_SOURCES), str(helpers),
           "-o", str(so)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stderr}"
    lib = ctypes.CDLL(str(so))
    for fn, args in _SIGNATURES.items():
        getattr(lib, fn).argtypes = args
        getattr(lib, fn).restype = c_int if fn.endswith("scratch_size") else None
    return lib


@pytest.fixture(scope="module")
def libs(tmp_path_factory) -> dict[str, ctypes.CDLL]:
    """'plain': the build every host gets; 'fast': the DSP variants with the instructions emulated in C."""
    out = tmp_path_factory.mktemp("q8")
    return {"plain": _build(out, "libq8.so", []), "fast": _build(out, "libq8_fast.so", ["-DET_Q8_EMULATE_DSP"])}


def p(a: np.ndarray | None):
    if a is None:
        return None
    assert a.flags.c_contiguous
    return a.ctypes.data


def requant(q: ref.Requant) -> tuple[Requant, tuple]:
    """The C struct of a reference Requant; the arrays it points into are returned to keep them alive."""
    m, s = np.ascontiguousarray(q.mult, np.int32), np.ascontiguousarray(q.shift, np.int32)
    return Requant(m.ctypes.data_as(POINTER(c_int32)), s.ctypes.data_as(POINTER(c_int32)), q.out_zp, q.act_min,
                   q.act_max), (m, s)


def i8(rng, *shape, lo=-128, hi=127) -> np.ndarray:
    return rng.integers(lo, hi + 1, shape).astype(np.int8)


def random_requant(rng, channels: int, terms: int, out_zp: int = 0, act_min: int = -128) -> ref.Requant:
    """Per-channel multipliers that put a sum of `terms` int8 products around the int8 range (some saturate)."""
    base = 9 + int(np.log2(max(terms, 1))) // 2
    return ref.Requant(rng.integers(1 << 30, 1 << 31, channels).astype(np.int32),
                       (-base + rng.integers(-1, 2, channels)).astype(np.int32), out_zp, act_min, 127)


def out_size(size, k, s, pd, d):
    return (size + 2 * pd - d * (k - 1) - 1) // s + 1


def random_conv(rng) -> dict:
    """A random convolution: plain, grouped, pointwise or depthwise (with a channel multiplier; 3-wide kernel rows
    in half of them), kernels 1-5, strides 1-2, padding, dilation, batch 1-2, channels not multiples of 4."""
    while True:
        kind = rng.choice(["plain", "grouped", "depthwise", "depthwise3", "pointwise"])
        groups = {"plain": 1, "pointwise": 1, "grouped": int(rng.integers(2, 4))}.get(kind, 0)
        cin_g, cout_g = int(rng.integers(1, 7)), int(rng.integers(1, 10))
        if kind.startswith("depthwise"):
            groups, cin_g, cout_g = int(rng.integers(1, 9)), 1, int(rng.integers(1, 3))
        k = (1, 1) if kind == "pointwise" else tuple(int(v) for v in rng.integers(1, 6, 2))
        if kind == "depthwise3":  # the fast kernels' own path: 3-wide rows (stride 1 in half the draws)
            k = (k[0], 3)
        stride = tuple(int(v) for v in rng.integers(1, 3, 2))
        if kind == "depthwise3" and rng.random() < 0.5:
            stride = (1, 1)
        dil = tuple(int(v) for v in rng.integers(1, 3, 2)) if rng.random() < 0.3 else (1, 1)
        pad = tuple(int(rng.integers(0, (kk - 1) * dd + 1)) for kk, dd in zip(k, dil))
        hw = tuple(int(v) for v in rng.integers(1, 12, 2))
        out = tuple(out_size(hw[i], k[i], stride[i], pad[i], dil[i]) for i in range(2))
        if min(out) >= 1:
            return dict(n=int(rng.integers(1, 3)), c_in=cin_g * groups, c_out=cout_g * groups, hw=hw, out=out, k=k,
                        stride=stride, pad=pad, dil=dil, groups=groups)


def conv_shape(c: dict) -> ConvShape:
    return ConvShape(c["n"], c["c_in"], *c["hw"], c["c_out"], *c["out"], *c["k"], *c["stride"], *c["pad"], *c["dil"],
                     c["groups"])


# -- requantisation -----------------------------------------------------------------------------------------

def test_requantize_is_cmsis_nn_arithmetic(libs):
    """C and numpy agree on every input, edges included, and both are the rational v * mult * 2^(shift-31)
    rounded, within one unit (two roundings: SQRDMULH's, halves up, then the shift's, halves away from zero)."""
    rng = np.random.default_rng(0)
    v = np.concatenate([rng.integers(-(1 << 31), 1 << 31, 4000), [0, 1, -1, ref.INT32_MAX, ref.INT32_MIN, 3, -3, 5, -5],
                        rng.integers(-300, 300, 2000)]).astype(np.int32)
    mult = rng.integers(1 << 30, 1 << 31, v.size).astype(np.int32)
    mult[-2000:] = 1 << 30  # exact halves: 0.5 * 2^shift
    shift = rng.integers(-31, 31, v.size).astype(np.int32)
    shift[-2000:] = rng.integers(-4, 1, 2000)
    got = np.empty_like(v)
    libs["plain"].t_requantize(v.size, p(v), p(mult), p(shift), p(got))
    assert np.array_equal(got, ref.requantize(v, mult, shift))
    # Against exact rationals, where no saturation of the left shift is involved.
    for vi, mi, si, gi in zip(v.tolist(), mult.tolist(), shift.tolist(), got.tolist()):
        if si > 0 and abs(vi) << si > ref.INT32_MAX:
            assert gi in (ref.requantize(np.int64(ref.INT32_MAX if vi > 0 else ref.INT32_MIN), mi, si),)
            continue
        num, den = vi * mi, 1 << (31 - si)  # exact value num / den
        exact = (abs(num) + den // 2) // den * (1 if num >= 0 else -1)  # round half away from zero
        assert abs(gi - exact) <= 1, (vi, mi, si, gi, exact)
    # The multiply rounds halves up (gemmlowp's and CMSIS-NN's nudge): 1.5 -> 2, -1.5 -> -1, -0.5 -> 0; the
    # shift rounds them away from zero: 3 / 2 -> 2, -3 / 2 -> -2.
    assert ref.requantize(np.array([3, -3, 1, -1]), 1 << 30, 0).tolist() == [2, -1, 1, 0]
    assert ref.requantize(np.array([3, -3, 1, -1]), (1 << 31) - 1, -1).tolist() == [2, -2, 1, -1]


def test_quantize_multiplier_round_trips_scales():
    for real in (1.0, 0.5, 0.75, 1e-3, 3.9e-5, 7.5, 0.9999999999):
        m, s = ref.quantize_multiplier(real)
        assert (1 << 30) <= m < (1 << 31) and abs(m * 2.0 ** (s - 31) - real) <= real * 2 ** -30
    with pytest.raises(ValueError, match="positive"):
        ref.quantize_multiplier(0.0)


# -- convolution --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(60))
def test_conv_kernels_equal_the_reference_bit_for_bit(libs, seed):
    rng = np.random.default_rng(seed)
    c = random_conv(rng)
    n, hw, out, g = c["n"], c["hw"], c["out"], c["groups"]
    cin_g, cout_g = c["c_in"] // g, c["c_out"] // g
    x = i8(rng, n, c["c_in"], *hw)
    w = i8(rng, c["c_out"], cin_g, *c["k"], lo=-127)
    gy = i8(rng, n, c["c_out"], *out)
    bias = rng.integers(-5000, 5000, c["c_out"]).astype(np.int32)
    x_zp, out_zp = int(rng.integers(-128, 128)), int(rng.integers(-30, 30))
    q = random_requant(rng, c["c_out"], cin_g * c["k"][0] * c["k"][1], out_zp, out_zp if rng.random() < 0.3 else -128)
    gq = random_requant(rng, c["c_in"], cout_g * c["k"][0] * c["k"][1])
    geo = dict(stride=c["stride"], padding=c["pad"], dilation=c["dil"], groups=g)
    want_y = ref.conv2d_forward(x, x_zp, w, bias, q, **geo)
    want_gx = ref.conv2d_backward_input(gy, w, gq, hw, **geo)
    want_gw, want_gb = ref.conv2d_backward_weight(gy, x, x_zp, c["k"], **geo)
    s = conv_shape(c)
    cq, keep = requant(q)
    cgq, keep2 = requant(gq)
    for name, lib in libs.items():
        col = np.zeros(max(lib.et_q8_conv2d_scratch_size(s), lib.et_q8_conv2d_input_grad_scratch_size(s),
                           lib.et_q8_conv2d_weight_grad_scratch_size(s)), np.int16)
        for fast in (False, True):
            y, gx = np.zeros_like(want_y), np.zeros_like(x)
            gw, gb = np.zeros(w.shape, np.int32), np.zeros(c["c_out"], np.int32)
            if fast:
                lib.et_q8_conv2d_forward(s, p(x), x_zp, p(w), p(bias), cq, p(col), p(y))
                lib.et_q8_conv2d_backward_input(s, p(gy), p(w), cgq, p(col), p(gx))
                lib.et_q8_conv2d_backward_weight(s, p(gy), p(x), x_zp, p(col), p(gw), p(gb))
            else:
                lib.et_q8_conv2d_forward_ref(s, p(x), x_zp, p(w), p(bias), cq, p(y))
                lib.et_q8_conv2d_backward_input_ref(s, p(gy), p(w), cgq, p(gx))
                lib.et_q8_conv2d_backward_weight_ref(s, p(gy), p(x), x_zp, p(gw), p(gb))
            label = f"{name} build, {'public' if fast else '_ref'} functions, {c}"
            assert np.array_equal(y, want_y), f"forward: {label}"
            assert np.array_equal(gx, want_gx), f"input gradient: {label}"
            assert np.array_equal(gw, want_gw) and np.array_equal(gb, want_gb), f"weight gradient: {label}"


@pytest.mark.parametrize("seed", range(6))
def test_conv_reference_is_torch_convolution_then_requantisation(seed):
    """The reference's integer sums are torch's convolution (and its autograd) of the centred integers, exactly
    (float64 holds them), and each int8 output is that sum times the real scale mult * 2^(shift-31), rounded,
    within one unit: the only error is requantisation's."""
    rng = np.random.default_rng(100 + seed)
    c = random_conv(rng)
    g = c["groups"]
    x, w = i8(rng, c["n"], c["c_in"], *c["hw"]), i8(rng, c["c_out"], c["c_in"] // g, *c["k"], lo=-127)
    gy = i8(rng, c["n"], c["c_out"], *c["out"])
    x_zp, out_zp = int(rng.integers(-128, 128)), int(rng.integers(-30, 30))
    geo = dict(stride=c["stride"], padding=c["pad"], dilation=c["dil"], groups=g)
    q = random_requant(rng, c["c_out"], c["c_in"] // g * c["k"][0] * c["k"][1], out_zp)
    xt = torch.tensor(x.astype(np.float64) - x_zp, requires_grad=True)
    wt = torch.tensor(w.astype(np.float64), requires_grad=True)
    acc = F.conv2d(xt, wt, None, **geo)
    gxt, gwt = torch.autograd.grad(acc, [xt, wt], torch.tensor(gy.astype(np.float64)))
    scale = q.mult.astype(np.float64) * 2.0 ** (q.shift.astype(np.float64) - 31)
    ideal = np.clip(np.round(acc.detach().numpy() * scale[None, :, None, None]) + out_zp, -128, 127)
    assert np.abs(ref.conv2d_forward(x, x_zp, w, None, q, **geo) - ideal).max() <= 1
    gw, gb = ref.conv2d_backward_weight(gy, x, x_zp, c["k"], **geo)
    assert np.array_equal(gw, gwt.numpy()) and np.array_equal(gb, gy.astype(np.int64).sum((0, 2, 3)))
    one = ref.Requant(np.full(c["c_in"], 1 << 30, np.int32), np.full(c["c_in"], 1, np.int32))  # x1: the sum itself
    assert np.array_equal(ref.conv2d_backward_input(gy, w, one, c["hw"], **geo), np.clip(gxt.numpy(), -128, 127))


# -- linear -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n,fin,fout", [(1, 1, 1), (1, 64, 9), (3, 13, 7), (2, 256, 10), (5, 7, 33)])
def test_linear_kernels_equal_the_reference_and_torch(libs, n, fin, fout):
    rng = np.random.default_rng(n * 1000 + fin + fout)
    x, w, gy = i8(rng, n, fin), i8(rng, fout, fin, lo=-127), i8(rng, n, fout)
    bias = rng.integers(-5000, 5000, fout).astype(np.int32)
    x_zp, out_zp = int(rng.integers(-128, 128)), int(rng.integers(-30, 30))
    q, gq = random_requant(rng, fout, fin, out_zp), random_requant(rng, fin, fout)
    want_y, want_gx = ref.linear_forward(x, x_zp, w, bias, q), ref.linear_backward_input(gy, w, gq)
    want_gw, want_gb = ref.linear_backward_weight(gy, x, x_zp)
    xt = torch.tensor(x.astype(np.float64) - x_zp, requires_grad=True)
    wt = torch.tensor(w.astype(np.float64), requires_grad=True)
    gxt, gwt = torch.autograd.grad(F.linear(xt, wt), [xt, wt], torch.tensor(gy.astype(np.float64)))
    assert np.array_equal(want_gw, gwt.numpy())
    cq, k1 = requant(q)
    cgq, k2 = requant(gq)
    for name, lib in libs.items():
        for suffix in ("", "_ref"):
            y, gx = np.zeros((n, fout), np.int8), np.zeros((n, fin), np.int8)
            getattr(lib, f"et_q8_linear_forward{suffix}")(n, fin, fout, p(x), x_zp, p(w), p(bias), cq, p(y))
            getattr(lib, f"et_q8_linear_backward_input{suffix}")(n, fin, fout, p(gy), p(w), cgq, p(gx))
            assert np.array_equal(y, want_y) and np.array_equal(gx, want_gx), (name, suffix)
        for suffix in ("", "_ref"):
            gw, gb = np.full((fout, fin), 7, np.int32), np.full(fout, 7, np.int32)  # every element written
            getattr(lib, f"et_q8_linear_backward_weight{suffix}")(n, fin, fout, p(gy), p(x), x_zp, p(gw), p(gb))
            assert np.array_equal(gw, want_gw) and np.array_equal(gb, want_gb), (name, suffix)


def test_an_int32_overflow_is_refused_by_the_reference():
    x = np.full((1, 70000), 127, np.int8)
    with pytest.raises(OverflowError, match="int32"):
        ref.linear_backward_weight(np.full((70000, 1), 127, np.int8), np.full((70000, 1), 127, np.int8), -128)
    with pytest.raises(OverflowError):
        ref.linear_forward(x, -128, np.full((1, 70000), 127, np.int8), None, ref.Requant(np.array([1 << 30]), np.array([0])))


# -- pooling and activations --------------------------------------------------------------------------------

POOLS = [  # kernel, stride, padding, dilation, count_include_pad, input (n, c, h, w)
    ((3, 3), (2, 2), (1, 1), (1, 1), True, (2, 3, 7, 7)),
    ((3, 3), (2, 2), (1, 1), (1, 1), False, (2, 3, 7, 7)),
    ((2, 2), (2, 2), (0, 0), (1, 1), True, (1, 4, 8, 6)),
    ((3, 2), (1, 2), (1, 0), (2, 1), True, (1, 2, 9, 8)),
    ((2, 4), (1, 2), (0, 1), (1, 1), True, (1, 2, 6, 9)),
    ((3, 3), (1, 1), (1, 1), (1, 1), False, (1, 2, 5, 5)),
    ((3, 3), (3, 3), (1, 1), (1, 1), True, (2, 3, 8, 7)),  # windows apart: the max-pool backward scatters
    ((3, 3), (3, 3), (1, 1), (1, 1), False, (1, 2, 8, 7)),  # and the avg-pool backward, inside divisors
    ((2, 2), (3, 3), (0, 0), (1, 1), True, (1, 2, 8, 7)),  # gaps no window covers
    ((2, 2), (2, 2), (0, 0), (1, 1), True, (2, 3, 7, 9)),  # an odd edge no window covers
    ((6, 5), (6, 5), (0, 0), (1, 1), True, (2, 4, 6, 5)),  # a global average pool
]


@pytest.mark.parametrize("kernel,stride,pad,dil,incl,shape", POOLS)
def test_pools_equal_the_reference_and_torch(libs, kernel, stride, pad, dil, incl, shape):
    rng = np.random.default_rng(sum(shape) + kernel[0])
    n, c, h, w = shape
    out = tuple(out_size((h, w)[i], kernel[i], stride[i], pad[i], dil[i]) for i in range(2))
    x, gy = i8(rng, *shape, lo=-20, hi=20), i8(rng, n, c, *out)  # narrow values: ties in the max-pool windows
    s = PoolShape(n, c, h, w, *out, *kernel, *stride, *pad, *dil, int(incl))
    y, idx, gx = np.zeros((n, c, *out), np.int8), np.zeros((n, c, *out), np.int32), np.zeros(shape, np.int8)
    for lib in libs.values():
        lib.et_q8_maxpool2d_forward(s, p(x), p(y), p(idx))
        want_y, want_idx = ref.maxpool2d_forward(x, kernel, stride, pad, dil)
        ty, tidx = F.max_pool2d(torch.tensor(x, dtype=torch.float32), kernel, stride, pad, dil, return_indices=True)
        assert np.array_equal(y, want_y) and np.array_equal(idx, want_idx)
        assert np.array_equal(want_y, ty.numpy()) and np.array_equal(want_idx, tidx.numpy())  # ties: torch's pick
        lib.et_q8_maxpool2d_backward(s, p(gy), p(idx), p(gx))
        assert np.array_equal(gx, ref.maxpool2d_backward(gy, want_idx, (h, w)))
        if dil != (1, 1):
            continue
        zp = int(rng.integers(-20, 20))
        lib.et_q8_avgpool2d_forward(s, p(x), zp, p(y))
        want = ref.avgpool2d_forward(x, zp, kernel, stride, pad, incl)
        assert np.array_equal(y, want)
        ideal = F.avg_pool2d(torch.tensor(x, dtype=torch.float64) - zp, kernel, stride, pad, count_include_pad=incl)
        assert np.abs(want - zp - ideal.numpy()).max() <= 0.5 + 1e-9  # rounded to the nearest integer
        want_gx = ref.avgpool2d_backward(gy, (h, w), kernel, stride, pad, incl)
        for backward in (lib.et_q8_avgpool2d_backward, lib.et_q8_avgpool2d_backward_ref):
            gx[...] = 99  # every element written, the uncovered ones too
            backward(s, p(gy), p(gx))
            assert np.array_equal(gx, want_gx)
        xt = torch.zeros(shape, dtype=torch.float64, requires_grad=True)
        (ideal_gx,) = torch.autograd.grad(F.avg_pool2d(xt, kernel, stride, pad, count_include_pad=incl), [xt],
                                          torch.tensor(gy, dtype=torch.float64))
        # Q15 reciprocals: off by at most the rounding (0.5) plus 2^-16 relative per term, for these window sizes
        assert np.abs(want_gx - ideal_gx.numpy()).max() <= 1


@pytest.mark.parametrize("count", [1, 3, 4, 37, 1000])
def test_relu_and_relu6_equal_the_reference(libs, count):
    rng = np.random.default_rng(count)
    x, gy = i8(rng, count), i8(rng, count)
    zp = int(rng.integers(-60, 20))
    q6 = min(127, zp + int(rng.integers(10, 100)))
    x[: min(count, 4)] = [zp, q6, zp + 1, q6 - 1][: min(count, 4)]  # the bounds themselves
    for lib in libs.values():
        for suffix in ("", "_ref"):
            y, gx = np.zeros(count, np.int8), np.zeros(count, np.int8)
            getattr(lib, f"et_q8_relu_forward{suffix}")(count, p(x), zp, p(y))
            getattr(lib, f"et_q8_relu_backward{suffix}")(count, p(gy), p(y), zp, p(gx))
            assert np.array_equal(y, ref.relu_forward(x, zp)) and np.array_equal(gx, ref.relu_backward(gy, y, zp))
            getattr(lib, f"et_q8_relu6_forward{suffix}")(count, p(x), zp, q6, p(y))
            getattr(lib, f"et_q8_relu6_backward{suffix}")(count, p(gy), p(y), zp, q6, p(gx))
            assert np.array_equal(y, ref.relu6_forward(x, zp, q6))
            assert np.array_equal(gx, ref.relu6_backward(gy, y, zp, q6))
            buf = x.copy()  # in place
            getattr(lib, f"et_q8_relu_forward{suffix}")(count, p(buf), zp, p(buf))
            assert np.array_equal(buf, ref.relu_forward(x, zp))
    t = torch.tensor(x.astype(np.float64) - zp)  # against torch in real terms (scale 1): relu and hardtanh(0, 6)
    assert np.array_equal(ref.relu_forward(x, zp).astype(np.int64) - zp, F.relu(t).numpy())
    assert np.array_equal(ref.relu6_forward(x, zp, q6).astype(np.int64) - zp, F.hardtanh(t, 0, q6 - zp).numpy())


# -- the Cortex-M builds ------------------------------------------------------------------------------------

def _arm() -> str:
    arm = shutil.which("arm-none-eabi-gcc")
    if arm is None:
        pytest.skip("arm-none-eabi-gcc missing (apt-get install gcc-arm-none-eabi libnewlib-arm-none-eabi)")
    return arm


def test_fast_variants_use_the_dsp_instructions_only_where_they_exist(tmp_path):
    """On the M4F the fast kernels are SMLAD/SXTB16 code; on a Cortex-M0+ (no DSP extension) the same sources
    build warning-free to the plain loops, with none of those instructions."""
    arm = _arm()
    objdump = shutil.which("arm-none-eabi-objdump")
    for cpu, flags in (("m4f", BOARD.cpu_flags.split()), ("m0plus", ["-mthumb", "-mcpu=cortex-m0plus"])):
        found = set()
        for src in Q8_SOURCES:
            obj = tmp_path / f"{src.stem}-{cpu}.o"
            res = subprocess.run([arm, *WARN, *flags, "-O2", f"-I{C_DIR}", "-c", str(src), "-o", str(obj)],
                                 capture_output=True, text=True)
            assert res.returncode == 0, f"{src.name} for {cpu}:\n{res.stderr}"
            if objdump:
                dis = subprocess.run([objdump, "-d", str(obj)], capture_output=True, text=True).stdout
                found |= {ins for ins in ("smlad", "sxtb16", "sxtab16", "ssub8", "sel") if f"\t{ins}\t" in dis}
        if objdump:
            assert found == ({"smlad", "sxtb16", "sxtab16", "ssub8", "sel"} if cpu == "m4f" else set()), (cpu, found)


@pytest.mark.slow
def test_harness_on_the_host_and_on_the_cortex_m4f_under_qemu_equals_the_reference(tmp_path):
    """runtime/c/selftest/q8_selftest.c on every kernel and shape it holds: on the host (plain, and fast with the
    DSP emulated) and on the emulated Cortex-M4F with the real SMLAD/SXTB16/SEL, every result equals the numpy
    reference bit for bit, and the M4F's fast kernels take fewer instructions than its plain ones on the
    measured convolution shapes."""
    _gcc()
    builds = []
    for emulate in (False, True):
        pages = tmp_path / f"host-{int(emulate)}"
        pages.mkdir()
        harness.run_host(harness.build_host(str(tmp_path), str(pages), emulate))
        builds.append(("host" + (" (DSP emulated)" if emulate else ""), harness.read_cases(str(pages))))
    if harness.toolchain_missing() is None:
        cases, wrong = harness.run_board_cases(BOARD, str(tmp_path))
        assert not wrong, wrong
        builds.append((BOARD.name, cases))
        rows = harness.rows_of(cases, BOARD)
        conv = [r for r in rows if r["kind"] == "conv" and r["direction"] == "forward"]
        assert conv and all(r["int8_fast_instructions"] < r["int8_instructions"] for r in conv), conv
    for label, cases in builds:
        assert len(cases) > 20
        wrong = [m for c in cases for m in harness.mismatches(c)]
        assert not wrong, f"{label}: {wrong}"
