"""A node's ops as the C op table's checks and the C code generator see them: each op's arguments bound to
their schema names, tensor operands as meta tensors laid out as the C runtime's arena lays them out."""
from __future__ import annotations

from math import prod

import torch

from edgetrain.runtime.python.aten_call import apply_view, resolve

from edgetrain.compiler.graph.ir import Node, TensorRef, TrainingGraph  # the graph it binds

from .ops import AUX_ITEMS, LAYER_NORM, STATS_OPS, OpCase


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


def state_shapes(g: TrainingGraph) -> dict[str, tuple]:
    """(shape, dtype) of every parameter and buffer."""
    return {name: (s.shape, s.dtype) for name, s in {**g.params, **g.buffers}.items()}
