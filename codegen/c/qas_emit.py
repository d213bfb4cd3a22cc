"""The C statements of int8 bias training's backward node (compiler/graph/qas_lower.py): the region's integer
backward and QAS update as runtime/python/int8_qas.py computes them, one kernel call a step.

From the float gradient at the region's boundary: `et_q8_grad_quantize` (int8, one scale), then over the tail in
reverse: ReLU/ReLU6 masks in place with the saved int8 outputs, a residual add passes its gradient on, a convolution
whose bias trains sums its bias gradient (`et_q8_bias_grad`) and moves its int32 bias at once (`et_q8_qas_sgd`; the
backward never reads a bias, so this is the reference's update after the backward), and one whose input the
gradient must reach requantises its output gradient per channel (`et_q8_grad_rescale`), sums the input gradient in
int32 (`et_q8_conv2d_backward_input_sums`) and quantises the sums by their largest magnitude (`et_q8_sums_quantize`).
The workspace (`qas_layout`) is two int8 gradient buffers used in turn, the int32 input sums and one bias's int32
sums, each its own lifetime for the arena planner (one block would leave gaps it cannot fill); the rescale tables
and the biases' scales s_x * s_w[oc] are const data in flash.
"""
from __future__ import annotations

from math import prod

import numpy as np

from edgetrain.compiler.graph.qas_lower import QAS_BACKWARD, needs_gradient
from edgetrain.compiler.graph.quantize import Q8_ADD, Q8_CONV, Q8_RELU, Q8_RELU6
from edgetrain.runtime.python.int8_qas import bias_scales, grad_rescale

from .emitters import EmitError, conv_shape
from .names import c_float


def _words(nbytes: int) -> int:
    return (nbytes + 3) // 4 * 4


def _shape(spec) -> tuple[int, ...]:
    return tuple(spec.shape if hasattr(spec, "shape") else spec["shape"])


QAS_BUFFERS = ("a", "b", "acc", "gb")  # the workspace's buffers, each its own lifetime in the arena


def qas_layout(node, node_of, params: dict) -> dict[str, int]:
    """The bytes of the node's workspace buffers, and "bytes", their sum: gradients "a" and "b" (int8, each the
    largest tail tensor's count, on whole words), "acc" (int32 input-gradient sums, the largest input a gradient
    must reach), "gb" (int32, the most output channels of a trained convolution)."""
    qas = node.attrs["qas"]
    tail, trained = qas["tail"], set(qas["trained"])
    need = needs_gradient(node_of, tail, trained)
    grad = max(prod(node_of(t).shape) for t in tail)
    acc = max((prod(node_of(node_of(t).inputs[0].name).shape) for t in tail
               if node_of(t).op == Q8_CONV and node_of(t).inputs[0].name in need), default=0)
    gb = max((_shape(params[node_of(t).attrs["q8"]["weight"]])[0] for t in tail
              if node_of(t).op == Q8_CONV and node_of(t).attrs["q8"]["bias"] in trained), default=0)
    out = {"a": _words(grad), "b": _words(grad), "acc": 4 * acc, "gb": 4 * gb}
    out["bytes"] = sum(out.values())
    return out


def gradient_floats(node, node_of) -> int:
    """The floats of the gradient the head hands the region each step (et_qas_grad_hook's count)."""
    return prod(node_of(node.attrs["qas"]["boundary"]).shape)


def qas_workspace_bytes(node, node_of, params: dict) -> int:
    return qas_layout(node, node_of, params)["bytes"]


def emit_qas(node, offsets: dict[str, int], ctx, node_of, params: dict, opt: dict, consts: list, namer) -> list[str]:
    """The node's statements; its operands at the arena word `offsets`, its workspace buffers at `offsets[name +
    "." + buffer]`; `consts` gathers the const arrays it reads (dicts: ident, ctype, values, comment)."""
    qas = node.attrs["qas"]
    tail, trained = qas["tail"], set(qas["trained"])
    need = needs_gradient(node_of, tail, trained)

    def buf(key: str, ctype: str) -> str:  # each buffer at its own arena word (lifetimes.transient_lifetimes)
        return f"({ctype} *)(void *)ET_F({offsets[f'{node.name}.{key}']})"

    def const(name: str, what: str, ctype: str, values) -> str:
        ident = namer(name, what)
        consts.append({"ident": ident, "ctype": ctype, "values": values, "comment": f"{name}: {what}"})
        return ident

    src = node_of(qas["boundary"]).inputs[0].name
    count = gradient_floats(node, node_of)
    lines = ["{", "    float s_g;",
             f"    if (et_qas_grad_hook != NULL) et_qas_grad_hook(ET_F({offsets[qas['grad']]}), {count}u);",
             f"    s_g = et_q8_grad_quantize({count}, ET_F({offsets[qas['grad']]}), {buf('a', 'int8_t')});"]
    cur, other = "a", "b"
    at = src  # the tensor whose gradient `cur` holds
    for t in reversed(tail):
        if t != at:
            if t in need:
                raise EmitError(f"the int8 region's gradient reaches `{t}` from two readers")
            continue
        n = node_of(t)
        q = n.attrs["q8"]
        count = prod(n.shape)
        if n.op in (Q8_RELU, Q8_RELU6):
            y = f"ET_Q({offsets[t]})"
            fn = (f"et_q8_relu6_backward({count}, {buf(cur, 'int8_t')}, {y}, {q['zp']}, {q['q6']}, {buf(cur, 'int8_t')});"
                  if n.op == Q8_RELU6 else
                  f"et_q8_relu_backward({count}, {buf(cur, 'int8_t')}, {y}, {q['zp']}, {buf(cur, 'int8_t')});")
            lines.append(f"    {fn} /* {t} */")
            at = n.inputs[0].name
        elif n.op == Q8_ADD:
            at = next(r.name for r in n.inputs if r.name in need)
        elif n.op == Q8_CONV:
            nb, c, h, w = n.shape
            if q["bias"] in trained:
                s_b = const(q["bias"], "sb", "float", [c_float(v) for v in bias_scales(q)])
                m = ctx.mident.get(q["bias"], "NULL")
                lines += [f"    et_q8_bias_grad({nb}, {c}, {h * w}, {buf(cur, 'int8_t')}, {buf('gb', 'int32_t')}); /* {t} */",
                          f"    et_q8_qas_sgd({c}, {buf('gb', 'int32_t')}, s_g, {s_b}, {c_float(opt['lr'])}, "
                          f"{c_float(opt['momentum'])}, {c_float(opt['weight_decay'])}, {ctx.pident[q['bias']]}, {m});"]
            x = n.inputs[0].name
            if x in need:
                mult, shift, ratio = grad_rescale(q["w_scales"])
                mi = const(t, "gm", "int32_t", [str(int(v)) for v in mult])
                si = const(t, "gs", "int32_t", [str(int(v)) for v in shift])
                k = ctx.struct("et_conv2d_shape", None, conv_shape(node_of(x).shape, _shape(params[q["weight"]]),
                                                                   n.shape, q))
                lines += [f"    et_q8_grad_rescale({nb}, {c}, {h * w}, {buf(cur, 'int8_t')}, {mi}, {si}, "
                          f"{buf(other, 'int8_t')});",
                          f"    et_q8_conv2d_backward_input_sums({k}, {buf(other, 'int8_t')}, {ctx.pident[q['weight']]}, "
                          f"{buf('acc', 'int32_t')});",
                          f"    s_g = et_q8_sums_quantize({prod(node_of(x).shape)}, {buf('acc', 'int32_t')}, "
                          f"s_g * {c_float(np.float32(ratio))}, {buf(other, 'int8_t')});"]
                cur, other = other, cur
            at = x
        else:
            raise EmitError(f"int8 bias training has no backward for {n.op} (`{t}`)")
    lines.append("}")
    return lines


# The emitter of int8 bias training's op (codegen/c/ops.py's Q8_OPS), beside q8_emit.py's Q8_EMITTERS.
QAS_EMITTERS = {QAS_BACKWARD: emit_qas}
