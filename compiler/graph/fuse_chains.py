"""Pointwise chains as single nodes, for plans whose runtime runs them as generated kernels (`--fuse`).

A pointwise op (torch's own `pointwise` tag) whose output only one pointwise op of the same kind reads, as it is,
joins that op's node: the fused node computes the chain in one kernel (runtime/python/fused_kernels.py), so the
tensors between never exist, and the scheduler keeps, recomputes or pages the chain as one. Its output is the
last op's; its operands are the chain's outside operands. Its cost: on a measured target (`host`) the profiler
times the node as the runtime runs it, the generated kernel included, so a recompute costs what the fused chain
costs; on a profile's FLOP rate it is the chain's FLOPs summed (the arithmetic fusing does not change; the memory
traffic it saves is not in that model).

A fused plan of a model with 2-D convolutions also holds their weights channels-last (`channels_last_convolutions`;
runtime/python/memory_format.py), so its convolutions, batch norms and activations run in the layout inductor
would pick for them; the profiler times the nodes in that layout, so the schedule's costs are those it runs.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import replace
from functools import lru_cache

import torch

from edgetrain.runtime.python import aten_call
from edgetrain.runtime.python.fused_kernels import FUSED_OP
from edgetrain.runtime.python.kernel_scratch import (CONVOLUTION_BACKWARD, MASK_AT, channels_last_applies,
                                                     channels_last_backward_extra)
from edgetrain.runtime.python.memory_format import CHANNELS_LAST

from .fusion import remap_operands
from .ir import Node, TrainingGraph

# A node's attrs beyond the op's call (keep, aux, updates, ...): a node with any of them stays as it is.
_CALL_ONLY = frozenset({"args", "kwargs"})
_MARKERS_ALLOWED = ("$t", "$p", "$b", "$dtype", "$device", "$layout", "$mf", "$float")


@lru_cache(maxsize=None)
def _pointwise(op: str) -> bool:
    try:
        return torch.Tag.pointwise in aten_call.resolve(op).tags
    except KeyError:
        return False


def _plain_markers(v) -> bool:
    """Whether an argument template holds only operands, parameters, buffers and literals (no aux item, no
    fresh empty tensor)."""
    if isinstance(v, dict):
        if any(k.startswith("$") for k in v):
            return any(k in v for k in _MARKERS_ALLOWED)
        return all(_plain_markers(x) for x in v.values())
    if isinstance(v, (list, tuple)):
        return all(_plain_markers(x) for x in v)
    return True


def fusible(n: Node) -> bool:
    """A pointwise op whose node is its call alone: one output, nothing kept beside it, nothing updated."""
    return (n.kind in ("forward", "backward") and n.op.startswith("aten.") and _pointwise(n.op)
            and set(n.attrs) <= _CALL_ONLY and n.aux_of is None and n.items is None and n.shape is not None
            and not n.streamed and not n.updates and n.workspace_bytes == 0 and n.aux_bytes == 0
            and _plain_markers(n.attrs.get("args", [])) and _plain_markers(n.attrs.get("kwargs", {})))


def fuse_pointwise_chains(graph: TrainingGraph) -> tuple[TrainingGraph, dict[str, list[str]]]:
    """`graph` with each pointwise chain one node; also {fused node: the nodes it holds, in order}."""
    readers = Counter(r.name for n in graph.nodes for r in n.inputs)
    by_name = {n.name: n for n in graph.nodes}
    group: dict[str, list[str]] = {}  # a node's name -> the members of its chain so far (itself last)
    absorbed: set[str] = set()
    for n in graph.nodes:
        if not fusible(n):
            continue
        members: list[str] = []
        for r in n.inputs:
            p = by_name.get(r.name)
            if (p is not None and r.name not in absorbed and not r.view and fusible(p) and p.kind == n.kind
                    and readers[r.name] == 1 and r.name in group):
                members += group.pop(r.name)
                absorbed.add(r.name)
        group[n.name] = members + [n.name]
    chains = {k: v for k, v in group.items() if len(v) > 1}
    if not chains:
        return graph, {}
    nodes = []
    for n in graph.nodes:
        if n.name in absorbed:
            continue
        nodes.append(_fused(by_name, chains[n.name]) if n.name in chains else n)
    return replace(graph, nodes=nodes), chains


def _fused(by_name: dict[str, Node], members: list[str]) -> Node:
    """One node computing `members` (in graph order) in one kernel."""
    order = sorted(members, key=list(by_name).index)
    at = {m: j for j, m in enumerate(order)}
    inputs: list = []
    chain = []
    for m in order:
        n = by_name[m]
        remap = {}
        for i, r in enumerate(n.inputs):
            if r.name in at and not r.view:
                remap[i] = {"$c": at[r.name]}
                continue
            if r not in inputs:
                inputs.append(r)
            remap[i] = {"$t": inputs.index(r)}
        step = {"op": n.op, "args": remap_operands(n.attrs.get("args", []), remap)}
        if n.attrs.get("kwargs"):
            step["kwargs"] = remap_operands(n.attrs["kwargs"], remap)
        chain.append(step)
    last = by_name[order[-1]]
    parts = [by_name[m] for m in order]
    return Node(name=last.name, kind=last.kind, op=FUSED_OP, inputs=tuple(inputs),
                params=tuple(dict.fromkeys(p for n in parts for p in n.params)),
                buffers=tuple(dict.fromkeys(b for n in parts for b in n.buffers)),
                attrs={"args": [{"$t": k} for k in range(len(inputs))], "chain": chain},
                shape=last.shape, dtype=last.dtype, flops=sum(n.flops for n in parts), source=last.source)


_CONVOLUTION = "aten.convolution.default"
# Views that read their tensor as rows in the default layout: a channels-last image refuses them.
_ROW_VIEWS = ("aten.view.default", "aten._unsafe_view.default")


def channels_last_convolutions(graph: TrainingGraph) -> TrainingGraph:
    """`graph` marked to hold its convolution weights channels-last where it has a 2-D convolution (a 4-D weight
    read by aten.convolution) and no operand views an image (or a convolution weight) of more than one pixel as
    rows (a flatten before a linear head: `view` cannot see a channels-last image so); unchanged otherwise."""
    weights = {name for name, spec in graph.params.items() if len(spec.shape) == 4}
    if not any(n.op == _CONVOLUTION and weights.intersection(n.params) for n in graph.nodes):
        return graph
    shapes = {n.name: n.shape for n in graph.nodes}
    for n in graph.nodes:
        seen = [(shapes.get(r.name), r.view) for r in n.inputs]
        seen += [(graph.params[p].shape, tuple(view)) for p, view in _param_views(n.attrs) if p in weights]
        if any(view and view[0][0] in _ROW_VIEWS and shape is not None and len(shape) == 4 and shape[2] * shape[3] > 1
               for shape, view in seen):
            return graph
    nodes = [_channels_last_scratch(n, graph) for n in graph.nodes]
    return replace(graph, nodes=nodes, memory_format=CHANNELS_LAST)


def _channels_last_scratch(n: Node, graph: TrainingGraph) -> Node:
    """`n` with its kernel scratch for channels-last operands (runtime/python/kernel_scratch.py): a convolution's
    backward making both gradients of a weight over more than one input channel holds one more weight."""
    a = n.attrs.get("args")
    if n.op != CONVOLUTION_BACKWARD or not a or len(a) <= MASK_AT:
        return n
    specs = [_spec(v, n, graph) for v in a[:3]]
    if any(s is None for s in specs) or not channels_last_applies(specs[1][0], bool(a[7]), a[MASK_AT]):
        return n
    extra = channels_last_backward_extra(*(size for _, size in specs))
    if not extra:
        return n
    # the runtime's ledger holds attrs["scratch"] while the kernel runs; the workspace counts it for the scheduler
    attrs = {**n.attrs, "scratch": n.attrs.get("scratch", 0) + extra}
    return replace(n, attrs=attrs, workspace_bytes=n.workspace_bytes + extra)


def _spec(v, n: Node, graph: TrainingGraph):
    """(shape, bytes) of an argument template's tensor: an operand ($t, or an item of a node of several) or a
    parameter ($p); None for anything else."""
    if isinstance(v, dict) and "$t" in v and not v.get("view"):
        ref = n.inputs[v["$t"]]
        src = graph.node(ref.name)
        if ref.view and len(ref.view) == 1 and ref.view[0][0] == "item" and src.items is not None:
            spec = src.items[ref.view[0][1]]
            return tuple(spec.shape), spec.bytes
        return None if ref.view or src.shape is None else (tuple(src.shape), src.bytes)
    if isinstance(v, dict) and "$p" in v and not v.get("view"):
        spec = graph.params[v["$p"]]
        return tuple(spec.shape), spec.bytes
    return None


def _param_views(v):
    """(parameter, its view chain) for each parameter an argument template reads through a view."""
    if isinstance(v, dict):
        if "$p" in v and v.get("view"):
            yield v["$p"], v["view"]
        for x in v.values():
            yield from _param_views(x)
    elif isinstance(v, (list, tuple)):
        for x in v:
            yield from _param_views(x)
