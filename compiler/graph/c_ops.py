"""The C runtime's op table, and the pass that fits a training graph to what the C runtime holds.

torch knows every op's semantics, shapes and FLOPs; what it does not know is which aten ops the C runtime
(runtime/c) has a kernel for, which operands that kernel reads, and how it holds memory. That is this table,
the one place for it: codegen/c emits a call for each op listed here and for nothing else.

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

from dataclasses import dataclass, field, replace
from math import prod
from typing import Callable

import torch

from edgetrain.runtime.python.aten_call import apply_view, resolve

from edgetrain.compiler.errors import UnsupportedModelError

from .ir import Node, TensorRef, TrainingGraph


BATCH_NORM = "aten._native_batch_norm_legit_functional.default"
DROPOUT, DROPOUT_BACKWARD = "aten.native_dropout.default", "aten.native_dropout_backward.default"
LAYER_NORM = "aten.native_layer_norm.default"
STATS_OPS = (BATCH_NORM, LAYER_NORM)  # forward ops whose statistics ride to their backward as the node's aux
AUX_ITEMS = 3  # batch norm's statistics in the C runtime: save_mean, save_invstd and (first compute) var_sum


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
    the plane's size), else None."""
    x = c.args["self"]
    if not isinstance(x, torch.Tensor) or x.dim() != 4 or x.stride()[2:] != (0, 0):
        return None
    hw = x.shape[2] * x.shape[3]
    return hw if c.args["other"] == hw else None


def _div_refuse(c: OpCase) -> str | None:
    return None if mean_backward_planes(c) else "has no kernel (only as the backward of a mean over H and W)"


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
    return None if parts[0].dim() in (2, 4) and c.args["dim"] % parts[0].dim() == 1 else \
        "along any dim but channels (dim 1) has no kernel"


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


# The table: every aten op of a training graph the C runtime runs.
C_OPS: dict[str, CKernel] = {
    "aten.convolution.default": CKernel("conv2d", "2-D convolution: stride, padding, dilation, groups, bias",
                                        refuse=_both(_conv_refuse, _no_update)),
    "aten.convolution_backward.default": CKernel("conv2d", reads=_conv_bwd_reads, refuse=_conv_refuse,
                                                 sources=("conv2d_input_grad", "conv2d_weight_grad")),
    "aten.addmm.default": CKernel("linear", "linear layers", refuse=_both(_linear_fwd_refuse, _no_update)),
    "aten.mm.default": CKernel("linear", refuse=_mm_refuse),
    "aten.sum.dim_IntList": CKernel("sum", "sums over H and W", refuse=_sum_refuse),
    "aten.relu.default": CKernel("relu", "ReLU", refuse=_no_update),
    "aten.threshold_backward.default": CKernel("relu", refuse=_both(_threshold_refuse, _no_update)),
    "aten.hardtanh.default": CKernel("relu6", "ReLU6", refuse=_both(_hardtanh_refuse, _no_update)),
    "aten.hardtanh_backward.default": CKernel("relu6", refuse=_both(_hardtanh_refuse, _no_update)),
    BATCH_NORM: CKernel("batch_norm", "batch norm (training; running statistics)", reads=lambda a: {"input"},
                        refuse=_both(_bn_refuse, _no_update)),
    "aten.native_batch_norm_backward.default": CKernel("batch_norm", reads=lambda a: {"grad_out", "input"},
                                                       refuse=_bn_refuse),
    LAYER_NORM: CKernel("layer_norm", "layer norm", refuse=_both(_layer_norm_refuse, _no_update)),
    "aten.native_layer_norm_backward.default": CKernel("layer_norm", refuse=_layer_norm_refuse),
    "aten.sigmoid.default": CKernel("sigmoid", "sigmoid", refuse=_no_update),
    "aten.sigmoid_backward.default": CKernel("sigmoid", refuse=_no_update),
    "aten.hardsigmoid.default": CKernel("hardsigmoid", "hardsigmoid", refuse=_no_update),
    "aten.hardsigmoid_backward.default": CKernel("hardsigmoid", refuse=_no_update),
    "aten.hardswish.default": CKernel("hardswish", "hardswish", refuse=_no_update),
    "aten.hardswish_backward.default": CKernel("hardswish", refuse=_no_update),
    "aten.leaky_relu.default": CKernel("leaky_relu", "LeakyReLU", refuse=_no_update),
    "aten.leaky_relu_backward.default": CKernel("leaky_relu", refuse=_both(_leaky_refuse, _no_update)),
    "aten.gelu.default": CKernel("gelu", "GELU", refuse=_both(_gelu_refuse, _no_update)),
    "aten.gelu_backward.default": CKernel("gelu", refuse=_both(_gelu_refuse, _no_update)),
    DROPOUT: CKernel("dropout", "dropout (nn.Dropout; its mask redrawn from a hash)", reads=lambda a: {"input"},
                     refuse=_both(_dropout_refuse, _no_update)),
    DROPOUT_BACKWARD: CKernel("dropout", refuse=_both(_dropout_refuse, _no_update)),  # its mask: see _redraw_dropout_masks
    "aten.mul.Tensor": CKernel("mul", "mul of same-shape tensors or by a per-channel scale (squeeze-excitation)",
                               refuse=_both(_mul_refuse, _no_update)),
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
    "aten.add.Tensor": CKernel("add", "add of same-shape tensors (residuals)",
                               refuse=_both(_same_shape_refuse, _no_update)),
    "aten.cat.default": CKernel("concat", "cat along channels (dim 1)", refuse=_both(_cat_refuse, _no_update)),
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
    "aten.silu.default": CKernel("silu", "SiLU", refuse=_no_update),
    "aten.silu_backward.default": CKernel("silu", refuse=_no_update),
    "aten.empty_like.default": CKernel("", reads=lambda a: set(), refuse=_no_update),
    "aten.clone.default": CKernel("", "copies of contiguous tensors (Dropout(p=0))", refuse=_both(_clone_refuse, _no_update)),
    "aten.fill.Scalar": CKernel("fill", reads=lambda a: set(), refuse=_no_update),
    "aten.sub.Tensor": CKernel("sub", refuse=_both(_same_shape_refuse, _no_update)),
    "aten.add.Scalar": CKernel("add", refuse=_both(_scalar_refuse, _no_update)),
}
ALSO = "views (flatten, reshape, channel slices at batch 1); SGD with momentum and weight decay"


OPTIMIZER_SOURCE = "sgd"  # every parameter's update, whichever op makes its gradient


def kernel_sources() -> tuple[str, ...]:
    """Every kernel source a C firmware compiles, as paths under runtime/c: each op's, and the optimizer's."""
    stems = {s for k in C_OPS.values() for s in k.source_files} | {OPTIMIZER_SOURCE}
    return tuple(f"kernels/{s}.c" for s in sorted(stems))


def supported_text() -> str:
    """The ops the C runtime runs, in words (what an error offers instead)."""
    return ", ".join(dict.fromkeys(k.note for k in C_OPS.values() if k.note)) + "; " + ALSO


# -- operands as meta tensors ------------------------------------------------------------------------------

def holder_meta(node: Node, offset: int = 0):
    """What a node holds as meta tensors laid out as the C runtime lays them out, at word `offset` of the
    arena: one block of 4-byte words (float32, or int32 for indices and labels), a tuple's items one after
    the other. Any view of it then has its arena offset, in words, as its storage offset."""
    shapes = [s.shape for s in node.items] if node.items else [tuple(node.shape or ())]
    sizes = [prod(s) for s in shapes]
    arena = torch.empty(offset + sum(sizes), device="meta")
    if node.dtype == "int32":
        arena = arena.view(torch.int32)
    out, at = [], offset
    for shape, n in zip(shapes, sizes):
        out.append(arena[at:at + n].view(shape))
        at += n
    return tuple(out) if node.items else out[0]


def operand_meta(graph_nodes: dict[str, Node], ref: TensorRef, offsets: dict[str, int] | None = None):
    """An operand as a meta tensor: its shape, strides and offset (in words) in the arena (`offsets`: where
    each holder starts; 0 without)."""
    node = graph_nodes[ref.name]
    return apply_view(holder_meta(node, (offsets or {}).get(ref.name, 0)), ref.view)


def param_meta(spec: tuple, view) -> torch.Tensor:
    """A parameter or buffer, (shape, dtype), as a meta tensor seen through its view."""
    shape, dtype = spec
    return apply_view(torch.empty(tuple(shape), dtype=getattr(torch, dtype), device="meta"),
                      [tuple(v) for v in view or ()])


def bind(op: str, args: list, kwargs: dict) -> dict:
    """Arguments by schema name, defaults filled in."""
    schema = resolve(op)._schema
    bound = {}
    for i, a in enumerate(schema.arguments):
        if i < len(args):
            bound[a.name] = args[i]
        elif a.name in kwargs:
            bound[a.name] = kwargs[a.name]
        elif a.has_default_value():
            bound[a.name] = a.default_value
        else:
            bound[a.name] = None
    return bound


def op_case(op: str, args: list, kwargs: dict, operands: list, state: dict, updates: list, out,
            own=None, buffer_updates=(), aux=None, node_attrs=None) -> OpCase:
    """Bind an op's argument template, with `operands` the meta tensors of its `$t` markers, `state` the
    parameters' and buffers' shapes, `out` what the op holds, `own` what the node's first op holds (for a
    fused op) and `aux` the statistics block."""
    def fill(a):
        if isinstance(a, dict):
            if "$t" in a:
                return operands[a["$t"]]
            if "$own" in a:
                return apply_view(own, a.get("view"))
            for key, kind in (("$p", "param"), ("$b", "buffer")):
                if key in a:
                    return {kind: a[key], "view": a.get("view", ()), "t": param_meta(state[a[key]], a.get("view"))}
            if "$aux" in a:  # an output of the forward op kept for this node; None: one the C kernel never reads
                return aux.get(a["$aux"]) if aux is not None else a
            if "$empty" in a:
                return a
            return {k: fill(v) for k, v in a.items()}
        if isinstance(a, list):
            return [fill(v) for v in a]
        return a

    return OpCase(op=op, args=bind(op, fill(args), fill(kwargs)), updates=updates, out=out,
                  buffer_updates=list(buffer_updates), aux=aux, node_attrs=node_attrs or {})


def node_ops(node: Node) -> list[dict]:
    """The node's own op, then each op fused after it, as {"op", "args", "kwargs", "updates", "buffer_updates",
    "own"}."""
    def one(op, spec, own):
        ups = spec.get("updates", ())
        return {"op": op, "args": spec.get("args", []), "kwargs": spec.get("kwargs", {}), "own": own,
                "updates": [u for u in ups if "param" in u], "buffer_updates": [u for u in ups if "buffer" in u]}

    return [one(node.op, node.attrs, True)] + [one(s["op"], s, False) for s in node.attrs.get("then", ())]




def aux_meta(forward: Node, offset: int = 0) -> dict:
    """A batch-norm node's statistics block, at word `offset`: three [C] vectors (mean, inverse std, and the
    sum of squared deviations its running-variance update reads). Keyed as the backward's `$aux` markers are
    numbered (their place in the forward's kept outputs) where it reads them, and "mean", "invstd", "var_sum".
    A layer norm's: its mean and rstd, one per row, as torch makes them."""
    if forward.op == LAYER_NORM:
        a = bind(LAYER_NORM, forward.attrs["args"], forward.attrs.get("kwargs", {}))
        rows = prod(forward.shape) // prod(a["normalized_shape"])
        block = torch.empty(offset + 2 * rows, device="meta")
        mean, rstd = block[offset:offset + rows], block[offset + rows:offset + 2 * rows]
        return {"mean": mean, "rstd": rstd, 0: mean, 1: rstd}  # its aux is outputs [1, 2]: refused otherwise
    c = forward.shape[1]
    block = torch.empty(offset + AUX_ITEMS * c, device="meta")
    mean, invstd, var_sum = (block[offset + k * c: offset + (k + 1) * c] for k in range(AUX_ITEMS))
    out = {"mean": mean, "invstd": invstd, "var_sum": var_sum}
    kept = forward.attrs.get("aux", [])
    for j, k in enumerate(kept):  # outputs 1 and 2 of the forward op are its mean and inverse std
        if k in (1, 2):
            out[j] = mean if k == 1 else invstd
    return out


def node_cases(node: Node, graph_nodes: dict[str, Node], state: dict,
               offsets: dict[str, int] | None = None) -> list[OpCase]:
    """Each op the node runs, bound (its own op first); tensors at their arena `offsets` when given (a
    batch norm's statistics at `offsets["<node>.aux"]`, absent where they are not resident)."""
    offsets = offsets or {}
    operands = [operand_meta(graph_nodes, r, offsets) for r in node.inputs]
    held = holder_meta(node, offsets.get(node.name, 0)) if node.shape is not None or node.items else None
    first = held[0] if isinstance(held, tuple) else held
    aux = None
    stats = node.aux_of or (node.name if node.op in STATS_OPS else None)
    if stats is not None and (f"{stats}.aux" in offsets or not offsets):
        aux = aux_meta(graph_nodes[stats], offsets.get(f"{stats}.aux", 0))
    return [op_case(o["op"], o["args"], o["kwargs"], operands, state, o["updates"], first if o["own"] else None,
                    own=first, buffer_updates=o["buffer_updates"], aux=aux, node_attrs=node.attrs)
            for o in node_ops(node)]


# -- the pass ----------------------------------------------------------------------------------------------

def lower_for_c(g: TrainingGraph) -> TrainingGraph:
    """The training graph as the C runtime holds it, or one error naming every op it cannot run."""
    _check_optimizer(g)
    g = replace(g, nodes=_redraw_dropout_masks(g.nodes))
    by_name = {n.name: n for n in g.nodes}
    state = state_shapes(g)
    problems: dict[tuple[str, str], list[str]] = {}  # (op, why) -> where
    for n in g.nodes:
        if n.kind in ("input", "labels"):
            continue
        where = f"node `{n.name}` ({n.source or ('the loss' if n.kind == 'loss' else 'unknown source')})"
        if (n.aux_bytes and n.op not in STATS_OPS) or (n.aux_of and by_name[n.aux_of].op not in STATS_OPS):
            problems.setdefault((n.op, "keeps statistics for its backward, which the C runtime has no kernel for"),
                                []).append(where)
            continue
        if n.op == DROPOUT and n.attrs.get("seed_key") == n.name:
            problems.setdefault((n.op, "is a functional dropout (F.dropout, torch.dropout), whose mask the exactness "
                                 "reference cannot redraw; use an nn.Dropout module"), []).append(where)
            continue
        missing = [o["op"] for o in node_ops(n) if o["op"] not in C_OPS]
        for op in missing:
            problems.setdefault((op, "has no kernel in the C runtime"), []).append(where)
        if missing:
            continue
        try:
            cases = node_cases(n, by_name, state)
        except RuntimeError as e:  # an operand seen through a view of a layout the C arena does not have
            problems.setdefault((n.op, f"reads an operand the C runtime cannot lay out ({str(e).splitlines()[0][:80]})"),
                                []).append(where)
            continue
        for case in cases:
            why = C_OPS[case.op].refuse(case)
            if why:
                problems.setdefault((case.op, why), []).append(where)
    if problems:
        lines = []
        for (op, why), wheres in problems.items():
            more = f" and {len(wheres) - 3} more" if len(wheres) > 3 else ""
            lines.append(f"op `{op}` {why}: at {', '.join(wheres[:3])}{more}")
        listed = "\n  - ".join(lines)
        raise UnsupportedModelError(
            f"--emit c: {len(problems)} op(s) of the model cannot run in the C runtime:\n  - {listed}\n"
            f"The C runtime supports: {supported_text()}. Remove or replace these ops, or use --emit python.")
    nodes = [_as_c(n) for n in g.nodes]
    return replace(g, nodes=nodes, frozen_in_flash=True)  # frozen weights are const: flash, not RAM


def _redraw_dropout_masks(nodes: list[Node]) -> list[Node]:
    """The C runtime keeps no dropout mask: a dropout's backward redraws it from its forward's key and p (its
    attrs `seed_key` and `dropout_p`), and the mask's own node, read by nothing else, goes."""
    by_name = {n.name: n for n in nodes}
    readers: dict[str, set[str]] = {}
    for n in nodes:
        for r in n.inputs:
            readers.setdefault(r.name, set()).add(n.op)
    out = []
    for n in nodes:
        if n.op == DROPOUT and n.attrs.get("keep") == 1 and readers.get(n.name, set()) <= {DROPOUT_BACKWARD}:
            continue
        if n.op == DROPOUT_BACKWARD and len(n.inputs) == 2 and by_name[n.inputs[1].name].op == DROPOUT \
                and n.attrs["args"][:2] == [{"$t": 0}, {"$t": 1}]:
            fwd = by_name[n.inputs[1].name]
            p = bind(DROPOUT, fwd.attrs["args"], fwd.attrs.get("kwargs", {}))["p"]
            n = replace(n, inputs=n.inputs[:1], attrs={**n.attrs, "args": [{"$t": 0}, None, *n.attrs["args"][2:]],
                                                       "seed_key": fwd.attrs.get("seed_key"), "dropout_p": p})
        out.append(n)
    return out


def state_shapes(g: TrainingGraph) -> dict[str, tuple]:
    """(shape, dtype) of every parameter and buffer."""
    return {name: (s.shape, s.dtype) for name, s in {**g.params, **g.buffers}.items()}


def _check_optimizer(g: TrainingGraph) -> None:
    o = g.optimizer
    if o.name != "sgd" or o.nesterov:
        raise UnsupportedModelError(
            f"--emit c: the C runtime trains with SGD (momentum, weight decay), not {o.name}"
            f"{' with Nesterov momentum' if o.nesterov else ''}; use --optimizer sgd or --emit python")


def _as_c(n: Node) -> Node:
    """A node with the C runtime's memory: int32 indices and labels, no gradient workspace, only the operands
    its kernels read."""
    dtype = n.dtype
    if n.kind == "labels" or (n.op == "aten.max_pool2d_with_indices.default" and n.attrs.get("keep") == 1):
        dtype = "int32"
    if n.kind in ("input", "labels"):
        return replace(n, dtype=dtype)
    read: set[int] = set()
    for o in node_ops(n):
        read |= _read_operands(o)
    keep = sorted(read)
    remap = {k: {"$t": j} for j, k in enumerate(keep)}

    def sub(a):
        if isinstance(a, dict) and "$t" in a:
            return remap.get(a["$t"])
        if isinstance(a, list):
            return [sub(v) for v in a]
        if isinstance(a, dict):
            return {k: sub(v) for k, v in a.items()}
        return a

    attrs = {k: sub(v) if k in ("args", "kwargs", "then") else v for k, v in n.attrs.items()}
    aux_bytes = 4 * AUX_ITEMS * n.shape[1] if n.op == BATCH_NORM else n.aux_bytes
    return replace(n, dtype=dtype, workspace_bytes=0, inputs=tuple(n.inputs[k] for k in keep), attrs=attrs,
                   aux_bytes=aux_bytes)


def _read_operands(o: dict) -> set[int]:
    """The `$t` operands an op's kernel reads."""
    found: dict[str, set[int]] = {}

    def visit(name, a):
        if isinstance(a, dict) and "$t" in a:
            found.setdefault(name, set()).add(a["$t"])
        elif isinstance(a, list):
            for v in a:
                visit(name, v)

    schema = resolve(o["op"])._schema
    for i, a in enumerate(o["args"]):
        visit(schema.arguments[i].name, a)
    for name, a in o["kwargs"].items():
        visit(name, a)
    kernel = C_OPS[o["op"]]
    wanted = set(found) if kernel.reads is None else kernel.reads(bind(o["op"], o["args"], o["kwargs"]))
    return set().union(*(found[k] for k in wanted if k in found))
