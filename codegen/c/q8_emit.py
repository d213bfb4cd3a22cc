"""The C statements of an int8 frozen prefix's nodes (compiler/graph/quantize.py): one kernel call each.

Its nodes are the graph pass's own ops; each carries its quantisation in attrs["q8"] (scales, zero points, the
per-channel Q31 multipliers and shifts). The multipliers and shifts become const tables in flash beside the int8
weights and int32 biases; the int8 tensors sit in the arena at word offsets like every other tensor, so the
kernels' word loads are aligned. A convolution's int16 scratch is its node's workspace, at `offsets[name +
".scratch"]`.
"""
from __future__ import annotations

from math import prod

from edgetrain.compiler.graph.quantize import (Q8_ADD, Q8_CONV, Q8_DEQUANTIZE, Q8_QUANTIZE, Q8_RELU,  # its ops
                                               Q8_RELU6)

from .emitters import EmitError, conv_shape
from .names import c_float


def scratch_elements(window: int) -> int:
    """runtime/c/kernels/q8_conv2d.c's et_q8_conv2d_scratch_size (int16 elements) for a window of `window` taps
    (c_in / groups * k_h * k_w): two output pixels' windows as int16, then one window's bytes."""
    return 2 * window + (window + 4) // 2


def q8_scratch_bytes(node, params: dict) -> int:
    """The bytes of int16 scratch an int8 node's kernel takes (a convolution's; 0 for the others)."""
    if node.op != Q8_CONV:
        return 0
    w = params[node.attrs["q8"]["weight"]]
    return 2 * scratch_elements(prod((w.shape if hasattr(w, "shape") else w["shape"])[1:]))


def requant_table(name: str, q8: dict, ident: str) -> dict:
    """A convolution's requantisation as the plan's const data: per-channel multipliers and shifts, its zero point."""
    return {"layer": name, "ident": ident, "mult": [int(v) for v in q8["mult"]], "shift": [int(v) for v in q8["shift"]],
            "zp": int(q8["zp"]), "channels": len(q8["mult"])}


def _q(off: int) -> str:
    return f"ET_Q({off})"


class _Node:
    """What an int8 node's emitter reads: the node, its operands' and output's arena word offsets, its count."""

    def __init__(self, node, offsets: dict[str, int]) -> None:
        self.node, self.q = node, node.attrs["q8"]
        self.x = offsets[node.inputs[0].name]
        self.b = offsets[node.inputs[1].name] if len(node.inputs) > 1 else None
        self.out, self.count = offsets[node.name], prod(node.shape)
        self.offsets = offsets


def _quantize(n: _Node, env) -> str:
    return f"et_q8_quantize({n.count}, ET_F({n.x}), {c_float(n.q['scale'])}, {n.q['zp']}, {_q(n.out)});"


def _dequantize(n: _Node, env) -> str:
    return f"et_q8_dequantize({n.count}, {_q(n.x)}, {c_float(n.q['scale'])}, {n.q['zp']}, ET_F({n.out}));"


def _add(n: _Node, env) -> str:
    q = n.q
    return (f"et_q8_add({n.count}, {_q(n.x)}, {c_float(q['a'][0])}, {q['a'][1]}, {_q(n.b)}, {c_float(q['b'][0])}, "
            f"{q['b'][1]}, {c_float(q['scale'])}, {q['zp']}, {_q(n.out)});")


def _relu(n: _Node, env) -> str:
    return f"et_q8_relu_forward({n.count}, {_q(n.x)}, {n.q['zp']}, {_q(n.out)});"


def _relu6(n: _Node, env) -> str:
    return f"et_q8_relu6_forward({n.count}, {_q(n.x)}, {n.q['zp']}, {n.q['q6']}, {_q(n.out)});"


def _conv(n: _Node, env) -> str:
    q, node = n.q, n.node
    ctx, shapes, params, tables, namer = env
    fields = conv_shape(shapes[node.inputs[0].name], params[q["weight"]]["shape"], node.shape, q)
    k = ctx.struct("et_conv2d_shape", None, fields)
    if node.name not in tables:
        tables[node.name] = requant_table(node.name, q, namer(node.name, "q"))
    bias = ctx.pident[q["bias"]] if q["bias"] else "NULL"
    return (f"et_q8_conv2d_forward({k}, {_q(n.x)}, {q['x_zp']}, {ctx.pident[q['weight']]}, {bias}, "
            f"&{tables[node.name]['ident']}, (int16_t *)(void *)ET_F({n.offsets[node.name + '.scratch']}), "
            f"{_q(n.out)});")


# The emitter of each op of codegen/c/ops.py's Q8_OPS.
Q8_EMITTERS = {Q8_QUANTIZE: _quantize, Q8_DEQUANTIZE: _dequantize, Q8_ADD: _add, Q8_RELU: _relu, Q8_RELU6: _relu6,
               Q8_CONV: _conv}


def emit_q8(node, offsets: dict[str, int], ctx, shapes: dict[str, tuple], params: dict, tables: dict,
            namer) -> list[str]:
    """`node`'s kernel call: its operands at the arena word `offsets`, `shapes` every node's shape, `params` the
    schedule's parameter specs, `tables` the requantisation tables made so far (a convolution's added)."""
    if node.op not in Q8_EMITTERS:
        raise EmitError(f"an int8 node of op {node.op} has no kernel")
    return [Q8_EMITTERS[node.op](_Node(node, offsets), (ctx, shapes, params, tables, namer))]
