"""One C kernel call per aten op of the training graph: the emitters, keyed by the ops of the C op table.

Each emitter gets the op bound to its schema's argument names (`OpCase`): tensors as meta tensors whose
storage offset is their place in the arena (in 4-byte words), parameters as {"param", "t"}. It returns the
C statements. The table (`ops.py`) already refused every case these do not cover.
"""
from __future__ import annotations

from math import prod
from typing import Callable

import torch

from edgetrain.compiler.frontend import dropout_mask
from .names import c_comment, c_float
from .ops import (DROPOUT, DROPOUT_BACKWARD, LAYER_NORM, OpCase, cat_updates, is_counter, layer_norm_rows,
                  mean_backward_planes, mm_kind, mul_kind, sum_kind, div_kind)

EMITTERS: dict[str, Callable] = {}


def emits(op: str):
    def register(fn):
        EMITTERS[op] = fn
        return fn
    return register


class EmitError(Exception):
    """A case the emitters cannot write (the table should have refused it first)."""


def _numel(t) -> int:
    return prod(t.shape) if t.dim() else 1


class Context:
    """What an emitter needs besides its op: parameter identifiers, kernel shape structs, the step's loss."""

    def __init__(self, pident: dict[str, str], mident: dict[str, str], struct: Callable[[str, str, dict], str]):
        self.pident, self.mident, self.struct = pident, mident, struct  # pident: parameters' and buffers'
        self.first = True  # the node's first computation in the step: buffers are updated then, not on recompute
        self.predict = False  # inference (et_predict): batch norm normalizes with its running statistics

    def ptr(self, t) -> str:
        """A C pointer to a tensor operand (contiguous, or a kernel that knows its layout)."""
        if isinstance(t, dict):  # a parameter or buffer; through a view (rows [c0:c1] of it), at the view's offset
            ident = self.pident[t.get("param") or t["buffer"]]
            at = t["t"].storage_offset() if t.get("view") else 0
            return f"({ident} + {at})" if at else ident
        macro = "ET_I" if t.dtype == torch.int32 else "ET_F"
        return f"{macro}({t.storage_offset()})"

    def contiguous(self, t, what: str) -> str:
        if not isinstance(t, dict) and not t.is_contiguous():
            raise EmitError(f"{what} is not contiguous in the arena")
        return self.ptr(t)

    def param(self, a) -> str:
        return "NULL" if a is None else self.ptr(a)

    def mom(self, name: str | None) -> str:
        return self.mident.get(name, "NULL") if name else "NULL"


def _updated(c: OpCase, item) -> str | None:
    return next((u["param"] for u in c.updates if u.get("item") == item), None)


def _pair(v, default) -> list[int]:
    v = list(v) if v else list(default)
    return v * 2 if len(v) == 1 else v


# -- convolution ---------------------------------------------------------------------------------------------

def conv_shape(x_shape, w_shape, y_shape, a: dict) -> dict:
    k = list(w_shape[2:])
    stride, pad, dil = _pair(a["stride"], [1]), _pair(a["padding"], [0]), _pair(a["dilation"], [1])
    return dict(n=x_shape[0], c_in=x_shape[1], h_in=x_shape[2], w_in=x_shape[3], c_out=y_shape[1], h_out=y_shape[2],
                w_out=y_shape[3], k_h=k[0], k_w=k[1], stride_h=stride[0], stride_w=stride[1], pad_h=pad[0],
                pad_w=pad[1], dil_h=dil[0], dil_w=dil[1], groups=a["groups"])


@emits("aten.convolution.default")
def _conv(c: OpCase, ctx: Context, out) -> list[str]:
    a = c.args
    x, w = a["input"], a["weight"]
    k = ctx.struct("et_conv2d_shape", w["param"], conv_shape(x.shape, w["t"].shape, out.shape, a))
    return [f"et_conv2d_forward({k}, {ctx.contiguous(x, 'the input')}, {ctx.param(w)}, {ctx.param(a['bias'])}, "
            f"{ctx.ptr(out)});"]


@emits("aten.convolution_backward.default")
def _conv_bwd(c: OpCase, ctx: Context, out) -> list[str]:
    a = c.args
    gy, w = a["grad_output"], a["weight"]
    k = ctx.struct("et_conv2d_shape", w["param"], None)  # the forward's, by the weight they share
    lines = []
    if a["output_mask"][0] and out is not None:  # first: it reads the weights before the update
        if w.get("view"):  # a block of a head's weight rows: its own shapes, not the weight's first reader's
            k = ctx.struct("et_conv2d_shape", w["param"], conv_shape(out.shape, w["t"].shape, gy.shape, a))
        lines.append(f"et_conv2d_backward_input({k}, {ctx.contiguous(gy, 'the output gradient')}, {ctx.param(w)}, "
                     f"{ctx.ptr(out)});")
    wname, bname = _updated(c, 1), _updated(c, 2)
    if wname or bname:
        x = a["input"] if wname else None
        lines.append(f"et_conv2d_wgrad_sgd({k}, {ctx.contiguous(gy, 'the output gradient')}, "
                     f"{ctx.contiguous(x, 'the input') if x is not None else 'NULL'}, &et_sgd, "
                     f"{ctx.pident[wname] if wname else 'NULL'}, {ctx.mom(wname)}, "
                     f"{ctx.pident[bname] if bname else 'NULL'}, {ctx.mom(bname)});")
    return lines


# -- linear layers -------------------------------------------------------------------------------------------

@emits("aten.addmm.default")
def _addmm(c: OpCase, ctx: Context, out) -> list[str]:
    a = c.args
    x, w = a["mat1"], a["mat2"]
    n, fin = x.shape
    return [f"et_linear_forward({n}, {fin}, {out.shape[1]}, {ctx.contiguous(x, 'the input')}, {ctx.param(w)}, "
            f"{ctx.param(a['self'])}, {ctx.ptr(out)});"]


@emits("aten.mm.default")
def _mm(c: OpCase, ctx: Context, out) -> list[str]:
    a, b = c.args["self"], c.args["mat2"]
    kind = mm_kind(c)
    if kind == "forward":
        n, fin = a.shape
        return [f"et_linear_forward({n}, {fin}, {out.shape[1]}, {ctx.ptr(a)}, {ctx.param(b)}, NULL, {ctx.ptr(out)});"]
    if kind == "input_grad":  # gx = gy @ W
        n, fout = a.shape
        return [f"et_linear_backward_input({n}, {b['t'].shape[1]}, {fout}, {ctx.ptr(a)}, {ctx.param(b)}, "
                f"{ctx.ptr(out)});"]
    if kind == "weight_grad":  # W -= lr * (gy.t() @ x), fused
        fout, n = a.shape
        w = c.updates[0]["param"]
        return [f"et_linear_wgrad_sgd({n}, {b.shape[1]}, {fout}, {ctx.ptr(a)}, {ctx.ptr(b)}, &et_sgd, "
                f"{ctx.pident[w]}, {ctx.mom(w)}, NULL, NULL);"]
    raise EmitError("a matrix product that is not part of a linear layer")


@emits("aten.sum.dim_IntList")
def _sum(c: OpCase, ctx: Context, out) -> list[str]:
    x = c.args["self"]
    if sum_kind(c) == "planes":
        n, ch, h, w = x.shape
        return [f"et_sum_planes({n * ch}, {h * w}, {ctx.ptr(x)}, {ctx.ptr(out)});"]
    gy = x  # a linear layer's bias gradient, applied at once
    n, fout = gy.shape
    b = c.updates[0]["param"]
    return [f"et_linear_wgrad_sgd({n}, 0, {fout}, {ctx.contiguous(gy, 'the output gradient')}, NULL, &et_sgd, "
            f"NULL, NULL, {ctx.pident[b]}, {ctx.mom(b)});"]


# -- elementwise ---------------------------------------------------------------------------------------------

# aten op -> (kernel, the tensor arguments it reads in order, its literal arguments after them): each kernel
# takes (count, tensors..., literals..., out) over contiguous floats.
ELEMENTWISE: dict[str, tuple[str, tuple[str, ...], Callable[[dict], list[str]] | None]] = {
    "aten.relu.default": ("et_relu_forward", ("self",), None),
    "aten.threshold_backward.default": ("et_relu_backward", ("grad_output", "self"), None),
    "aten.hardtanh.default": ("et_relu6_forward", ("self",), None),
    "aten.hardtanh_backward.default": ("et_relu6_backward", ("grad_output", "self"), None),
    "aten.sigmoid.default": ("et_sigmoid_forward", ("self",), None),
    "aten.sigmoid_backward.default": ("et_sigmoid_backward", ("grad_output", "output"), None),
    "aten.hardsigmoid.default": ("et_hardsigmoid_forward", ("self",), None),
    "aten.hardsigmoid_backward.default": ("et_hardsigmoid_backward", ("grad_output", "self"), None),
    "aten.hardswish.default": ("et_hardswish_forward", ("self",), None),
    "aten.hardswish_backward.default": ("et_hardswish_backward", ("grad_output", "self"), None),
    "aten.silu.default": ("et_silu_forward", ("self",), None),
    "aten.silu_backward.default": ("et_silu_backward", ("grad_output", "self"), None),
    "aten.leaky_relu.default": ("et_leaky_relu_forward", ("self",), lambda a: [c_float(a["negative_slope"])]),
    "aten.leaky_relu_backward.default": ("et_leaky_relu_backward", ("grad_output", "self"),
                                         lambda a: [c_float(a["negative_slope"])]),
    "aten.gelu.default": ("et_gelu_forward", ("self",), lambda a: [str(int(a["approximate"] == "tanh"))]),
    "aten.gelu_backward.default": ("et_gelu_backward", ("grad_output", "self"),
                                   lambda a: [str(int(a["approximate"] == "tanh"))]),
    "aten.sub.Tensor": ("et_sub_forward", ("self", "other"), None),
    "aten.add.Scalar": ("et_add_scalar", ("self",), lambda a: [c_float(a["other"])]),
}


def _elementwise(kernel: str, reads: tuple[str, ...], literals):
    def emit(c: OpCase, ctx: Context, out) -> list[str]:
        args = [ctx.contiguous(c.args[name], f"`{name}`") for name in reads] + (literals(c.args) if literals else [])
        return [f"{kernel}({_numel(out)}, {', '.join(args)}, {ctx.ptr(out)});"]
    return emit


for _op, (_kernel, _reads, _literals) in ELEMENTWISE.items():
    emits(_op)(_elementwise(_kernel, _reads, _literals))


@emits("aten.mul.Tensor")
def _mul(c: OpCase, ctx: Context, out) -> list[str]:
    a, b = c.args["self"], c.args["other"]
    if mul_kind(c) == "same":
        return [f"et_mul_forward({_numel(out)}, {ctx.contiguous(a, 'a factor')}, {ctx.contiguous(b, 'a factor')}, "
                f"{ctx.ptr(out)});"]
    x, s = (a, b) if a.numel() >= b.numel() else (b, a)
    n, ch, h, w = x.shape
    return [f"et_mul_bcast_forward({n * ch}, {h * w}, {ctx.contiguous(x, 'a factor')}, "
            f"{ctx.contiguous(s, 'the scale')}, {ctx.ptr(out)});"]


def _dropout_call(kernel: str, c: OpCase, ctx: Context, x, p: float, scale: float, out) -> list[str]:
    key = c.node_attrs["seed_key"]
    stream = f"et_dropout_stream(ET_SEED, et_step, {dropout_mask.key_hash(key)}u /* {c_comment(key)} */)"
    return [f"{kernel}({_numel(out)}, {ctx.contiguous(x, 'the input')}, {stream}, {dropout_mask.threshold(p)}u, "
            f"{c_float(scale)}, {ctx.ptr(out)});"]


@emits(DROPOUT)
def _dropout(c: OpCase, ctx: Context, out) -> list[str]:
    x, p = c.args["input"], c.args["p"]
    if ctx.predict:  # inference: the identity
        return [f"memmove({ctx.ptr(out)}, {ctx.contiguous(x, 'the input')}, {4 * _numel(out)}u);"]
    return _dropout_call("et_dropout_forward", c, ctx, x, p, dropout_mask.scale(p), out)


@emits(DROPOUT_BACKWARD)
def _dropout_bwd(c: OpCase, ctx: Context, out) -> list[str]:  # the forward's mask, redrawn
    return _dropout_call("et_dropout_backward", c, ctx, c.args["grad_output"], c.node_attrs["dropout_p"],
                         c.args["scale"], out)


@emits("aten.add.Tensor")
def _add(c: OpCase, ctx: Context, out) -> list[str]:
    a, b = c.args["self"], c.args["other"]
    if is_counter(c):  # batch norm's num_batches_tracked, once per step
        return [f"{ctx.ptr(a)}[0] += 1; /* {c_comment(a['buffer'])}: one more batch seen */"] if ctx.first else []
    return [f"et_add_forward({_numel(out)}, {ctx.contiguous(a, 'an addend')}, {ctx.contiguous(b, 'an addend')}, "
            f"{ctx.ptr(out)});"]


@emits("aten.div.Tensor")
def _div(c: OpCase, ctx: Context, out) -> list[str]:
    a, b = c.args["self"], c.args["other"]
    if div_kind(c) == "scalar":
        return [f"et_div_scalar({_numel(out)}, {ctx.contiguous(a, 'the dividend')}, {c_float(b)}, {ctx.ptr(out)});"]
    return [f"et_div_forward({_numel(out)}, {ctx.contiguous(a, 'the dividend')}, {ctx.contiguous(b, 'the divisor')}, "
            f"{ctx.ptr(out)});"]


@emits("aten.slice_backward.default")
def _slice_bwd(c: OpCase, ctx: Context, out) -> list[str]:
    a = c.args
    shape, gy = out.shape, a["grad_output"]
    hw = prod(shape[2:]) if len(shape) > 2 else 1
    start = max(0, a["start"] + (shape[1] if a["start"] < 0 else 0))
    return [f"et_fill({_numel(out)}, 0.0f, {ctx.ptr(out)});",
            f"et_concat_forward_part({shape[0]}, {hw}, {shape[1]}, {start}, {gy.shape[1]}, "
            f"{ctx.contiguous(gy, 'the gradient')}, {ctx.ptr(out)});"]


@emits("aten.empty_like.default")
def _empty_like(c: OpCase, ctx: Context, out) -> list[str]:
    return ["/* empty_like: its place in the arena is all it makes */"]


@emits("aten.clone.default")
def _clone(c: OpCase, ctx: Context, out) -> list[str]:
    return [f"memmove({ctx.ptr(out)}, {ctx.contiguous(c.args['self'], 'the input')}, {4 * _numel(out)}u);"]


@emits("aten.new_empty_strided.default")
def _new_empty(c: OpCase, ctx: Context, out) -> list[str]:
    return ["/* new_empty_strided: its place in the arena is all it makes */"]


@emits("aten.copy.default")
def _copy(c: OpCase, ctx: Context, out) -> list[str]:  # the source's values in the destination's shape
    return [f"memmove({ctx.ptr(out)}, {ctx.contiguous(c.args['src'], 'the source')}, {4 * _numel(out)}u);"]


@emits("aten.fill.Scalar")
def _fill(c: OpCase, ctx: Context, out) -> list[str]:
    return [f"et_fill({_numel(out)}, {c_float(c.args['value'])}, {ctx.ptr(out)});"]


@emits("aten.cat.default")
def _cat(c: OpCase, ctx: Context, out) -> list[str]:
    param = cat_updates(c)
    if param is not None:  # a gradient made by blocks of rows: each block's rows updated by SGD where it lies
        lines, at, mom = [], 0, ctx.mom(param)
        for g in c.args["tensors"]:
            lines.append(f"et_sgd_step(&et_sgd, {_numel(g)}, {ctx.pident[param]} + {at}, "
                         f"{ctx.contiguous(g, 'a gradient block')}, {mom if mom == 'NULL' else f'{mom} + {at}'});")
            at += _numel(g)
        return lines
    shape = out.shape
    hw = prod(shape[2:]) if len(shape) > 2 else 1
    lines, at = [], 0
    for x in c.args["tensors"]:
        lines.append(f"et_concat_forward_part({shape[0]}, {hw}, {shape[1]}, {at}, {x.shape[1]}, "
                     f"{ctx.contiguous(x, 'a part')}, {ctx.ptr(out)});")
        at += x.shape[1]
    return lines


# -- pooling -------------------------------------------------------------------------------------------------

def pool_shape(x_shape, y_shape, a: dict, dilation: bool) -> dict:
    k = _pair(a["kernel_size"], [1])
    stride, pad = _pair(a["stride"], k), _pair(a["padding"], [0])
    dil = _pair(a.get("dilation"), [1]) if dilation else [1, 1]
    return dict(n=x_shape[0], c=x_shape[1], h_in=x_shape[2], w_in=x_shape[3], h_out=y_shape[2], w_out=y_shape[3],
                k_h=k[0], k_w=k[1], stride_h=stride[0], stride_w=stride[1], pad_h=pad[0], pad_w=pad[1],
                dil_h=dil[0], dil_w=dil[1], count_include_pad=int(bool(a.get("count_include_pad", False))))


@emits("aten.max_pool2d_with_indices.default")
def _maxpool(c: OpCase, ctx: Context, out) -> list[str]:
    x = c.args["self"]
    k = ctx.struct("et_pool2d_shape", None, pool_shape(x.shape, out.shape, c.args, True))
    y, idx = (ctx.ptr(out), "NULL") if out.dtype != torch.int32 else ("NULL", ctx.ptr(out))
    return [f"et_maxpool2d_forward({k}, {ctx.contiguous(x, 'the input')}, {y}, {idx});"]


@emits("aten.max_pool2d_with_indices_backward.default")
def _maxpool_bwd(c: OpCase, ctx: Context, out) -> list[str]:
    gy, idx = c.args["grad_output"], c.args["indices"]
    k = ctx.struct("et_pool2d_shape", None, pool_shape(out.shape, gy.shape, c.args, True))
    return [f"et_maxpool2d_backward({k}, {ctx.contiguous(gy, 'the output gradient')}, "
            f"{ctx.contiguous(idx, 'the indices')}, {ctx.ptr(out)});"]


@emits("aten.avg_pool2d.default")
def _avgpool(c: OpCase, ctx: Context, out) -> list[str]:
    x = c.args["self"]
    k = ctx.struct("et_pool2d_shape", None, pool_shape(x.shape, out.shape, c.args, False))
    return [f"et_avgpool2d_forward({k}, {ctx.contiguous(x, 'the input')}, {ctx.ptr(out)});"]


@emits("aten.avg_pool2d_backward.default")
def _avgpool_bwd(c: OpCase, ctx: Context, out) -> list[str]:
    gy = c.args["grad_output"]
    k = ctx.struct("et_pool2d_shape", None, pool_shape(out.shape, gy.shape, c.args, False))
    return [f"et_avgpool2d_backward({k}, {ctx.contiguous(gy, 'the output gradient')}, {ctx.ptr(out)});"]


@emits("aten.mean.dim")
def _mean_hw(c: OpCase, ctx: Context, out) -> list[str]:
    x = c.args["self"]
    n, ch, h, w = x.shape
    return [f"et_global_avgpool_forward({n}, {ch}, {h * w}, {ctx.contiguous(x, 'the input')}, {ctx.ptr(out)});"]


@emits("aten.div.Scalar")
def _mean_hw_bwd(c: OpCase, ctx: Context, out) -> list[str]:
    gy = c.args["self"]  # the output gradient expanded over each plane: its pointer is the unexpanded one
    n, ch = gy.shape[:2]
    if mean_backward_planes(c) is None:
        raise EmitError("a division that is not a mean's backward")
    hw = gy.shape[2] * gy.shape[3]
    if n == 1 or gy.stride()[0] == ch:
        return [f"et_global_avgpool_backward({n}, {ch}, {hw}, {ctx.ptr(gy)}, {ctx.ptr(out)});"]
    # a block of channels of a batch's gradient (a CNN head by channel blocks): sample by sample
    at, y = gy.storage_offset(), out.storage_offset()
    return [f"et_global_avgpool_backward(1, {ch}, {hw}, ET_F({at + s * gy.stride()[0]}), ET_F({y + s * ch * hw}));"
            for s in range(n)]


# -- batch norm ----------------------------------------------------------------------------------------------

def _planes(x) -> tuple[int, int, int]:
    """(n, c, hw) of an (N, C, ...) tensor."""
    n, ch = x.shape[:2]
    return n, ch, (_numel(x) // (n * ch)) if n * ch else 0


@emits("aten._native_batch_norm_legit_functional.default")
def _batch_norm(c: OpCase, ctx: Context, out) -> list[str]:
    a = c.args
    x, w, b = a["input"], a["weight"], a["bias"]
    n, ch, hw = _planes(x)
    rm, rv = ctx.ptr(a["running_mean"]), ctx.ptr(a["running_var"])
    xp = ctx.contiguous(x, "the input")
    if ctx.predict:  # inference normalizes with the running statistics
        return [f"et_batch_norm_eval({n}, {ch}, {hw}, {xp}, {ctx.param(w)}, {ctx.param(b)}, {rm}, {rv}, "
                f"{float(a['eps'])!r}, {ctx.ptr(out)});"]
    if c.aux is None:
        raise EmitError("a recompute of batch norm after its statistics were freed")
    mean, invstd, var_sum = (ctx.ptr(c.aux[k]) for k in ("mean", "invstd", "var_sum"))
    lines = [f"et_batch_norm_forward({n}, {ch}, {hw}, {xp}, {ctx.param(w)}, {ctx.param(b)}, {float(a['eps'])!r}, "
             f"{ctx.ptr(out)}, {mean}, {invstd}, {var_sum if ctx.first else 'NULL'});"]
    if ctx.first and c.buffer_updates:  # once per step: a recompute leaves the running statistics alone
        lines.append(f"et_batch_norm_update_running_stats({ch}, {n * hw}, {c_float(a['momentum'])}, {mean}, "
                     f"{var_sum}, {rm}, {rv});")
    return lines


@emits("aten.native_batch_norm_backward.default")
def _batch_norm_bwd(c: OpCase, ctx: Context, out) -> list[str]:
    a = c.args
    gy, x, w = a["grad_out"], a["input"], a["weight"]
    n, ch, hw = _planes(x)
    if c.aux is None:
        raise EmitError("batch norm's backward without its statistics")
    mean, invstd = ctx.ptr(c.aux["mean"]), ctx.ptr(c.aux["invstd"])
    gyp, xp = ctx.contiguous(gy, "the output gradient"), ctx.contiguous(x, "the input")
    gx = ctx.ptr(out) if a["output_mask"][0] and out is not None else "NULL"
    wname, bname = _updated(c, 1), _updated(c, 2)
    if not (wname or bname):  # frozen affine parameters: the input gradient alone; or kept gradients (a block's)
        keep = c.node_attrs.get("keep") if isinstance(c.node_attrs.get("keep"), list) else []
        kept = [k for k in keep if k in (1, 2)]
        if kept and kept != [k for k in keep if k != 0]:
            raise EmitError("a batch norm's backward keeping an output it has not")
        # the items kept lie in order in the output: the input gradient (n * ch * hw floats) first where kept
        first = n * ch * hw if 0 in keep else 0
        held = {k: (ctx.ptr(out) if first + j == 0 else f"({ctx.ptr(out)} + {first + j * ch})")
                for j, k in enumerate(kept)}
        if 0 in keep:
            gx = ctx.ptr(out)
        return [f"et_batch_norm_backward({n}, {ch}, {hw}, {gyp}, {xp}, {ctx.param(w)}, {mean}, {invstd}, "
                f"{gx if not kept or 0 in keep else 'NULL'}, {held.get(1, 'NULL')}, {held.get(2, 'NULL')});"]
    sgd = (f"et_batch_norm_backward_sgd({n}, {ch}, {hw}, {gyp}, {xp}, {mean}, {invstd}, &et_sgd, "
           + "{}" + f", {ctx.pident[wname] if wname else 'NULL'}, {ctx.mom(wname)}, "
           f"{ctx.pident[bname] if bname else 'NULL'}, {ctx.mom(bname)});")
    if w is not None and not wname and gx != "NULL":
        # A frozen weight with a trained bias: the bias's update first, then the input gradient (which reads the
        # frozen weight, never the bias), so an input gradient written over its operand is written last.
        return [sgd.format("NULL"), f"et_batch_norm_backward({n}, {ch}, {hw}, {gyp}, {xp}, {ctx.param(w)}, {mean}, "
                                    f"{invstd}, {gx}, NULL, NULL);"]
    return [sgd.format(gx)]


# -- layer norm ----------------------------------------------------------------------------------------------

@emits(LAYER_NORM)
def _layer_norm(c: OpCase, ctx: Context, out) -> list[str]:
    a = c.args
    rows, cols = layer_norm_rows(c)
    # Statistics only where a backward will read them (not in inference, nor where no block is resident).
    mean, rstd = (ctx.ptr(c.aux[k]) if c.aux is not None and not ctx.predict else "NULL" for k in ("mean", "rstd"))
    return [f"et_layer_norm_forward({rows}, {cols}, {ctx.contiguous(a['input'], 'the input')}, "
            f"{ctx.param(a['weight'])}, {ctx.param(a['bias'])}, {float(a['eps'])!r}, {ctx.ptr(out)}, {mean}, {rstd});"]


@emits("aten.native_layer_norm_backward.default")
def _layer_norm_bwd(c: OpCase, ctx: Context, out) -> list[str]:
    a = c.args
    rows, cols = layer_norm_rows(c)
    if c.aux is None:
        raise EmitError("layer norm's backward without its statistics")
    gyp, xp, w = ctx.contiguous(a["grad_out"], "the output gradient"), ctx.contiguous(a["input"], "the input"), \
        a["weight"]
    stats = f"{ctx.ptr(c.aux['mean'])}, {ctx.ptr(c.aux['rstd'])}"
    gx = ctx.ptr(out) if a["output_mask"][0] and out is not None else "NULL"
    wname, bname = _updated(c, 1), _updated(c, 2)
    lines = []
    if w is not None and not wname and gx != "NULL":  # a frozen weight (or nothing trained): gx reads it first
        lines.append(f"et_layer_norm_backward({rows}, {cols}, {gyp}, {xp}, {stats}, {ctx.param(w)}, {gx}, NULL, NULL);")
        gx = "NULL"
    if wname or bname or gx != "NULL":
        lines.append(f"et_layer_norm_backward_sgd({rows}, {cols}, {gyp}, {xp}, {stats}, &et_sgd, {gx}, "
                     f"{ctx.pident[wname] if wname else 'NULL'}, {ctx.mom(wname)}, "
                     f"{ctx.pident[bname] if bname else 'NULL'}, {ctx.mom(bname)});")
    return lines


# -- the loss ------------------------------------------------------------------------------------------------

@emits("aten._log_softmax.default")
def _log_softmax(c: OpCase, ctx: Context, out) -> list[str]:
    x = c.args["self"]
    return [f"et_log_softmax_forward({x.shape[0]}, {x.shape[1]}, {ctx.contiguous(x, 'the scores')}, {ctx.ptr(out)});"]


@emits("aten._log_softmax_backward_data.default")
def _log_softmax_bwd(c: OpCase, ctx: Context, out) -> list[str]:
    gy, y = c.args["grad_output"], c.args["output"]
    return [f"et_log_softmax_backward({y.shape[0]}, {y.shape[1]}, {ctx.contiguous(gy, 'the gradient')}, "
            f"{ctx.contiguous(y, 'the log-probabilities')}, {ctx.ptr(out)});"]


@emits("aten.nll_loss_forward.default")
def _nll(c: OpCase, ctx: Context, out) -> list[str]:
    logp, target = c.args["self"], c.args["target"]
    at = out.storage_offset()  # (loss, total_weight): two words
    return [f"et_nll_loss_forward({logp.shape[0]}, {logp.shape[1]}, {ctx.contiguous(logp, 'the log-probabilities')}, "
            f"{ctx.contiguous(target, 'the labels')}, {c.args['ignore_index']}, ET_F({at}), ET_F({at + 1}));"]


@emits("aten.nll_loss_backward.default")
def _nll_bwd(c: OpCase, ctx: Context, out) -> list[str]:
    a = c.args
    return [f"et_nll_loss_backward({out.shape[0]}, {out.shape[1]}, {ctx.ptr(a['grad_output'])}, "
            f"{ctx.contiguous(a['target'], 'the labels')}, {a['ignore_index']}, {ctx.ptr(a['total_weight'])}, "
            f"{ctx.ptr(out)});"]


@emits("aten.ones_like.default")
def _ones(c: OpCase, ctx: Context, out) -> list[str]:
    n = _numel(out)
    if n == 1:
        return [f"*{ctx.ptr(out)} = 1.0f; /* the loss's gradient with respect to itself */"]
    return [f"for (int i = 0; i < {n}; ++i) {ctx.ptr(out)}[i] = 1.0f;"]


def emit(c: OpCase, ctx: Context, out, where: str) -> list[str]:
    fn = EMITTERS.get(c.op)
    if fn is None:
        raise EmitError(f"op `{c.op}` of {c_comment(where)} has no C kernel")
    return fn(c, ctx, out)
