"""int8 bias training (QAS) lowered into the training graph: the region's float backward replaced by one node.

`quantize.qas_region` finds the region (an int8 frozen prefix, then convolutions whose bias alone trains, ReLU/ReLU6
and residual adds); this pass removes the float backward nodes of that region's tail (the convolution backwards
that make the trained biases' gradients and carry the gradient up, the activation backwards between them), makes
the whole region int8 (`quantize_frozen`: the boundary the float head reads dequantised) and adds one node,
QAS_BACKWARD, in their place. It reads the float gradient the head hands the boundary and the int8 activations the
backward masks with (so the scheduler keeps them live until it runs), runs the integer backward of
runtime/python/int8_qas.py and moves the int32 biases by their QAS SGD step in place. Its workspace (the int8
gradients, the int32 input-gradient sums and bias sums) is its op's layout (codegen/c/qas_emit.py), counted by the
backend before scheduling. Pure functions.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..errors import UnsupportedModelError
from .ir import Node, TensorRef, TrainingGraph
from .quantize import ADD, CONV, Quantized, qas_biases, quantize_frozen

QAS_BACKWARD = "edgetrain.qas_backward.default"
QAS_NODE = "qas_backward"


def needs_gradient(node_of, tail, trained) -> set[str]:
    """The tail tensors a gradient must reach (int8_qas.needs_grad's rule on the graph): a trained convolution's
    output and every output of a node reading one. `node_of`: name -> node (int8 or float)."""
    need: set[str] = set()
    for t in tail:
        n = node_of(t)
        if "q8" in n.attrs:
            bias = n.attrs["q8"].get("bias")
        else:
            bias = (n.attrs["args"][2] or {}).get("$p") if n.op == CONV else None
        if (bias is not None and bias in set(trained)) or any(r.name in need for r in n.inputs):
            need.add(t)
    return need


def _tail_backward(g: TrainingGraph, tail: tuple[str, ...], trained: tuple[str, ...]) -> list[str]:
    """The float backward nodes of the tail: those reading a tail convolution's weight or updating a trained bias,
    and every backward node reading one of them (the activation backwards between)."""
    weights = {g.node(t).attrs["args"][1]["$p"] for t in tail if g.node(t).op.endswith("convolution.default")}
    out: list[str] = []
    for n in g.nodes:
        if n.kind != "backward":
            continue
        ups = {u.get("param") for u in n.attrs.get("updates", ())} | set(n.updates)
        if set(n.params) & weights or ups & set(trained) or any(r.name in out for r in n.inputs):
            out.append(n.name)
    return out


def lower_qas(g: TrainingGraph, prefix: tuple[str, ...], tail: tuple[str, ...],
              ranges: dict[str, tuple[float, float]], weights) -> Quantized:
    """`g` with prefix and tail in int8 and the tail's float backward replaced by one QAS_BACKWARD node (module
    docstring); the region from `quantize.qas_or_error`, `ranges` from `calibrate` over prefix + tail."""
    trained = qas_biases(g, tail)
    removed = _tail_backward(g, tail, trained)
    gone = set(removed)
    grads = list(dict.fromkeys(r.name for name in removed for r in g.node(name).inputs
                               if r.name not in gone and g.node(r.name).kind == "backward"))
    if len(grads) != 1:
        raise UnsupportedModelError(f"--int8-biases: the int8 region's backward starts from {len(grads)} float "
                                    "gradients; it takes one (the region handing the float head one tensor): train "
                                    "the biases of the last blocks only, or drop the flag")
    for n in g.nodes:
        if n.name not in gone and any(r.name in gone for r in n.inputs):
            raise UnsupportedModelError(f"--int8-biases: node `{n.name}` ({n.op}) reads the int8 region's float "
                                        "backward; train fewer layers' biases, or drop the flag")
    for t in tail:  # one gradient a tensor: an add passes its gradient on to one operand that needs it
        n = g.node(t)
        if n.op == ADD and sum(r.name in needs_gradient(g.node, tail, trained) for r in n.inputs) > 1:
            raise UnsupportedModelError(f"--int8-biases: the residual add `{t}` passes its gradient to two trained "
                                        "operands; train the biases after it only, or drop the flag")
    q = quantize_frozen(replace(g, nodes=[n for n in g.nodes if n.name not in gone]), prefix + tail, ranges, weights)
    qg = q.graph
    boundary = next(n.name for n in qg.nodes if n.op.endswith("q8_dequantize.default") and n.inputs[0].name in tail)
    masks = [t for t in tail if qg.node(t).op.split(".")[1] in ("q8_relu", "q8_relu6")]
    convs = [t for t in tail if qg.node(t).op.endswith("q8_conv2d.default")]
    params = tuple(dict.fromkeys(p for t in convs for p in (qg.node(t).attrs["q8"]["weight"],
                                                                 qg.node(t).attrs["q8"]["bias"]) if p))
    need = needs_gradient(qg.node, tail, trained)
    # const data in flash: per output channel a Q31 multiplier and a shift where the gradient goes on up, a float
    # scale s_x * s_w[oc] where the bias trains
    table = sum(qg.node(t).shape[1] * (8 * (qg.node(t).inputs[0].name in need)
                                       + 4 * (qg.node(t).attrs["q8"]["bias"] in trained)) for t in convs)
    flops = sum(2 * int(np.prod(qg.node(t).shape)) * int(np.prod(qg.params[qg.node(t).attrs["q8"]["weight"]].shape[1:]))
                for t in convs)
    node = Node(QAS_NODE, "backward", QAS_BACKWARD,
                tuple(TensorRef(x) for x in (grads[0], *masks)), params=params, shape=None, dtype="int8",
                attrs={"qas": {"tail": list(tail), "boundary": boundary, "grad": grads[0], "trained": list(trained),
                                "table_bytes": table}},
                flops=flops)
    at = next(i for i, n in enumerate(qg.nodes) if n.name == grads[0]) + 1
    return Quantized(q.nodes, replace(qg, nodes=[*qg.nodes[:at], node, *qg.nodes[at:]]), q.values)
