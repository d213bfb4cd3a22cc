"""Kernels: one function per kernel name of the op registry, each defined once, collected in `KERNELS`.

Forward kernels call the aten op that the torch functional calls; backward kernels call the aten backward
op that autograd calls for it (never autograd over a recomputed subgraph), so results match autograd bit
for bit on the same device. A kernel returns a fresh `out` (never a view of an input), the gradients of its
params (the executor applies SGD) and the big temporaries it keeps visible to the memory ledger.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .kernel_api import IGNORE_INDEX, MEAN, Kernel, KernelResult, aten, grad_mask
from .transformer_kernels import TRANSFORMER_KERNELS

_MASK64 = (1 << 64) - 1


def _pair(v) -> list[int]:
    return [int(v), int(v)] if isinstance(v, int) else [int(a) for a in v]


def _shape_dummy(shape, like: Tensor) -> Tensor:
    """A tensor of `shape` that owns 1 element: for backward ops that read only the size of `self`."""
    return torch.empty((), dtype=like.dtype, device=like.device).expand(tuple(shape))


# -- convolution and linear ---------------------------------------------------------------------------

def conv2d(ctx, inputs, params, attrs):
    (x,) = inputs
    b = params[1] if attrs.get("bias") else None
    out = aten.convolution(x, params[0], b, _pair(attrs["stride"]), _pair(attrs["padding"]),
                           _pair(attrs["dilation"]), False, [0, 0], int(attrs["groups"]))
    return KernelResult(out)


def conv2d_bwd(ctx, inputs, params, attrs):
    gy, x = inputs
    w, has_bias = params[0], bool(attrs.get("bias"))
    bias_sizes = [w.shape[0]] if has_bias else [0]
    gx, gw, gb = aten.convolution_backward(
        gy, x, w, bias_sizes, _pair(attrs["stride"]), _pair(attrs["padding"]), _pair(attrs["dilation"]),
        False, [0, 0], int(attrs["groups"]), [grad_mask(attrs), True, has_bias])
    return KernelResult(gx, grads=[gw, gb] if has_bias else [gw])


def linear(ctx, inputs, params, attrs):
    (x,) = inputs
    b = params[1] if attrs.get("bias") else None
    return KernelResult(aten.linear(x, params[0], b))


def linear_bwd(ctx, inputs, params, attrs):
    """F.linear on 2-D x is addmm(b, x, w.t()) (mm without bias); these are autograd's mm formulas.

    On a contiguous N-D x, F.linear is the same mm on x viewed as (rows, features), viewed back after."""
    gy, x = inputs
    w = params[0]
    if x.dim() > 2:
        x, gy = x.view(-1, x.shape[-1]), gy.reshape(-1, gy.shape[-1])
    gx = None
    if grad_mask(attrs):
        # mm_mat1_backward: a column-major x gets its gradient computed transposed.
        if x.dim() == 2 and x.stride(0) == 1 and x.stride(1) == x.shape[0]:
            gx = w.t().mm(gy.t()).t()
        else:
            gx = gy.mm(w)
        gx = gx.view(attrs["input_shape"])
    gw = gy.t().mm(x)  # mm_mat2_backward for mat2 = w.t() (column-major), transposed back
    grads = [gw]
    if attrs.get("bias"):
        grads.append(gy.sum([0], keepdim=True).view(-1))  # sum_to(grad, bias.shape)
    return KernelResult(gx, grads=grads)


# -- activations --------------------------------------------------------------------------------------

def relu(ctx, inputs, params, attrs):
    return KernelResult(aten.relu(inputs[0]))


def relu_bwd(ctx, inputs, params, attrs):
    gy, y = inputs
    return KernelResult(aten.threshold_backward(gy, y, 0))


def relu6(ctx, inputs, params, attrs):
    return KernelResult(aten.hardtanh(inputs[0], 0.0, 6.0))


def relu6_bwd(ctx, inputs, params, attrs):
    # autograd passes the input x; with the output y, (0 < y < 6) <=> (0 < x < 6), so the mask is the same.
    gy, y = inputs
    return KernelResult(aten.hardtanh_backward(gy, y, 0.0, 6.0))


# -- batch norm ---------------------------------------------------------------------------------------

def _bn_affine(params):
    return (params[0], params[1]) if params else (None, None)


def batch_norm(ctx, inputs, params, attrs):
    """Training-mode batch norm. First compute: update running stats as nn.BatchNorm2d.train() does.

    A recompute runs the same kernel on copies of the running stats (2*C floats, thrown away), so the
    output comes from the very same code path and the buffers stay untouched.
    """
    (x,) = inputs
    w, b = _bn_affine(params)
    momentum, eps = attrs.get("momentum", 0.1), float(attrs["eps"])
    rm = rv = nbt = None
    if ctx.buffers:
        rm, rv = ctx.buffers[0], ctx.buffers[1]
        nbt = ctx.buffers[2] if len(ctx.buffers) > 2 else None
    if momentum is None:  # cumulative moving average, factor 1/num_batches_tracked (after the increment)
        if nbt is None:
            raise ValueError("batch_norm with momentum=None needs num_batches_tracked")
        factor = 1.0 / float(nbt.item() + (1 if ctx.first else 0))
    else:
        factor = float(momentum)
    if ctx.first:
        if nbt is not None:
            nbt.add_(1)
    elif rm is not None:
        rm, rv = rm.clone(), rv.clone()
    out, save_mean, save_invstd = aten.native_batch_norm(x, w, b, rm, rv, True, factor, eps)
    return KernelResult(out, aux=(save_mean, save_invstd))


def batch_norm_bwd(ctx, inputs, params, attrs):
    gy, x = inputs
    if ctx.aux is None:
        raise ValueError("batch_norm_bwd needs the aux (save_mean, save_invstd) of its forward node")
    save_mean, save_invstd = ctx.aux
    w, _ = _bn_affine(params)
    gx, gw, gb = aten.native_batch_norm_backward(
        gy, x, w, None, None, save_mean, save_invstd, True, float(attrs["eps"]),
        [grad_mask(attrs), bool(params), bool(params)])
    return KernelResult(gx, grads=[gw, gb] if params else [])


# -- pooling ------------------------------------------------------------------------------------------

def _maxpool_args(attrs):
    return (_pair(attrs["kernel_size"]), _pair(attrs["stride"]), _pair(attrs.get("padding", 0)),
            _pair(attrs.get("dilation", 1)), bool(attrs.get("ceil_mode", False)))


def maxpool_argmax(ctx, inputs, params, attrs):
    values, idx = aten.max_pool2d_with_indices(inputs[0], *_maxpool_args(attrs))
    return KernelResult(idx, scratch=[values])


def maxpool_gather(ctx, inputs, params, attrs):
    x, idx = inputs
    flat = x.reshape(x.shape[0], x.shape[1], -1)
    out = torch.gather(flat, 2, idx.reshape(idx.shape[0], idx.shape[1], -1))
    return KernelResult(out.view(idx.shape))


def maxpool_bwd(ctx, inputs, params, attrs):
    gy, idx = inputs
    gx = aten.max_pool2d_with_indices_backward(
        gy, _shape_dummy(attrs["input_shape"], gy), *_maxpool_args(attrs), idx)
    return KernelResult(gx)


def _avg_args(attrs):
    div = attrs.get("divisor_override")
    return (_pair(attrs["kernel_size"]), _pair(attrs["stride"]), _pair(attrs.get("padding", 0)),
            bool(attrs.get("ceil_mode", False)), bool(attrs.get("count_include_pad", True)),
            None if div is None else int(div))


def avg_pool2d(ctx, inputs, params, attrs):
    return KernelResult(aten.avg_pool2d(inputs[0], *_avg_args(attrs)))


def avg_pool2d_bwd(ctx, inputs, params, attrs):
    (gy,) = inputs
    return KernelResult(aten.avg_pool2d_backward(gy, _shape_dummy(attrs["input_shape"], gy), *_avg_args(attrs)))


def _adaptive_size(attrs, in_shape) -> list[int]:
    size = attrs["output_size"]
    size = [size, size] if isinstance(size, int) else list(size)
    return [in_shape[-2 + i] if s is None else int(s) for i, s in enumerate(size)]


def adaptive_avg_pool2d(ctx, inputs, params, attrs):
    """As aten::adaptive_avg_pool2d: a 1x1 output is mean over (H, W); other sizes the pooling kernel."""
    (x,) = inputs
    size = _adaptive_size(attrs, x.shape)
    if size == [1, 1]:
        return KernelResult(x.mean([-1, -2], keepdim=True))
    return KernelResult(aten._adaptive_avg_pool2d(x, size))


def adaptive_avg_pool2d_bwd(ctx, inputs, params, attrs):
    (gy,) = inputs
    in_shape = list(attrs["input_shape"])
    if _adaptive_size(attrs, in_shape) == [1, 1]:  # mean_backward: expand, then divide by the count
        return KernelResult(gy.expand(in_shape) / (in_shape[-1] * in_shape[-2]))
    return KernelResult(aten._adaptive_avg_pool2d_backward(gy, _shape_dummy(in_shape, gy)))


# -- structure ----------------------------------------------------------------------------------------

def add(ctx, inputs, params, attrs):
    a, b = inputs
    return KernelResult(a + b)


def cat(ctx, inputs, params, attrs):
    return KernelResult(torch.cat(list(inputs), dim=int(attrs["dim"])))


def grad_sum(ctx, inputs, params, attrs):
    """Sum of gradient contributions, left to right."""
    out = inputs[0] + inputs[1] if len(inputs) > 1 else inputs[0].clone()
    for g in inputs[2:]:
        out = out + g
    return KernelResult(out)


# -- dropout ------------------------------------------------------------------------------------------

def _mix_seed(*values: int) -> int:
    """splitmix64-style combination of integers into one 63-bit generator seed."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (int(v) & _MASK64)) & _MASK64
        h = (h * 0xBF58476D1CE4E5B9) & _MASK64
        h ^= h >> 31
        h = (h * 0x94D049BB133111EB) & _MASK64
        h ^= h >> 29
    return h & ((1 << 63) - 1)


def dropout_mask(shape, p: float, seed: int, step: int, seed_id: int, device) -> Tensor:
    """The keep-mask (bool) of one dropout node in one step; the same arguments always give the same mask."""
    device = torch.device(device)
    g = torch.Generator(device=device)
    g.manual_seed(_mix_seed(seed, step, seed_id))
    return torch.rand(tuple(shape), generator=g, device=device) >= p


def dropout_apply(x: Tensor, mask: Tensor, p: float) -> Tensor:
    return (x * mask.to(x.dtype)) * (1.0 / (1.0 - p))


def _dropout_p(attrs) -> float:
    p = float(attrs["p"])
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout p must be in [0, 1), got {p}")
    return p


def dropout(ctx, inputs, params, attrs):
    (x,) = inputs
    p = _dropout_p(attrs)
    mask = dropout_mask(x.shape, p, ctx.seed, ctx.step, int(attrs["seed_id"]), x.device)
    return KernelResult(dropout_apply(x, mask, p))


def dropout_bwd(ctx, inputs, params, attrs):
    """Autograd of dropout_apply: (gy * scale) * mask."""
    (gy,) = inputs
    p = _dropout_p(attrs)
    mask = dropout_mask(attrs["input_shape"], p, ctx.seed, ctx.step, int(attrs["seed_id"]), gy.device)
    return KernelResult((gy * (1.0 / (1.0 - p))) * mask.to(gy.dtype))


# -- losses -------------------------------------------------------------------------------------------

def _log_softmax_nll(logits, labels):
    lsm = aten._log_softmax(logits, 1, False)
    loss, total_weight = aten.nll_loss_forward(lsm, labels, None, MEAN, IGNORE_INDEX)
    return lsm, loss, total_weight


def cross_entropy(ctx, inputs, params, attrs):
    logits, labels = inputs
    _, loss, _ = _log_softmax_nll(logits, labels)
    return KernelResult(loss)


def cross_entropy_bwd(ctx, inputs, params, attrs):
    """Gradient of the mean cross-entropy wrt the logits (the loss gradient is 1)."""
    logits, labels = inputs
    lsm, loss, total_weight = _log_softmax_nll(logits, labels)
    g_lsm = aten.nll_loss_backward(torch.ones_like(loss), lsm, labels, None, MEAN, IGNORE_INDEX, total_weight)
    return KernelResult(aten._log_softmax_backward_data(g_lsm, lsm, 1, logits.dtype))


def mse(ctx, inputs, params, attrs):
    pred, target = inputs
    return KernelResult(aten.mse_loss(pred, target, MEAN))


def mse_bwd(ctx, inputs, params, attrs):
    pred, target = inputs
    one = torch.ones((), dtype=pred.dtype, device=pred.device)
    return KernelResult(aten.mse_loss_backward(one, pred, target, MEAN))


KERNELS: dict[str, Kernel] = {**TRANSFORMER_KERNELS, **{f.__name__: f for f in (
    conv2d, conv2d_bwd, linear, linear_bwd, relu, relu_bwd, relu6, relu6_bwd, batch_norm, batch_norm_bwd,
    maxpool_argmax, maxpool_gather, maxpool_bwd, avg_pool2d, avg_pool2d_bwd, adaptive_avg_pool2d,
    adaptive_avg_pool2d_bwd, add, cat, grad_sum, dropout, dropout_bwd, cross_entropy, cross_entropy_bwd,
    mse, mse_bwd,
)}}
