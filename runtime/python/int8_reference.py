"""The int8 kernels' arithmetic in numpy, bit for bit: what the C runtime's q8_*.c compute (runtime/c/kernels).

Every function takes and returns integer numpy arrays in the C kernels' layouts (NCHW activations, [out][in/groups]
[kh][kw] conv weights, [out][in] linear weights) and reproduces their integer results exactly: int32 sums (checked to
fit, as the C sums must), CMSIS-NN's requantisation (a Q31 multiplier and a power-of-two exponent, each rounding as
CMSIS-NN does), zero points and saturation. The sums here are formed another way than the C loops form them (strided
slices and einsum over int64, scatters where C gathers), so agreement checks the C indexing, not a copy of it.

Quantisation: a real value is s * (q - zp). Weights are symmetric with one scale per output channel, activations
carry a scale and a zero point, gradients are symmetric (q8_arith.h has the conventions).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


@dataclass(frozen=True)
class Requant:
    """How an int32 accumulator becomes int8, per output channel (the C struct et_q8_requant)."""
    mult: np.ndarray     # [channels] Q31 multipliers in [2^30, 2^31)
    shift: np.ndarray    # [channels] exponents -31..30
    out_zp: int = 0
    act_min: int = -128
    act_max: int = 127


def quantize_multiplier(real: float) -> tuple[int, int]:
    """(mult, shift) with mult * 2^(shift - 31) == real to Q31 precision (TFLite's QuantizeMultiplier); real > 0."""
    if not real > 0:
        raise ValueError(f"a requantisation scale must be positive, got {real}")
    frac, exp = math.frexp(real)  # real = frac * 2^exp, frac in [0.5, 1)
    mult = round(frac * (1 << 31))
    if mult == 1 << 31:  # frac rounded up to 1.0
        mult, exp = mult // 2, exp + 1
    if not -31 <= exp <= 30:
        raise ValueError(f"scale {real} is outside what a Q31 multiplier and a shift in -31..30 can express")
    return mult, exp


def _checked(acc: np.ndarray) -> np.ndarray:
    """An accumulator as the C kernels hold it: int32, which an exact sum must fit."""
    acc = np.asarray(acc, dtype=np.int64)
    if acc.size and (acc.min() < INT32_MIN or acc.max() > INT32_MAX):
        raise OverflowError("an int8 kernel's sum leaves int32 (the C kernels would wrap): fewer terms or smaller "
                            "values per output")
    return acc


def _trunc_div_pow2(v: np.ndarray, bits: int) -> np.ndarray:
    """v / 2^bits rounded toward zero (C's integer division)."""
    mag = np.abs(v) >> bits
    return np.where(v < 0, -mag, mag)


def rounding_rshift(v: np.ndarray, exponent) -> np.ndarray:
    """round(v / 2^exponent), halves away from zero (et_q8_rounding_rshift)."""
    v = np.asarray(v, dtype=np.int64)
    e = np.asarray(exponent, dtype=np.int64)
    mask = (np.int64(1) << e) - 1
    threshold = (mask >> 1) + (v < 0)
    return (v >> e) + ((v & mask) > threshold)


def requantize(acc: np.ndarray, mult, shift) -> np.ndarray:
    """et_q8_requantize: (acc * 2^left) saturated to int32, times mult / 2^31 rounded with halves up (the nudge,
    then a division toward zero), then rounded right by -shift with halves away from zero; mult and shift broadcast
    against acc."""
    acc = _checked(acc)
    mult, shift = np.asarray(mult, np.int64), np.asarray(shift, np.int64)
    v = np.clip(acc << np.maximum(shift, 0), INT32_MIN, INT32_MAX)
    p = v * mult
    high = _trunc_div_pow2(p + np.where(p >= 0, 1 << 30, 1 - (1 << 30)), 31)
    return rounding_rshift(high, np.maximum(-shift, 0))


def output(acc: np.ndarray, q: Requant, channel_axis: int) -> np.ndarray:
    """int8 outputs of accumulators whose channel is along `channel_axis` (et_q8_output)."""
    shape = [1] * acc.ndim
    shape[channel_axis] = -1
    v = requantize(acc, np.reshape(q.mult, shape), np.reshape(q.shift, shape)) + q.out_zp
    return np.clip(v, q.act_min, q.act_max).astype(np.int8)


def sat8(v: np.ndarray) -> np.ndarray:
    return np.clip(v, -128, 127).astype(np.int8)


# -- convolution ---------------------------------------------------------------------------------------------

def _out_size(size: int, k: int, stride: int, pad: int, dil: int) -> int:
    return (size + 2 * pad - dil * (k - 1) - 1) // stride + 1


def _taps(k_h: int, k_w: int, stride, dil, out_hw):
    """(kh, kw, row slice, column slice) of each kernel tap into the padded input: the input pixels it reads."""
    for kh in range(k_h):
        for kw in range(k_w):
            r0, c0 = kh * dil[0], kw * dil[1]
            yield kh, kw, slice(r0, r0 + stride[0] * (out_hw[0] - 1) + 1, stride[0]), \
                slice(c0, c0 + stride[1] * (out_hw[1] - 1) + 1, stride[1])


def conv2d_forward(x, x_zp: int, w, bias, q: Requant, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                   groups: int = 1) -> np.ndarray:
    """y = q(bias + sum (x - x_zp) * w), NCHW; padding reads as a real 0 (et_q8_conv2d_forward)."""
    n, c_in, h, wd = x.shape
    c_out, cin_g, k_h, k_w = w.shape
    cout_g = c_out // groups
    out_hw = (_out_size(h, k_h, stride[0], padding[0], dilation[0]), _out_size(wd, k_w, stride[1], padding[1], dilation[1]))
    xc = np.pad(x.astype(np.int64) - x_zp, ((0, 0), (0, 0), (padding[0],) * 2, (padding[1],) * 2))
    acc = np.zeros((n, c_out) + out_hw, np.int64)
    for g in range(groups):
        xs, ws = xc[:, g * cin_g:(g + 1) * cin_g], w[g * cout_g:(g + 1) * cout_g].astype(np.int64)
        for kh, kw, rs, cs in _taps(k_h, k_w, stride, dilation, out_hw):
            acc[:, g * cout_g:(g + 1) * cout_g] += np.einsum("nchw,oc->nohw", xs[:, :, rs, cs], ws[:, :, kh, kw])
    if bias is not None:
        acc += np.asarray(bias, np.int64)[None, :, None, None]
    return output(acc, q, 1)


def conv2d_backward_input(gy, w, q: Requant, in_hw, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                          groups: int = 1) -> np.ndarray:
    """gx = q(sum over the taps reading each input pixel of gy * w), q per input channel: each tap's products
    scattered into the padded input, the padding cut off (et_q8_conv2d_backward_input)."""
    return output(conv2d_backward_input_sums(gy, w, in_hw, stride, padding, dilation, groups), q, 1)


def conv2d_backward_input_sums(gy, w, in_hw, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                               groups: int = 1) -> np.ndarray:
    """The exact int32 sums conv2d_backward_input requantises (int64 values, checked to fit int32)."""
    n, c_out, oh, ow = gy.shape
    _, cin_g, k_h, k_w = w.shape
    cout_g = c_out // groups
    acc = np.zeros((n, cin_g * groups, in_hw[0] + 2 * padding[0], in_hw[1] + 2 * padding[1]), np.int64)
    g64 = gy.astype(np.int64)
    for g in range(groups):
        gs, ws = g64[:, g * cout_g:(g + 1) * cout_g], w[g * cout_g:(g + 1) * cout_g].astype(np.int64)
        for kh, kw, rs, cs in _taps(k_h, k_w, stride, dilation, (oh, ow)):
            acc[:, g * cin_g:(g + 1) * cin_g, rs, cs] += np.einsum("nohw,oc->nchw", gs, ws[:, :, kh, kw])
    return _checked(acc[:, :, padding[0]:padding[0] + in_hw[0], padding[1]:padding[1] + in_hw[1]])


def conv2d_backward_weight(gy, x, x_zp: int, k_hw, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                           groups: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(gw, gb) as int32: gw = sum gy * (x - x_zp) per weight, gb = sum gy per output channel
    (et_q8_conv2d_backward_weight)."""
    n, c_out, oh, ow = gy.shape
    c_in = x.shape[1]
    cin_g, cout_g = c_in // groups, c_out // groups
    xc = np.pad(x.astype(np.int64) - x_zp, ((0, 0), (0, 0), (padding[0],) * 2, (padding[1],) * 2))
    g64 = gy.astype(np.int64)
    gw = np.zeros((c_out, cin_g) + tuple(k_hw), np.int64)
    for g in range(groups):
        gs, xs = g64[:, g * cout_g:(g + 1) * cout_g], xc[:, g * cin_g:(g + 1) * cin_g]
        for kh, kw, rs, cs in _taps(k_hw[0], k_hw[1], stride, dilation, (oh, ow)):
            gw[g * cout_g:(g + 1) * cout_g, :, kh, kw] = np.einsum("nohw,nchw->oc", gs, xs[:, :, rs, cs])
    return _checked(gw).astype(np.int32), _checked(g64.sum(axis=(0, 2, 3))).astype(np.int32)


# -- linear --------------------------------------------------------------------------------------------------

def linear_forward(x, x_zp: int, w, bias, q: Requant) -> np.ndarray:
    acc = (x.astype(np.int64) - x_zp) @ w.astype(np.int64).T
    if bias is not None:
        acc += np.asarray(bias, np.int64)
    return output(acc, q, 1)


def linear_backward_input(gy, w, q: Requant) -> np.ndarray:
    return output(gy.astype(np.int64) @ w.astype(np.int64), q, 1)


def linear_backward_weight(gy, x, x_zp: int) -> tuple[np.ndarray, np.ndarray]:
    g64 = gy.astype(np.int64)
    return _checked(g64.T @ (x.astype(np.int64) - x_zp)).astype(np.int32), _checked(g64.sum(0)).astype(np.int32)


# -- activations ---------------------------------------------------------------------------------------------

def relu_forward(x, zp: int) -> np.ndarray:
    return np.maximum(x, zp).astype(np.int8)


def relu_backward(gy, y, zp: int) -> np.ndarray:
    return np.where(y > zp, gy, 0).astype(np.int8)


def relu6_forward(x, zp: int, q6: int) -> np.ndarray:
    return np.clip(x, zp, q6).astype(np.int8)


def relu6_backward(gy, y, zp: int, q6: int) -> np.ndarray:
    return np.where((y > zp) & (y < q6), gy, 0).astype(np.int8)


# -- pooling -------------------------------------------------------------------------------------------------

def maxpool2d_forward(x, kernel, stride, padding=(0, 0), dilation=(1, 1)) -> tuple[np.ndarray, np.ndarray]:
    """(y, idx): each window's first maximum and its flat index in the plane (padding never wins)."""
    n, c, h, wd = x.shape
    out_hw = (_out_size(h, kernel[0], stride[0], padding[0], dilation[0]),
              _out_size(wd, kernel[1], stride[1], padding[1], dilation[1]))
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (padding[0],) * 2, (padding[1],) * 2), constant_values=-1 << 40)
    flat = np.pad(np.arange(h * wd).reshape(h, wd), ((padding[0],) * 2, (padding[1],) * 2), constant_values=-1)
    best = np.full((n, c) + out_hw, -1 << 41, np.int64)
    idx = np.zeros((n, c) + out_hw, np.int64)
    for _, _, rs, cs in _taps(kernel[0], kernel[1], stride, dilation, out_hw):  # taps in order: first max wins
        v = xp[:, :, rs, cs]
        better = v > best
        best = np.where(better, v, best)
        idx = np.where(better, flat[rs, cs][None, None], idx)
    return best.astype(np.int8), idx.astype(np.int32)


def maxpool2d_backward(gy, idx, in_hw) -> np.ndarray:
    """Each output's gradient added at its argmax (an int32 sum per input element), then saturated."""
    n, c = gy.shape[:2]
    acc = np.zeros((n * c, in_hw[0] * in_hw[1]), np.int64)
    rows = np.repeat(np.arange(n * c), idx[0, 0].size)
    np.add.at(acc, (rows, idx.reshape(-1)), gy.reshape(-1).astype(np.int64))
    return sat8(_checked(acc)).reshape(n, c, *in_hw)


def _avg_divisors(in_hw, kernel, stride, padding, out_hw, count_include_pad: bool) -> np.ndarray:
    """torch's divisor of every avg-pool window, [h_out][w_out]."""
    def extent(o, size, k, s, p):
        a = o * s - p
        end = np.minimum(a + k, size + p)
        return end - a, np.minimum(end, size) - np.maximum(a, 0)
    ph, ih = extent(np.arange(out_hw[0]), in_hw[0], kernel[0], stride[0], padding[0])
    pw, iw = extent(np.arange(out_hw[1]), in_hw[1], kernel[1], stride[1], padding[1])
    d = np.outer(ph, pw) if count_include_pad else np.outer(ih, iw)
    return np.maximum(d, 1)


def avgpool2d_forward(x, zp: int, kernel, stride, padding=(0, 0), count_include_pad: bool = True) -> np.ndarray:
    """zp + round(sum of (x - zp) over the window / torch's divisor), halves away from zero."""
    n, c, h, wd = x.shape
    out_hw = (_out_size(h, kernel[0], stride[0], padding[0], 1), _out_size(wd, kernel[1], stride[1], padding[1], 1))
    xc = np.pad(x.astype(np.int64) - zp, ((0, 0), (0, 0), (padding[0],) * 2, (padding[1],) * 2))
    acc = sum(xc[:, :, rs, cs] for _, _, rs, cs in _taps(kernel[0], kernel[1], stride, (1, 1), out_hw))
    d = _avg_divisors((h, wd), kernel, stride, padding, out_hw, count_include_pad)
    q = (np.abs(acc) + d // 2) // d
    return sat8(zp + np.where(acc < 0, -q, q))


def avgpool2d_backward(gy, in_hw, kernel, stride, padding=(0, 0), count_include_pad: bool = True) -> np.ndarray:
    """Each output spreads gy * round(2^15 / divisor) over its window; per input, the sum rounded right by 15."""
    n, c, oh, ow = gy.shape
    d = _avg_divisors(in_hw, kernel, stride, padding, (oh, ow), count_include_pad)
    g = gy.astype(np.int64) * ((32768 + d // 2) // d)
    acc = np.zeros((n, c, in_hw[0] + 2 * padding[0], in_hw[1] + 2 * padding[1]), np.int64)
    for _, _, rs, cs in _taps(kernel[0], kernel[1], stride, (1, 1), (oh, ow)):
        acc[:, :, rs, cs] += g
    acc = acc[:, :, padding[0]:padding[0] + in_hw[0], padding[1]:padding[1] + in_hw[1]]
    return sat8(rounding_rshift(_checked(acc), 15))
