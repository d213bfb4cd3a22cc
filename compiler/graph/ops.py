"""The op registry: for every forward kernel, its FLOPs, what its backward kernel reads, and its memory.

This is the one place where these facts live. Shapes come from running the model once (torch is the shape
rule for forward ops; a gradient has the shape of what it differentiates). Kernel names are the contract
with `runtime/python/kernels.py`, which implements each name once.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Callable

Shape = tuple[int, ...]
FlopRule = Callable[[list[Shape], Shape, dict], int]

# SGD with momentum and weight decay per parameter element: d = g + wd*p; buf = m*buf + d; p -= lr*buf.
SGD_FLOPS_PER_ELEMENT = 6


def _numel(s: Shape) -> int:
    return prod(s) if s else 1


def _conv_core(ins: list[Shape], out: Shape, a: dict) -> int:
    cin = ins[0][1]
    kh, kw = a["kernel_size"]
    return 2 * _numel(out) * (cin // a["groups"]) * kh * kw


def _linear_core(ins: list[Shape], out: Shape, a: dict) -> int:
    return 2 * _numel(out) * ins[0][-1]


def _pool_window(a: dict) -> int:
    k = a["kernel_size"]
    return k[0] * k[1]


@dataclass(frozen=True)
class OpRule:
    """What the compiler knows about one forward kernel."""

    name: str
    flops: FlopRule
    # Backward kernel taking (grad_out, *saved) and returning the gradient of input 0 (if it needs one)
    # plus the gradients of the node's parameters, which it applies at once (fused SGD).
    backward: str | None = None
    saved: tuple[str, ...] = ()  # operands after grad_out: "in<k>" (a forward input) or "out"
    # Gradient of input 0 costs this many FLOPs; the parameter gradient costs `param_grad_flops`.
    input_grad_flops: FlopRule | None = None
    param_grad_flops: FlopRule | None = None
    # Ops whose input gradients are views of the output gradient (add, cat): no backward kernel at all.
    grad_views: Callable[[list[Shape], Shape, dict], list[tuple]] | None = None
    nondiff_inputs: tuple[int, ...] = ()  # inputs that never receive a gradient (indices, labels)
    aux_bytes: Callable[[list[Shape], Shape, dict], int] | None = None
    scratch_bytes: Callable[[list[Shape], Shape, dict], int] | None = None
    out_dtype: str = "float32"
    is_loss: bool = False
    # Inputs whose gradients the backward kernel returns. More than one (attention, matmul): it returns a tuple
    # of all of them, held as one tensor of their summed size and read through ("item", k) views.
    grad_inputs: tuple[int, ...] = (0,)
    # Transient bytes of the backward kernel beyond its output (matmul: its results before they are copied
    # into the operands' layouts).
    bwd_scratch_bytes: Callable[[list[Shape], Shape, dict], int] | None = None


def _add_views(ins, out, a):
    return [() for _ in ins]


def _cat_views(ins, out, a):
    dim, start, views = a["dim"], 0, []
    for s in ins:
        views.append((("narrow", dim, start, s[dim]),))
        start += s[dim]
    return views


def _ln_rows(i, o, a) -> int:
    return _numel(o) // _numel(tuple(a["normalized_shape"]))


def _attn_core(i, o, a) -> int:
    """QK^T and PV: 2 * 2*B*H*T*S*d multiply-adds, plus the softmax over B*H*T*S scores."""
    b_h_t, s, d = _numel(i[0][:-1]), i[1][-2], i[0][-1]
    return 4 * b_h_t * s * d + 5 * b_h_t * s


def _matmul_core(i, o, a) -> int:
    return 2 * _numel(o) * i[0][-1]


# Transformer ops (kernels: runtime/python/transformer_kernels.py).
TRANSFORMER_RULES = [
    OpRule("embedding", flops=lambda i, o, a: _numel(o), backward="embedding_bwd", saved=("in0",),
           param_grad_flops=lambda i, o, a: _numel(o), nondiff_inputs=(0,)),
    OpRule("arange", flops=lambda i, o, a: _numel(o), out_dtype="int64"),
    OpRule("layer_norm", flops=lambda i, o, a: 8 * _numel(o), backward="layer_norm_bwd", saved=("in0",),
           input_grad_flops=lambda i, o, a: 9 * _numel(o), param_grad_flops=lambda i, o, a: 3 * _numel(o),
           aux_bytes=lambda i, o, a: 2 * _ln_rows(i, o, a) * 4),  # aux: the saved mean and rstd per row
    OpRule("gelu", flops=lambda i, o, a: 8 * _numel(o), backward="gelu_bwd", saved=("in0",),
           input_grad_flops=lambda i, o, a: 10 * _numel(o)),
    OpRule("tanh", flops=lambda i, o, a: 4 * _numel(o), backward="tanh_bwd", saved=("out",),
           input_grad_flops=lambda i, o, a: 3 * _numel(o)),
    OpRule("softmax", flops=lambda i, o, a: 5 * _numel(o), backward="softmax_bwd", saved=("out",),
           input_grad_flops=lambda i, o, a: 4 * _numel(o)),
    # Flash attention: the backward reads q, k, v, out and the logsumexp (aux), recomputes the scores, and
    # returns the gradients of q, k and v.
    OpRule("sdpa", flops=_attn_core, backward="sdpa_bwd", saved=("in0", "in1", "in2", "out"),
           input_grad_flops=lambda i, o, a: 2 * _attn_core(i, o, a) + 2 * _numel(i[0][:-1]) * i[1][-2],
           aux_bytes=lambda i, o, a: _numel(i[0][:-1]) * 4, grad_inputs=(0, 1, 2)),
    OpRule("matmul", flops=_matmul_core, backward="matmul_bwd", saved=("in0", "in1"),
           input_grad_flops=lambda i, o, a: 2 * _matmul_core(i, o, a), grad_inputs=(0, 1),
           bwd_scratch_bytes=lambda i, o, a: 4 * (_numel(i[0]) + _numel(i[1]))),
    OpRule("scale", flops=lambda i, o, a: _numel(o), backward="scale_bwd",
           input_grad_flops=lambda i, o, a: _numel(o)),
    OpRule("slice", flops=lambda i, o, a: _numel(o), backward="slice_bwd",
           input_grad_flops=lambda i, o, a: _numel(i[0])),
    OpRule("expand", flops=lambda i, o, a: _numel(o), backward="expand_bwd",
           input_grad_flops=lambda i, o, a: _numel(o)),
    OpRule("copy", flops=lambda i, o, a: _numel(o), backward="copy_bwd", input_grad_flops=lambda i, o, a: _numel(o)),
]

_RULES = [
    OpRule("input", flops=lambda i, o, a: 0),
    OpRule("labels", flops=lambda i, o, a: 0),
    OpRule(
        "conv2d",
        flops=lambda i, o, a: _conv_core(i, o, a) + (_numel(o) if a["bias"] else 0),
        backward="conv2d_bwd",
        saved=("in0",),
        input_grad_flops=_conv_core,
        param_grad_flops=lambda i, o, a: _conv_core(i, o, a) + (_numel(o) if a["bias"] else 0),
    ),
    OpRule(
        "linear",
        flops=lambda i, o, a: _linear_core(i, o, a) + (_numel(o) if a["bias"] else 0),
        backward="linear_bwd",
        saved=("in0",),
        input_grad_flops=_linear_core,
        param_grad_flops=lambda i, o, a: _linear_core(i, o, a) + (_numel(o) if a["bias"] else 0),
    ),
    OpRule("relu", flops=lambda i, o, a: _numel(o), backward="relu_bwd", saved=("out",),
           input_grad_flops=lambda i, o, a: _numel(o)),
    OpRule("relu6", flops=lambda i, o, a: 2 * _numel(o), backward="relu6_bwd", saved=("out",),
           input_grad_flops=lambda i, o, a: 2 * _numel(o)),
    OpRule(
        "batch_norm",
        flops=lambda i, o, a: 7 * _numel(o),
        backward="batch_norm_bwd",
        saved=("in0",),  # plus its aux: the saved mean and inverse std
        input_grad_flops=lambda i, o, a: 9 * _numel(o),
        param_grad_flops=lambda i, o, a: 3 * _numel(o),
        aux_bytes=lambda i, o, a: 2 * o[1] * 4,
    ),
    # Max-pool is lowered to two nodes so that backward keeps only the argmax, never the values.
    OpRule(
        "maxpool_argmax",
        flops=lambda i, o, a: _numel(o) * _pool_window(a),
        nondiff_inputs=(0,),
        scratch_bytes=lambda i, o, a: _numel(o) * 4,  # the pooled values, dropped at once
        out_dtype="int64",
    ),
    OpRule("maxpool_gather", flops=lambda i, o, a: _numel(o), backward="maxpool_bwd", saved=("in1",),
           input_grad_flops=lambda i, o, a: _numel(o), nondiff_inputs=(1,)),
    OpRule("avg_pool2d", flops=lambda i, o, a: _numel(o) * _pool_window(a), backward="avg_pool2d_bwd",
           input_grad_flops=lambda i, o, a: _numel(i[0])),
    OpRule("adaptive_avg_pool2d", flops=lambda i, o, a: _numel(i[0]), backward="adaptive_avg_pool2d_bwd",
           input_grad_flops=lambda i, o, a: _numel(i[0])),
    OpRule("add", flops=lambda i, o, a: _numel(o), grad_views=_add_views),
    OpRule("cat", flops=lambda i, o, a: _numel(o), grad_views=_cat_views),
    # The mask is regenerated from a per-node seed, so dropout saves nothing and recomputes exactly.
    OpRule("dropout", flops=lambda i, o, a: 3 * _numel(o), backward="dropout_bwd",
           input_grad_flops=lambda i, o, a: 3 * _numel(o)),
    OpRule("cross_entropy", flops=lambda i, o, a: 5 * _numel(i[0]), backward="cross_entropy_bwd",
           saved=("in0", "in1"), input_grad_flops=lambda i, o, a: 4 * _numel(i[0]), nondiff_inputs=(1,),
           is_loss=True),
    OpRule("mse", flops=lambda i, o, a: 3 * _numel(i[0]), backward="mse_bwd", saved=("in0", "in1"),
           input_grad_flops=lambda i, o, a: 3 * _numel(i[0]), nondiff_inputs=(1,), is_loss=True),
]

OPS: dict[str, OpRule] = {r.name: r for r in _RULES + TRANSFORMER_RULES}

# Backward-only kernels the lowering emits, with their FLOPs (element-wise sums).
GRAD_SUM = "grad_sum"


def grad_sum_flops(shape: Shape, n_inputs: int) -> int:
    return _numel(shape) * (n_inputs - 1)


def sgd_flops(param_shapes: list[Shape]) -> int:
    return SGD_FLOPS_PER_ELEMENT * sum(_numel(s) for s in param_shapes)
