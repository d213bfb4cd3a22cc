"""The C runtime's op table: which aten ops the C runtime runs, what each kernel reads, the cases it leaves out.

torch knows every op's semantics, shapes and FLOPs; what it does not know is which aten ops the C runtime
(runtime/c) has a kernel for, which operands that kernel reads, and how it holds memory. That is this table,
the one place for it: codegen/c emits a call for each op listed here and for nothing else, and compiles the
kernel sources it names. The pass that fits a training graph to it is `lower.py`; ops bound to their
arguments as meta tensors, the form the table's checks read, come from `operands.py`.

The C runtime differs from torch in what it holds, and the schedule must count what it holds:
- a parameter's gradient is never a tensor: `et_*_wgrad_sgd` computes it and applies SGD in one pass, so a
  node that makes gradients has no workspace;
- max-pool indices and class labels are int32;
- frozen parameters are `const`: they stay in flash and take no RAM;
- a kernel reads only what it needs: max-pool's and avg-pool's backward do not read the forward input, a
  convolution's backward reads its input only for the weight gradient, the loss's backward does not read the
  log-probabilities. Operands the kernel does not read are dropped from the node, so the schedule does not
  keep them alive for it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import Callable

import torch

from edgetrain.compiler.errors import UnsupportedModelError  # messages for the user
from edgetrain.runtime.python.optimizers import OPTIMIZERS


BATCH_NORM = "aten._native_batch_norm_legit_functional.default"
DROPOUT, DROPOUT_BACKWARD = "aten.native_dropout.default", "aten.native_dropout_backward.default"
LAYER_NORM = "aten.native_layer_norm.default"
STATS_OPS = (BATCH_NORM, LAYER_NORM)  # forward ops whose statistics ride to their backward as the node's aux
AUX_ITEMS = 3  # batch norm's statistics in the C runtime: save_mean, save_invstd and (first compute) var_sum


class CodegenError(UnsupportedModelError):
    """The schedule asks for something the C runtime cannot do."""


@dataclass(frozen=True)
class CKernel:
    """One aten op the C runtime runs: its kernel (runtime/c/kernels/<kernel>.h), what it covers in words,
    the arguments whose tensors it reads (None: all), a check for the cases it leaves out, and the kernel
    sources its calls are in (runtime/c/kernels/<source>.c; none given: <kernel>.c)."""

    kernel: str
    note: str = ""
    reads: Callable[[dict], set[str]] | None = None  # bound arguments -> names of the arguments read
    refuse: Callable[["OpCase"], str | None] = lambda case: None
    sources: tuple[str, ...] = ()
    # Arguments (by position) the output may share its bytes with: the kernel's loops read each element of them
    # before they write that element (elementwise at one index, or a channel's sums before its writes).
    in_place: tuple[int, ...] = ()

    @property
    def source_files(self) -> tuple[str, ...]:
        """The runtime/c/kernels sources (no `.c`) that define the functions this op's calls use."""
        return self.sources or ((self.kernel,) if self.kernel else ())


@dataclass
class OpCase:
    """An op of a node as the table's checks see it: arguments bound to their schema names, with each tensor
    operand as a meta tensor (its shape, and its strides through the operand's views), and what it updates."""

    op: str
    args: dict  # schema name -> literal, a meta tensor, or {"param"|"buffer": name, "t": meta}
    updates: list  # the node's {"item", "param"} updates made by this op
    out: object  # the op's first output's meta tensor (None when it holds nothing)
    buffer_updates: list = field(default_factory=list)  # {"item", "buffer"}: new values of buffers
    aux: dict | None = None  # batch norm's statistics: made by its forward, read by its backward (see aux_meta)
    node_attrs: dict = field(default_factory=dict)  # the node's attributes (a dropout's seed_key and dropout_p)


def _is_param(a) -> bool:
    return isinstance(a, dict) and "param" in a


def _conv_refuse(c: OpCase) -> str | None:
    if c.args["transposed"]:
        return "transposed convolution has no kernel"
    x = c.args["input"] if "input" in c.args else c.args["grad_output"]
    if getattr(x, "dim", lambda: 0)() != 4:
        return "only 2-D convolution (NCHW) has a kernel"
    return None


def _conv_bwd_reads(a: dict) -> set[str]:
    mask = a["output_mask"]
    return {"grad_output"} | ({"input"} if mask[1] else set())


def _linear_fwd_refuse(c: OpCase) -> str | None:
    a = c.args
    w = a["mat2"]
    if not (_is_param(w) and _transposed_param(w)) or (a.get("beta", 1) != 1 or a.get("alpha", 1) != 1):
        return "is not a linear layer's (x @ W.t() + b)"
    if "self" in a and not (_is_param(a["self"]) and a["self"]["t"].dim() == 1):
        return "is not a linear layer's (x @ W.t() + b)"
    return None


def _transposed_param(p: dict) -> bool:
    view = [v[0] for v in p.get("view", ())]
    return view.count("aten.t.default") % 2 == 1 and set(view) <= {"aten.t.default"}


def _plain_param(p: dict) -> bool:
    view = [v[0] for v in p.get("view", ())]
    return view.count("aten.t.default") % 2 == 0 and set(view) <= {"aten.t.default"}


def mm_kind(c: OpCase) -> str | None:
    """Which part of a linear layer a matrix product is: "forward" (x @ W.t()), "input_grad" (gy @ W) or
    "weight_grad" (gy.t() @ x, applied to W at once); None for any other product."""
    a, b = c.args["self"], c.args["mat2"]
    if _is_param(b) and _transposed_param(b) and not _is_param(a) and a.is_contiguous():
        return "forward"
    if _is_param(b) and _plain_param(b) and not _is_param(a) and a.is_contiguous():
        return "input_grad"
    if not _is_param(a) and not _is_param(b) and len(c.updates) == 1 and b.is_contiguous() \
            and a.t().is_contiguous() and c.out is None:
        return "weight_grad"
    return None


def _mm_refuse(c: OpCase) -> str | None:
    return None if mm_kind(c) else "is not part of a linear layer (x @ W.t(), its input or its weight gradient)"


def sum_kind(c: OpCase) -> str | None:
    """"bias_grad" (a linear layer's bias gradient: a sum over the batch applied to the bias at once),
    "planes" (a sum over H and W of an NCHW tensor), or None."""
    a = c.args
    dims = list(a["dim"] or [])
    if dims == [0] and len(c.updates) == 1 and c.out is None and a["self"].dim() == 2:
        return "bias_grad"
    if not c.updates and _hw_dims(a["self"], dims) and a["self"].is_contiguous() and a.get("dtype") is None:
        return "planes"
    return None


def _sum_refuse(c: OpCase) -> str | None:
    return None if sum_kind(c) else "has a kernel for a linear layer's bias gradient and for sums over H and W only"


def mul_kind(c: OpCase) -> str | None:
    """"same" (same-shape tensors), "planes" (an NCHW tensor times one value per plane, [N,C,1,1]), or None."""
    a, b = c.args["self"], c.args["other"]
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return None
    if a.shape == b.shape:
        return "same"
    x, s = (a, b) if a.dim() == 4 and a.numel() >= b.numel() else (b, a)
    if x.dim() == 4 and s.dim() == 4 and tuple(s.shape) == (x.shape[0], x.shape[1], 1, 1):
        return "planes"
    return None


def _mul_refuse(c: OpCase) -> str | None:
    return None if mul_kind(c) else "has a kernel for same-shape tensors and per-plane scales ([N,C,1,1]) only"


def _gelu_refuse(c: OpCase) -> str | None:
    return None if c.args["approximate"] in ("none", "tanh") else f"with approximate={c.args['approximate']!r}"


def _dropout_refuse(c: OpCase) -> str | None:
    if c.op == DROPOUT and not c.args["train"]:
        return "outside training has no kernel"
    if c.node_attrs.get("seed_key") is None or (c.op == DROPOUT_BACKWARD and "dropout_p" not in c.node_attrs):
        return "without its dropout's key and probability has no kernel"
    return None


def layer_norm_rows(c: OpCase) -> tuple[int, int]:
    """(rows, cols) of a layer norm: cols the normalized shape's size, rows the rest."""
    x = c.args["input"]
    cols = prod(c.args["normalized_shape"])
    return x.numel() // cols, cols


def _layer_norm_refuse(c: OpCase) -> str | None:
    if c.op == LAYER_NORM and (c.node_attrs.get("keep", 0) != 0 or c.node_attrs.get("aux", [1, 2]) != [1, 2]):
        return ("keeps its mean and inverse std as tensors of their own (a layer norm over fewer than 8 elements), "
                "which the C runtime has no kernel for")
    return None


def _clone_refuse(c: OpCase) -> str | None:
    x = c.args["self"]
    if not x.is_contiguous() or c.args.get("memory_format") not in (None, {"$mf": "preserve_format"},
                                                                    {"$mf": "contiguous_format"}):
        return "into another layout (a transpose made contiguous) has no kernel"
    return None


def _contiguous_strides(size) -> list[int]:
    strides, step = [], 1
    for d in reversed(list(size)):
        strides.insert(0, step)
        step *= max(d, 1)
    return strides


def _new_empty_refuse(c: OpCase) -> str | None:
    a = c.args
    if list(a["stride"]) != _contiguous_strides(a["size"]) or a.get("dtype") not in (None, torch.float32):
        return "other than a contiguous float tensor has no kernel"
    return None


def _copy_refuse(c: OpCase) -> str | None:
    dst, src = c.args["self"], c.args["src"]
    if not isinstance(src, torch.Tensor) or src.shape != dst.shape or src.dtype != dst.dtype:
        return "with broadcasting or a change of dtype has no kernel (same-shape tensors only)"
    return None


def _leaky_refuse(c: OpCase) -> str | None:
    if c.args.get("self_is_result") and c.args["negative_slope"] < 0:
        return "in place with a negative slope has no kernel"
    return None


def _hw_dims(x, dims) -> bool:
    return x.dim() == 4 and sorted(d % 4 for d in dims) == [2, 3]


def _mean_refuse(c: OpCase) -> str | None:
    return None if _hw_dims(c.args["self"], c.args["dim"] or []) and c.args.get("dtype") is None else \
        "over anything but H and W of an NCHW tensor has no kernel"


def mean_backward_planes(c: OpCase) -> int | None:
    """H*W when a division is a mean-over-H,W's backward (the gradient expanded over each plane, divided by
    the plane's size; each sample's channels of the (N, C) gradient it expands contiguous), else None."""
    x = c.args["self"]
    if not isinstance(x, torch.Tensor) or x.dim() != 4 or x.stride()[2:] != (0, 0) or x.stride()[1] != 1:
        return None
    hw = x.shape[2] * x.shape[3]
    return hw if c.args["other"] == hw else None


def _div_refuse(c: OpCase) -> str | None:
    return None if mean_backward_planes(c) else "has no kernel (only as the backward of a mean over H and W)"


def div_kind(c: OpCase) -> str | None:
    """"same" (a / b of same-shape tensors), "scalar" (x / v, a number), or None."""
    a, b = c.args["self"], c.args["other"]
    if isinstance(b, (int, float)) and not isinstance(b, bool):
        return "scalar"
    return "same" if isinstance(b, torch.Tensor) and a.shape == b.shape else None


def _div_tensor_refuse(c: OpCase) -> str | None:
    return None if div_kind(c) else "has a kernel for same-shape tensors and a number divisor only"


def slice_channels(c: OpCase) -> bool:
    """A slice's backward along channels (dim 1, step 1) of a 2-D or NCHW gradient."""
    a = c.args
    return len(a["input_sizes"]) in (2, 4) and a["dim"] % len(a["input_sizes"]) == 1 and a["step"] == 1


def _slice_bwd_refuse(c: OpCase) -> str | None:
    return None if slice_channels(c) else "along any dim but channels (dim 1, step 1) has no kernel"


def is_counter(c: OpCase) -> bool:
    """Batch norm's num_batches_tracked += 1: an integer buffer's new value, one more than its old."""
    a = c.args["self"]
    return isinstance(a, dict) and "buffer" in a and c.args["other"] == 1 and a["t"].dtype == torch.int64 \
        and [u["buffer"] for u in c.buffer_updates] == [a["buffer"]]


def _same_shape_refuse(c: OpCase) -> str | None:
    if c.op == "aten.add.Tensor" and is_counter(c):
        return None
    a, b = c.args["self"], c.args["other"]
    if not isinstance(b, torch.Tensor) or a.shape != b.shape or c.args.get("alpha", 1) != 1:
        return "with broadcasting, a scalar or alpha has no kernel (same-shape tensors only)"
    return None


def _scalar_refuse(c: OpCase) -> str | None:
    return None if isinstance(c.args["other"], (int, float)) and c.args.get("alpha", 1) == 1 else \
        "with alpha has no kernel"


def _cat_refuse(c: OpCase) -> str | None:
    parts = c.args["tensors"]
    if c.updates or c.buffer_updates:
        return None if cat_updates(c) else _no_update(c)
    return None if parts[0].dim() in (2, 4) and c.args["dim"] % parts[0].dim() == 1 else \
        "along any dim but channels (dim 1) has no kernel"


def cat_updates(c: OpCase) -> str | None:
    """The parameter a cat's output is the gradient of, where it is one parameter's gradient made by blocks of
    its rows (a CNN head computed in blocks: frontend/channel_blocks.py): 1-D parts, no output kept. SGD applies
    to each block's rows, element by element as to the whole."""
    parts = c.args["tensors"]
    if c.buffer_updates or len(c.updates) != 1 or c.updates[0].get("item") is not None or c.out is not None \
            or any(p.dim() != 1 for p in parts) or c.args["dim"] not in (0, -1):
        return None
    return c.updates[0]["param"]


def _hardtanh_refuse(c: OpCase) -> str | None:
    return None if (c.args["min_val"], c.args["max_val"]) == (0.0, 6.0) else "other than ReLU6 (0, 6) has no kernel"


def _threshold_refuse(c: OpCase) -> str | None:
    return None if c.args["threshold"] == 0 else "other than ReLU's has no kernel"


def _avg_refuse(c: OpCase) -> str | None:
    return None if c.args.get("divisor_override") is None else "with divisor_override has no kernel"


def _log_softmax_refuse(c: OpCase) -> str | None:
    x = c.args["self"] if "self" in c.args else c.args["output"]
    return None if x.dim() == 2 and c.args["dim"] % 2 == 1 else "over anything but the classes of (N, C) has no kernel"


def _nll_refuse(c: OpCase) -> str | None:
    a = c.args
    if a.get("weight") is not None or a["reduction"] != 1 or a["self"].dim() != 2:
        return "has a kernel for the mean over a batch of (N, C) scores without class weights only"
    return None


def _bn_refuse(c: OpCase) -> str | None:
    a = c.args
    x = a["input"] if "input" in a else a["grad_out"]
    if not a["training" if "training" in a else "train"] or x.dim() not in (2, 3, 4):
        return "has a kernel in training mode on (N, C, ...) tensors only"
    if c.op == BATCH_NORM and any(not isinstance(a[k], dict) or "buffer" not in a[k] for k in ("running_mean", "running_var")):
        return "without running statistics has no kernel"
    return None


def _no_update(c: OpCase) -> str | None:
    if c.buffer_updates and not (c.op == BATCH_NORM or is_counter(c)):
        return "updates a buffer, which the C runtime does only for batch norm's running statistics"
    if not c.updates:
        return None
    return (f"completes the gradient of {c.updates[0]['param']} from several uses (a module called more than once), "
            "which the C runtime cannot apply: it updates a layer where its gradient is made. Give each call its "
            "own module")


def _both(*checks):
    def check(c: OpCase) -> str | None:
        return next((why for why in (f(c) for f in checks) if why), None)
    return check


# Arguments an output may share its bytes with (CKernel.in_place): the first (an activation, its input), the
# first two (a backward's gradient and the forward value it reads; a binary op's operands). Not listed: kernels
# that read other elements after writing one (convolutions, linear layers, pooling; layer norm's backward, whose
# weight gradient reads the output gradient after the input gradient is written; a slice's backward, a fill then
# a copy), ops whose outputs have other shapes (sums, means, cat), and log_softmax (the logits are small).
_X, _GY_X, _A_B = (0,), (0, 1), (0, 1)

# The table: every aten op of a training graph the C runtime runs.
C_OPS: dict[str, CKernel] = {
    "aten.convolution.default": CKernel("conv2d", "2-D convolution: stride, padding, dilation, groups, bias",
                                        refuse=_both(_conv_refuse, _no_update)),
    "aten.convolution_backward.default": CKernel("conv2d", reads=_conv_bwd_reads, refuse=_conv_refuse,
                                                 sources=("conv2d_input_grad", "conv2d_weight_grad")),
    "aten.addmm.default": CKernel("linear", "linear layers", refuse=_both(_linear_fwd_refuse, _no_update)),
    "aten.mm.default": CKernel("linear", refuse=_mm_refuse),
    "aten.sum.dim_IntList": CKernel("sum", "sums over H and W", refuse=_sum_refuse),
    "aten.relu.default": CKernel("relu", "ReLU", refuse=_no_update, in_place=_X),
    "aten.threshold_backward.default": CKernel("relu", refuse=_both(_threshold_refuse, _no_update), in_place=_GY_X),
    "aten.hardtanh.default": CKernel("relu6", "ReLU6", refuse=_both(_hardtanh_refuse, _no_update), in_place=_X),
    "aten.hardtanh_backward.default": CKernel("relu6", refuse=_both(_hardtanh_refuse, _no_update),
                                                in_place=_GY_X),
    BATCH_NORM: CKernel("batch_norm", "batch norm (training; running statistics)", reads=lambda a: {"input"},
                        refuse=_both(_bn_refuse, _no_update), in_place=_X),
    "aten.native_batch_norm_backward.default": CKernel("batch_norm", reads=lambda a: {"grad_out", "input"},
                                                       refuse=_bn_refuse, in_place=_GY_X),
    LAYER_NORM: CKernel("layer_norm", "layer norm", refuse=_both(_layer_norm_refuse, _no_update)),
    "aten.native_layer_norm_backward.default": CKernel("layer_norm", refuse=_layer_norm_refuse),
    "aten.sigmoid.default": CKernel("sigmoid", "sigmoid", refuse=_no_update, in_place=_X),
    "aten.sigmoid_backward.default": CKernel("sigmoid", refuse=_no_update, in_place=_GY_X),
    "aten.hardsigmoid.default": CKernel("hardsigmoid", "hardsigmoid", refuse=_no_update, in_place=_X),
    "aten.hardsigmoid_backward.default": CKernel("hardsigmoid", refuse=_no_update, in_place=_GY_X),
    "aten.hardswish.default": CKernel("hardswish", "hardswish", refuse=_no_update, in_place=_X),
    "aten.hardswish_backward.default": CKernel("hardswish", refuse=_no_update, in_place=_GY_X),
    "aten.leaky_relu.default": CKernel("leaky_relu", "LeakyReLU", refuse=_no_update, in_place=_X),
    "aten.leaky_relu_backward.default": CKernel("leaky_relu", refuse=_both(_leaky_refuse, _no_update),
                                                 in_place=_GY_X),
    "aten.gelu.default": CKernel("gelu", "GELU", refuse=_both(_gelu_refuse, _no_update), in_place=_X),
    "aten.gelu_backward.default": CKernel("gelu", refuse=_both(_gelu_refuse, _no_update), in_place=_GY_X),
    DROPOUT: CKernel("dropout", "dropout (nn.Dropout; its mask redrawn from a hash)", reads=lambda a: {"input"},
                     refuse=_both(_dropout_refuse, _no_update), in_place=_X),
    DROPOUT_BACKWARD: CKernel("dropout", refuse=_both(_dropout_refuse, _no_update), in_place=_X),  # its mask: see lower.py
    "aten.mul.Tensor": CKernel("mul", "mul of same-shape tensors or by a per-channel scale (squeeze-excitation)",
                               refuse=_both(_mul_refuse, _no_update), in_place=_A_B),
    "aten.max_pool2d_with_indices.default": CKernel("maxpool2d", "max-pool", refuse=_no_update),
    "aten.max_pool2d_with_indices_backward.default": CKernel(
        "maxpool2d", reads=lambda a: {"grad_output", "indices"}, refuse=_no_update),
    "aten.avg_pool2d.default": CKernel("avgpool2d", "avg-pool (no divisor_override)",
                                       refuse=_both(_avg_refuse, _no_update)),
    "aten.avg_pool2d_backward.default": CKernel("avgpool2d", reads=lambda a: {"grad_output"},
                                                refuse=_both(_avg_refuse, _no_update)),
    "aten.mean.dim": CKernel("global_avgpool", "mean over H and W (global average pooling)",
                             refuse=_both(_mean_refuse, _no_update)),
    "aten.div.Scalar": CKernel("global_avgpool", refuse=_both(_div_refuse, _no_update)),
    "aten.div.Tensor": CKernel("div", "division by a number or a same-shape tensor",
                               refuse=_both(_div_tensor_refuse, _no_update), in_place=_A_B),
    # A channel slice's backward (GhostNet's `out[:, :c]`): zeros, and the gradient into its channels.
    "aten.slice_backward.default": CKernel("concat", "channel slices (their backward)", sources=("concat", "fill"),
                                           refuse=_both(_slice_bwd_refuse, _no_update)),
    "aten.add.Tensor": CKernel("add", "add of same-shape tensors (residuals)",
                               refuse=_both(_same_shape_refuse, _no_update), in_place=_A_B),
    "aten.cat.default": CKernel("concat", "cat along channels (dim 1)", refuse=_cat_refuse, sources=("concat", "sgd")),
    "aten._log_softmax.default": CKernel("log_softmax", "log_softmax over classes",
                                         refuse=_both(_log_softmax_refuse, _no_update)),
    "aten._log_softmax_backward_data.default": CKernel("log_softmax",
                                                       refuse=_both(_log_softmax_refuse, _no_update)),
    "aten.nll_loss_forward.default": CKernel("nll_loss", "cross-entropy (log_softmax + nll_loss, mean)",
                                             refuse=_both(_nll_refuse, _no_update)),
    "aten.nll_loss_backward.default": CKernel("nll_loss", reads=lambda a: {"grad_output", "target", "total_weight"},
                                              refuse=_both(_nll_refuse, _no_update)),
    "aten.ones_like.default": CKernel("", reads=lambda a: set(), refuse=_no_update),  # the loss's seed gradient
    # SiLU's backward, as torch's joint graph spells it: sigmoid(x) * (1 + x * (1 - sigmoid(x))).
    "aten.silu.default": CKernel("silu", "SiLU", refuse=_no_update, in_place=_X),
    "aten.silu_backward.default": CKernel("silu", refuse=_no_update, in_place=_GY_X),
    "aten.empty_like.default": CKernel("", reads=lambda a: set(), refuse=_no_update),
    "aten.clone.default": CKernel("", "copies of contiguous tensors (Dropout(p=0))", refuse=_both(_clone_refuse, _no_update)),
    # The backward of an in-place op (timm's `x += shortcut`), as functionalization spells it: a fresh tensor
    # (its place in the arena is all it makes) and copies into it, which read only their source.
    "aten.new_empty_strided.default": CKernel("", reads=lambda a: set(), refuse=_both(_new_empty_refuse, _no_update)),
    "aten.copy.default": CKernel("", "copies between same-shape tensors", reads=lambda a: {"src"},
                                 refuse=_both(_copy_refuse, _no_update)),
    "aten.fill.Scalar": CKernel("fill", reads=lambda a: set(), refuse=_no_update),
    "aten.sub.Tensor": CKernel("sub", refuse=_both(_same_shape_refuse, _no_update), in_place=_A_B),
    "aten.add.Scalar": CKernel("add", refuse=_both(_scalar_refuse, _no_update), in_place=_X),
}
# An int8 frozen prefix (compiler/graph/quantize.py, `--quantize-frozen int8`): its nodes are the graph pass's own
# ops, not aten's, so no table check binds them (the pass admits only what these kernels run); emitted by q8_emit.py.
Q8_OPS: dict[str, CKernel] = {
    "edgetrain.q8_quantize.default": CKernel("q8_convert", "an int8 frozen prefix (--quantize-frozen int8: "
                                             "convolutions, ReLU/ReLU6, residual adds)"),
    "edgetrain.q8_dequantize.default": CKernel("q8_convert"),
    "edgetrain.q8_add.default": CKernel("q8_convert"),
    "edgetrain.q8_conv2d.default": CKernel("q8_conv2d"),
    "edgetrain.q8_relu.default": CKernel("q8_relu", in_place=_X),
    "edgetrain.q8_relu6.default": CKernel("q8_relu6", in_place=_X),
    # int8 bias training's backward node (--int8-biases: compiler/graph/qas_lower.py), emitted by qas_emit.py
    "edgetrain.qas_backward.default": CKernel("q8_qas_sgd", "int8 bias training (--int8-biases)", sources=(
        "q8_grad_quantize", "q8_grad_rescale", "q8_bias_grad", "q8_conv2d_input_grad_sums", "q8_qas_sgd", "q8_relu",
        "q8_relu6")),
}
C_OPS.update(Q8_OPS)
IN_PLACE_ARGS = {op: k.in_place for op, k in C_OPS.items() if k.in_place}  # what the compiler's graph pass reads
ALSO = "views (flatten, reshape, channel slices at batch 1); SGD with momentum and weight decay"


PATCH_SOURCE = "patch"  # a frozen prefix computed patch by patch (compiler/graph/tiling.py): emitted by patches.py
Q8_PATCH_SOURCE = "q8_patch"  # the same for an int8 prefix: its copies a byte an element

# every parameter's update, whichever op makes its gradient: the C kernels the optimizer units name
OPTIMIZER_SOURCES = {u.c_kernel for u in OPTIMIZERS.values() if u.c_kernel}


def kernel_sources() -> tuple[str, ...]:
    """Every kernel source a C firmware compiles, as paths under runtime/c: each op's, and the optimizer's."""
    stems = {s for k in C_OPS.values() for s in k.source_files} | OPTIMIZER_SOURCES | {PATCH_SOURCE, Q8_PATCH_SOURCE}
    return tuple(f"kernels/{s}.c" for s in sorted(stems))


def supported_text() -> str:
    """The ops the C runtime runs, in words (what an error offers instead)."""
    return ", ".join(dict.fromkeys(k.note for k in C_OPS.values() if k.note)) + "; " + ALSO
