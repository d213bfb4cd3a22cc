"""Training batch norms that recompute from the statistics they kept (`--fuse` plans).

A training batch norm keeps its batch's mean and inverse standard deviation (2 x C floats, its aux) until its
backward reads them, so a recompute before then need not compute them again: it normalises from them in one
pointwise pass, y = x * alpha + beta with alpha = invstd * weight and beta = bias - mean * alpha. Where the batch
norm's one reader is a unary activation (ReLU6, ReLU, ...) that reads it as it is, the two become one node
named as the activation: its first computation is torch's batch norm and the activation in place on its output
(the statistics and the running-statistics updates torch's own, bit for bit), its recompute the normalise and
the activation as one kernel inductor generates (runtime/python/fused_kernels.py). A batch norm with another
reader becomes such a node alone, its recompute the normalise only.

The recompute reads the statistics while they are held: they are held from the first computation to the
backward, and the batch norm reads its parameters, so it is never recomputed after their update (at that
backward). Its kernel allocates its output and nothing else (tests/test_norm_recompute.py), so the memory model
counts it as it counts the node. Its cost: `recompute_flops` (the normalise pass and the activation) on a
profile's FLOP rate; on a measured target the profiler times the recompute as it runs (graph/profiler.py).
Normalising from alpha and beta is not torch's arithmetic bit for bit (its CPU kernel differs by up to 5e-7 on
an output): such a plan is checked within the fused tolerance, as every fused plan is.
"""
from __future__ import annotations

from dataclasses import replace

from edgetrain.runtime.python.fused_kernels import FUSED_OP
from edgetrain.runtime.python.inplace import INPLACE

from .fuse_chains import fusible
from .ir import Node, TrainingGraph, TensorRef

NORM_FORWARD = "aten._native_batch_norm_legit_functional.default"
_NORM_ATTRS = frozenset({"args", "kwargs", "keep", "aux", "updates"})
_ITEMS = 5  # the op's outputs: y, mean, invstd, new running mean, new running variance
# Activations that run in place on the batch norm's output in the first computation (their in-place twin is
# torch's same kernel); binary ops are left out (the other operand may broadcast into a larger output).
_UNARY = frozenset(op for op in INPLACE if op not in ("aten.add.Tensor", "aten.mul.Tensor"))


def _affine(n: Node) -> tuple[dict, dict] | None:
    """The weight and bias markers of a training batch norm this pass can take, or None."""
    a = n.attrs.get("args", [])
    if (n.op != NORM_FORWARD or not set(n.attrs) <= _NORM_ATTRS or n.attrs.get("kwargs") or n.attrs.get("keep") != 0
            or list(n.attrs.get("aux", ())) != [1, 2] or n.items is not None or n.shape is None
            or len(n.shape) < 2 or n.streamed or len(a) != 8 or a[0] != {"$t": 0} or a[5] is not True
            or len(n.inputs) != 1):
        return None
    w, b = a[1], a[2]
    if not all(isinstance(v, dict) and set(v) == {"$p"} for v in (w, b)):
        return None  # no affine parameters, or read through a view: left as it is
    return w, b


def _activation(a: Node, b: Node) -> bool:
    """Whether `a` is a unary activation reading batch norm `b`'s output as it is, and nothing else."""
    args = a.attrs.get("args", [])
    return (a.kind == "forward" and fusible(a) and a.op in _UNARY and a.inputs == (TensorRef(b.name),)
            and bool(args) and args[0] == {"$t": 0} and not a.attrs.get("kwargs")
            and all(not isinstance(v, dict) for v in args[1:]) and a.shape == b.shape and a.dtype == b.dtype)


def _normalise(b: Node, w: dict, bias: dict) -> list[dict]:
    """The normalise pass from the held statistics; the kernel's arguments: x, mean, invstd."""
    per_channel = [b.shape[1]] + [1] * (len(b.shape) - 2)
    return [{"op": "aten.mul.Tensor", "args": [{"$t": 2}, w]},  # 0: alpha = invstd * weight
            {"op": "aten.mul.Tensor", "args": [{"$t": 1}, {"$c": 0}]},  # 1: mean * alpha
            {"op": "aten.sub.Tensor", "args": [bias, {"$c": 1}]},  # 2: beta = bias - mean * alpha
            {"op": "aten.view.default", "args": [{"$c": 0}, per_channel]},
            {"op": "aten.view.default", "args": [{"$c": 2}, per_channel]},
            {"op": "aten.mul.Tensor", "args": [{"$t": 0}, {"$c": 3}]},
            {"op": "aten.add.Tensor", "args": [{"$c": 5}, {"$c": 4}]}]  # 6: x * alpha + beta


def _held(b: Node, a: Node | None, w: dict, bias: dict) -> Node:
    """Batch norm `b` (and its activation `a`) as one node whose recompute normalises from the statistics."""
    bn = {"op": b.op, "args": b.attrs["args"]}
    again = _normalise(b, w, bias)
    elements = 1
    for s in b.shape:
        elements *= s
    flops = 2 * elements  # a multiply and an add per element; alpha and beta are per channel
    chain = [bn]
    if a is not None:
        rest = a.attrs["args"][1:]
        chain += [{"op": INPLACE[a.op], "args": [{"$c": 0, "item": 0}, *rest]},
                  {"returns": [{"$c": 1}, *({"$c": 0, "item": i} for i in range(1, _ITEMS))]}]
        again.append({"op": a.op, "args": [{"$c": len(again) - 1}, *rest]})
        flops += a.flops
    last = a or b
    attrs = {"args": [{"$t": 0}], "chain": chain, "keep": 0, "aux": [1, 2],
             **({"updates": b.attrs["updates"]} if b.attrs.get("updates") else {}),
             "recompute": {"args": [{"$t": 0}, {"$aux": 0}, {"$aux": 1}], "chain": again}}
    return Node(name=last.name, kind="forward", op=FUSED_OP, inputs=b.inputs, params=b.params, buffers=b.buffers,
                attrs=attrs, shape=last.shape, dtype=last.dtype, aux_bytes=b.aux_bytes,
                workspace_bytes=b.workspace_bytes + (a.workspace_bytes if a else 0),
                flops=b.flops + (a.flops if a else 0), source=last.source, recompute_flops=flops)


def hold_norm_statistics(graph: TrainingGraph) -> tuple[TrainingGraph, dict[str, list[str]]]:
    """`graph` with each training batch norm (with its unary activation, where that alone reads it) one node
    whose recompute normalises from the statistics it kept; also {new node: the nodes it holds, in order}."""
    readers: dict[str, list[Node]] = {}
    for n in graph.nodes:
        for r in n.inputs:
            readers.setdefault(r.name, []).append(n)
    made: dict[str, Node] = {}  # the name whose place a new node takes -> the node
    gone: set[str] = set()
    renamed: dict[str, str] = {}  # a batch norm's name -> the node keeping its statistics now
    held: dict[str, list[str]] = {}
    for b in graph.nodes:
        wb = _affine(b)
        if wb is None:
            continue
        rd = readers.get(b.name, [])
        a = rd[0] if len(rd) == 1 and _activation(rd[0], b) else None
        node = _held(b, a, *wb)
        made[node.name] = node
        if a is not None:
            gone.add(b.name)
            renamed[b.name] = a.name
        held[node.name] = [b.name] + ([a.name] if a is not None else [])
    if not held:
        return graph, {}
    nodes = []
    for n in graph.nodes:
        if n.name in gone:
            continue
        n = made.get(n.name, n)
        nodes.append(replace(n, aux_of=renamed[n.aux_of]) if n.aux_of in renamed else n)
    return replace(graph, nodes=nodes), held
