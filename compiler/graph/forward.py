"""The forward graph: each node of a traced model mapped to a registry op, with views folded away.

The result is a `ForwardGraph`: forward nodes in execution order (`ir.Node`), with views folded
into the operands of their consumers. Anything outside the supported set fails here, naming the op, the
fx node and the line of the user's source that created it.
"""
from __future__ import annotations

import operator
import re
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from edgetrain.compiler.errors import UnsupportedModelError
from edgetrain.compiler.frontend.trace import node_source as _node_source, trace_model

from .forward_transformers import TransformerHandlers
from .ir import Node, TensorRef, TensorSpec, inverse_view, view_shape
from .ops import OPS


@dataclass
class ForwardGraph:
    nodes: list[Node]  # "input" first, forward nodes after it
    output: TensorRef  # the model's output (logits)
    params: dict[str, TensorSpec]
    buffers: dict[str, TensorSpec]
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    module_of: dict[str, str] = field(default_factory=dict)  # node name -> module qualname
    input_dtype: str = "float32"  # "int64": token ids
    input_high: int | None = None  # token ids lie in [0, input_high)


_PREFIX = {"batch_norm": "bn", "maxpool_argmax": "maxpool", "maxpool_gather": "maxpool",
           "adaptive_avg_pool2d": "gap", "avg_pool2d": "avgpool"}


def _pair(v) -> list[int]:
    return [int(v), int(v)] if isinstance(v, int) else [int(x) for x in v]


class _Builder(TransformerHandlers):
    """Maps fx nodes to registry ops. One small method per construct, looked up in tables below."""

    def __init__(self, gm: fx.GraphModule, values: dict[str, Any]) -> None:
        self.gm = gm
        self.values = values
        self.modules = dict(gm.named_modules())
        self.nodes: list[Node] = []
        self.refs: dict[str, TensorRef] = {}  # fx name -> operand (after folding views)
        self.module_calls: dict[str, str] = {}
        self.module_of: dict[str, str] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}  # emitted node -> output shape

    # -- helpers -----------------------------------------------------------------------------------
    def fail(self, n: fx.Node, what: str, why: str = "") -> UnsupportedModelError:
        why = f" {why}" if why else ""
        return UnsupportedModelError(
            f"unsupported operation {what} at fx node `{n.name}`, {_node_source(n)}.{why}\n"
            f"Supported: {SUPPORTED}."
        )

    def shape(self, n: fx.Node) -> tuple[int, ...]:
        return tuple(self.values[n.name].shape)

    def ref(self, a: Any, n: fx.Node) -> TensorRef:
        if not isinstance(a, fx.Node) or a.name not in self.refs:
            raise self.fail(n, f"`{n.target}` with a non-tensor or constant operand `{a}`")
        return self.refs[a.name]

    def ref_shape(self, r: TensorRef) -> tuple[int, ...]:
        return view_shape(self.shapes[r.name], r.view)

    def emit(self, n: fx.Node, op: str, inputs: list[TensorRef], *, name: str | None = None,
             params: tuple[str, ...] = (), buffers: tuple[str, ...] = (), attrs: dict | None = None,
             shape: tuple[int, ...] | None = None) -> TensorRef:
        rule = OPS[op]
        attrs = attrs or {}
        primary = name is None
        # fx names children of an nn.Sequential "_0", "_1": prefix the op so plans stay readable.
        base = f"{_PREFIX.get(op, op)}{n.name}" if re.match(r"_\d", n.name) else n.name
        name = base if primary else name.replace(n.name, base, 1)
        out_shape = shape if shape is not None else self.shape(n)
        in_shapes = [self.ref_shape(r) for r in inputs]
        node = Node(
            name=name, kind="forward", op=op, inputs=tuple(inputs), params=params, buffers=buffers,
            attrs=attrs, shape=out_shape, dtype=rule.out_dtype,
            aux_bytes=rule.aux_bytes(in_shapes, out_shape, attrs) if rule.aux_bytes else 0,
            workspace_bytes=rule.scratch_bytes(in_shapes, out_shape, attrs) if rule.scratch_bytes else 0,
            flops=int(rule.flops(in_shapes, out_shape, attrs)), source=_node_source(n),
        )
        self.nodes.append(node)
        self.shapes[name] = out_shape
        r = TensorRef(name)
        if primary:
            self.refs[n.name] = r
        return r

    def alias(self, n: fx.Node, src: TensorRef, reshape: bool, may_copy: bool = True) -> None:
        """`n` is `src` seen through a reshape (or unchanged). Where torch copied instead (a reshape or
        `.contiguous()` of a permuted tensor), the copy is a node of its own, so its bytes are counted."""
        shp = self.shape(n)
        view = src.view[:-1] if reshape and src.view and src.view[-1][0] == "reshape" else src.view
        view = view if shp == view_shape(self.shapes[src.name], view) else view + (("reshape", shp),)
        arg = n.args[0]
        if may_copy and isinstance(arg, fx.Node) and self.values[n.name].untyped_storage().data_ptr() != \
                self.values[arg.name].untyped_storage().data_ptr():
            self.emit(n, "copy", [TensorRef(src.name)], attrs={
                "view": [list(v) for v in view], "grad_view": [list(v) for v in inverse_view(self.shapes[src.name], view)]})
            return
        self.refs[n.name] = TensorRef(src.name, view)

    def permute(self, n: fx.Node, src: TensorRef, dims: list[int]) -> None:
        dims = [d % len(dims) for d in dims]
        self.refs[n.name] = src if dims == sorted(dims) else TensorRef(src.name, src.view + (("permute", tuple(dims)),))

    def claim_module(self, n: fx.Node) -> str:
        q = str(n.target)
        if q in self.module_calls:
            raise UnsupportedModelError(
                f"module `{q}` is called more than once (fx nodes `{self.module_calls[q]}` and `{n.name}`, "
                f"{_node_source(n)}): shared parameters would be updated twice. Give each call its own module."
            )
        self.module_calls[q] = n.name
        return q

    # -- modules ---------------------------------------------------------------------------------------
    def m_conv(self, n, m: nn.Conv2d):
        if isinstance(m.padding, str) or m.padding_mode != "zeros":
            raise self.fail(n, f"Conv2d(padding={m.padding!r}, padding_mode={m.padding_mode!r})",
                            "Use numeric padding with padding_mode='zeros'.")
        q = self.claim_module(n)
        params = (f"{q}.weight",) + ((f"{q}.bias",) if m.bias is not None else ())
        attrs = {"kernel_size": _pair(m.kernel_size), "stride": _pair(m.stride), "padding": _pair(m.padding),
                 "dilation": _pair(m.dilation), "groups": m.groups, "bias": m.bias is not None}
        self.module_of[n.name] = q
        self.emit(n, "conv2d", [self.ref(n.args[0], n)], params=params, attrs=attrs)

    def m_linear(self, n, m: nn.Linear):
        q = self.claim_module(n)
        x = self.ref(n.args[0], n)
        if len(self.ref_shape(x)) > 2 and not self.values[n.args[0].name].is_contiguous():
            raise self.fail(n, f"Linear on a non-contiguous {len(self.ref_shape(x))}-d input",
                            "Call .contiguous() (or .reshape) on it first.")
        params = (f"{q}.weight",) + ((f"{q}.bias",) if m.bias is not None else ())
        self.module_of[n.name] = q
        self.emit(n, "linear", [x], params=params, attrs={"bias": m.bias is not None})

    def m_bn(self, n, m: nn.BatchNorm2d):
        if not (m.affine and m.track_running_stats) or m.momentum is None:
            raise self.fail(n, "BatchNorm2d(affine=False / track_running_stats=False / momentum=None)",
                            "Use the defaults affine=True, track_running_stats=True and a numeric momentum.")
        q = self.claim_module(n)
        self.module_of[n.name] = q
        self.emit(n, "batch_norm", [self.ref(n.args[0], n)], params=(f"{q}.weight", f"{q}.bias"),
                  buffers=(f"{q}.running_mean", f"{q}.running_var", f"{q}.num_batches_tracked"),
                  attrs={"eps": float(m.eps), "momentum": float(m.momentum)})

    def m_maxpool(self, n, m: nn.MaxPool2d):
        if m.return_indices:
            raise self.fail(n, "MaxPool2d(return_indices=True)")
        self.maxpool(n, self.ref(n.args[0], n), m.kernel_size, m.stride, m.padding, m.dilation, m.ceil_mode)

    def maxpool(self, n, x, k, s, p, d, ceil):
        attrs = {"kernel_size": _pair(k), "stride": _pair(s if s else k), "padding": _pair(p),
                 "dilation": _pair(d), "ceil_mode": bool(ceil)}
        idx = self.emit(n, "maxpool_argmax", [x], name=f"{n.name}_argmax", attrs=attrs)
        self.emit(n, "maxpool_gather", [x, idx], attrs=attrs)  # the backward kernel needs the window

    def m_avgpool(self, n, m: nn.AvgPool2d):
        self.avgpool(n, self.ref(n.args[0], n), m.kernel_size, m.stride, m.padding, m.ceil_mode,
                     m.count_include_pad, m.divisor_override)

    def avgpool(self, n, x, k, s, p, ceil, cip, div):
        attrs = {"kernel_size": _pair(k), "stride": _pair(s if s else k), "padding": _pair(p),
                 "ceil_mode": bool(ceil), "count_include_pad": bool(cip), "divisor_override": div}
        self.emit(n, "avg_pool2d", [x], attrs=attrs)

    def m_adaptive(self, n, m: nn.AdaptiveAvgPool2d):
        self.adaptive(n, self.ref(n.args[0], n))

    def adaptive(self, n, x):
        self.emit(n, "adaptive_avg_pool2d", [x], attrs={"output_size": list(self.shape(n)[2:])})

    def m_dropout(self, n, m: nn.Dropout):
        q = self.claim_module(n)
        x = self.ref(n.args[0], n)
        if m.p == 0.0:
            return self.alias(n, x, reshape=False, may_copy=False)
        self.module_of[n.name] = q
        # The seed id depends on the module's name only, so a reference model can draw the same mask.
        self.emit(n, "dropout", [x], attrs={"p": float(m.p), "seed_id": zlib.crc32(q.encode())})

    def m_relu(self, n, m):
        self.emit(n, "relu", [self.ref(n.args[0], n)])

    def m_relu6(self, n, m):
        self.emit(n, "relu6", [self.ref(n.args[0], n)])

    def m_flatten(self, n, m: nn.Flatten):
        self.alias(n, self.ref(n.args[0], n), reshape=True)

    def m_identity(self, n, m):
        self.alias(n, self.ref(n.args[0], n), reshape=False, may_copy=False)

    # -- functions and methods ------------------------------------------------------------------------
    def f_add(self, n, *_):
        a, b = n.args[0], n.args[1]
        if n.kwargs.get("alpha", 1) != 1 or not all(isinstance(v, fx.Node) for v in (a, b)):
            raise self.fail(n, f"`{n.target}` with a constant or alpha", "Residual adds of two tensors only.")
        out = self.shape(n)
        refs = [self.ref(a, n), self.ref(b, n)]
        for k, t in enumerate((a, b)):  # a broadcast operand: expanded to a tensor of its own
            if tuple(self.values[t.name].shape) != out:
                if tuple(self.values[(b, a)[k].name].shape) != out:
                    raise self.fail(n, "an add where both operands broadcast", "One must have the output's shape.")
                refs[k] = self.emit(n, "expand", [refs[k]], name=f"{n.name}_expand", shape=out,
                                    attrs={"shape": list(out)})
        self.emit(n, "add", refs)

    def f_cat(self, n, *_):
        tensors = n.args[0]
        dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)
        dim = dim % len(self.shape(n))
        self.emit(n, "cat", [self.ref(t, n) for t in tensors], attrs={"dim": dim})

    def f_view(self, n, *_):
        self.alias(n, self.ref(n.args[0], n), reshape=True)

    def f_same(self, n, *_):
        self.alias(n, self.ref(n.args[0], n), reshape=False)

    def f_relu(self, n, *_):
        self.emit(n, "relu", [self.ref(n.args[0], n)])

    def f_relu6(self, n, *_):
        self.emit(n, "relu6", [self.ref(n.args[0], n)])

    def f_maxpool(self, n, *_):
        a = dict(zip(["input", "kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices"], n.args))
        a.update(n.kwargs)
        if a.get("return_indices"):
            raise self.fail(n, "F.max_pool2d(return_indices=True)")
        self.maxpool(n, self.ref(a["input"], n), a["kernel_size"], a.get("stride"), a.get("padding", 0),
                     a.get("dilation", 1), a.get("ceil_mode", False))

    def f_avgpool(self, n, *_):
        a = dict(zip(["input", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad",
                      "divisor_override"], n.args))
        a.update(n.kwargs)
        self.avgpool(n, self.ref(a["input"], n), a["kernel_size"], a.get("stride"), a.get("padding", 0),
                     a.get("ceil_mode", False), a.get("count_include_pad", True), a.get("divisor_override"))

    def f_adaptive(self, n, *_):
        self.adaptive(n, self.ref(n.args[0], n))


_MODULES: dict[type, Callable] = {
    nn.Conv2d: _Builder.m_conv, nn.Linear: _Builder.m_linear, nn.BatchNorm2d: _Builder.m_bn,
    nn.MaxPool2d: _Builder.m_maxpool, nn.AvgPool2d: _Builder.m_avgpool,
    nn.AdaptiveAvgPool2d: _Builder.m_adaptive, nn.Dropout: _Builder.m_dropout, nn.ReLU: _Builder.m_relu,
    nn.ReLU6: _Builder.m_relu6, nn.Flatten: _Builder.m_flatten, nn.Identity: _Builder.m_identity,
    nn.Embedding: _Builder.m_embedding, nn.LayerNorm: _Builder.m_layernorm, nn.GELU: _Builder.m_gelu,
    nn.Tanh: _Builder.m_tanh, nn.Softmax: _Builder.m_softmax,
}
_FUNCTIONS: dict[Any, Callable] = {
    operator.add: _Builder.f_add, operator.iadd: _Builder.f_add, torch.add: _Builder.f_add,
    torch.cat: _Builder.f_cat, torch.concat: _Builder.f_cat, torch.flatten: _Builder.f_view,
    torch.reshape: _Builder.f_view, F.relu: _Builder.f_relu, torch.relu: _Builder.f_relu,
    F.relu6: _Builder.f_relu6, F.max_pool2d: _Builder.f_maxpool, F.avg_pool2d: _Builder.f_avgpool,
    F.adaptive_avg_pool2d: _Builder.f_adaptive, F.gelu: _Builder.f_gelu, torch.tanh: _Builder.f_tanh,
    F.tanh: _Builder.f_tanh, F.softmax: _Builder.f_softmax, torch.softmax: _Builder.f_softmax,
    F.scaled_dot_product_attention: _Builder.f_sdpa, torch.matmul: _Builder.f_matmul,
    operator.matmul: _Builder.f_matmul, torch.bmm: _Builder.f_matmul, operator.mul: _Builder.f_scale,
    torch.mul: _Builder.f_scale, operator.truediv: _Builder.f_scale, torch.div: _Builder.f_scale,
    torch.arange: _Builder.f_arange, operator.getitem: _Builder.f_getitem, torch.transpose: _Builder.f_transpose,
    torch.permute: _Builder.f_permute, torch.unsqueeze: _Builder.f_view,
}
_METHODS: dict[str, Callable] = {
    "view": _Builder.f_view, "reshape": _Builder.f_view, "flatten": _Builder.f_view,
    "contiguous": _Builder.f_same, "relu": _Builder.f_relu, "add": _Builder.f_add, "add_": _Builder.f_add,
    "relu_": _Builder.f_relu, "transpose": _Builder.f_transpose, "permute": _Builder.f_permute,
    "unsqueeze": _Builder.f_view, "matmul": _Builder.f_matmul, "bmm": _Builder.f_matmul,
    "softmax": _Builder.f_softmax, "tanh": _Builder.f_tanh, "mul": _Builder.f_scale, "div": _Builder.f_scale,
}


_OPERATORS = {"add": "+", "iadd": "+=", "mul": "*", "truediv": "/", "matmul": "@", "getitem": "[] (indexing)"}


def _function_name(fn) -> str:
    module, name = getattr(fn, "__module__", "") or "", getattr(fn, "__name__", str(fn))
    if module in ("operator", "_operator"):
        return _OPERATORS.get(name, f"operator.{name}")
    if getattr(F, name, None) is fn:
        return f"F.{name}"
    if getattr(torch, name, None) is fn:
        return f"torch.{name}"
    return f"{module}.{name}"


def supported_text() -> str:
    """The constructs the tables above map, in words: what an unsupported-op error offers instead."""
    modules = ", ".join(sorted(m.__name__ for m in _MODULES))
    functions = ", ".join(sorted(dict.fromkeys(_function_name(f) for f in _FUNCTIONS)))
    methods = ", ".join(f".{m}" for m in sorted(_METHODS))
    return f"modules: {modules}; functions: {functions}; methods: {methods}"


SUPPORTED = supported_text()


def _holds_tensor(value) -> bool:
    """A tensor, or a tuple/list holding one (x.split(...)): not a constant of the trace."""
    if isinstance(value, (tuple, list)):
        return any(_holds_tensor(v) for v in value)
    return isinstance(value, torch.Tensor)


def trace_forward(model: nn.Module, example: torch.Tensor, input_high: int | None = None) -> ForwardGraph:
    """Trace `model` and lower its forward pass to registry ops, with shapes from one run on `example`
    (int64 token ids in [0, input_high) for a transformer)."""
    traced = trace_model(model, example)
    gm, values = traced.gm, traced.values
    b = _Builder(gm, values)
    in_dtype = {torch.float32: "float32", torch.int64: "int64"}.get(example.dtype)
    if in_dtype is None:
        raise UnsupportedModelError(f"the model input has dtype {example.dtype}; edgetrain takes float32 data or "
                                    "int64 token ids")
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != 1:
        raise UnsupportedModelError(f"forward() takes {len(placeholders)} tensor inputs; edgetrain supports exactly one.")
    output: TensorRef | None = None
    for n in gm.graph.nodes:
        value = values.get(n.name)
        if n.op == "placeholder":
            b.nodes.append(Node(name="input", kind="input", op="input", shape=tuple(example.shape), dtype=in_dtype,
                                source="the data batch"))
            b.refs[n.name] = TensorRef("input")
            b.shapes["input"] = tuple(example.shape)
        elif n.op == "output":
            out = n.args[0]
            if not isinstance(out, fx.Node) or out.name not in b.refs:
                raise UnsupportedModelError(f"forward() must return one tensor, got `{out}` ({_node_source(n)}).")
            output = b.refs[out.name]
        elif n.op in ("call_method", "call_function") and not _holds_tensor(value):
            continue  # x.size(0), x.shape[1]: constants of this trace, folded into the view shapes
        elif n.op == "call_module":
            m = b.modules[n.target]
            handler = _MODULES.get(type(m))
            if handler is None:
                raise b.fail(n, f"module `{type(m).__name__}` (`{n.target}`)")
            handler(b, n, m)
        elif n.op == "call_function":
            handler = _FUNCTIONS.get(n.target)
            if handler is None:
                raise b.fail(n, f"function `{getattr(n.target, '__module__', '')}.{getattr(n.target, '__name__', n.target)}`")
            handler(b, n)
        elif n.op == "call_method":
            handler = _METHODS.get(n.target)
            if handler is None:
                raise b.fail(n, f"method `Tensor.{n.target}`")
            handler(b, n)
        else:  # get_attr: a parameter or buffer used directly in forward()
            raise b.fail(n, f"direct use of attribute `{n.target}`", "Wrap it in a supported module.")
    assert output is not None
    params = {k: TensorSpec(tuple(v.shape)) for k, v in model.named_parameters()}
    used = {p for nd in b.nodes for p in nd.params}
    shared = sorted(used - set(params))  # named_parameters() lists a tied parameter once
    if shared:
        raise UnsupportedModelError(
            f"parameters {shared[:5]} are shared with another module (tied weights, e.g. an LM head tied to "
            "the token embedding): SGD would update them twice. Give each module its own parameter."
        )
    unused = sorted(set(params) - used)
    if unused:
        raise UnsupportedModelError(
            f"parameters {unused[:5]} are not used by any supported op in forward(); edgetrain would never "
            "update them. Remove them or freeze them outside the model."
        )
    buffers = {k: TensorSpec(tuple(v.shape), "int64" if v.dtype == torch.int64 else "float32")
               for k, v in model.named_buffers()}
    out_shape = tuple(values[[n for n in gm.graph.nodes if n.op == "output"][0].args[0].name].shape)
    return ForwardGraph(nodes=b.nodes, output=output, params=params, buffers=buffers,
                        input_shape=tuple(example.shape), output_shape=out_shape, module_of=b.module_of,
                        input_dtype=in_dtype, input_high=input_high if in_dtype == "int64" else None)
