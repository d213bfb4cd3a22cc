"""Fusion for the scheduler: ops that always travel together become one schedulable node.

A node of the captured graph that holds nothing (a weight or bias gradient applied at once, a running-statistics
update) runs with a neighbour, so the POET model sees about one backward stage per layer, as many as a graph
with hand-written backward rules has.
"""
from __future__ import annotations

from .ir import Node


def _holds_nothing(n: Node) -> bool:
    a = n.attrs
    return (a.get("keep") in ("none", []) and not a.get("aux") and n.aux_of is None and "seed_key" not in a
            and "loss_item" not in a and "then" not in a)


def _costs_memory(prev: Node, n: Node, sizes: dict[str, int], dies: set[str]) -> bool:
    """Whether running `n` fused after `prev` holds more at once than running them apart would: fused, every
    operand of both is held with prev's output and the larger workspace; apart, `n` runs after prev's operands
    that nobody reads later (`dies`) are freed (a first layer's weight gradient, whose convolution scratch would
    otherwise stand beside the batch norm's operands above it)."""
    mine = {r.name for r in prev.inputs}
    theirs = {r.name for r in n.inputs if r.name != prev.name}
    held = lambda names: sum(sizes.get(x, 0) for x in names)  # noqa: E731
    fused = held(mine | theirs) + max(prev.transient_bytes, n.transient_bytes)
    apart = max(held(mine) + prev.transient_bytes, held((mine - dies) | theirs) + n.transient_bytes)
    return fused > apart


def fuse_updates(nodes: list[Node], widen: bool = True, sizes: dict[str, int] | None = None) -> list[Node]:
    """A backward node that holds nothing (a weight gradient applied at once) runs right after the node before
    it, as one schedulable node: the scheduler sees about one backward stage per layer. A forward node that
    holds nothing (a running-statistics update, which reads only buffers) runs after the first backward node:
    fused into a forward node it would give that node a transient to count on every recompute.

    The fused node runs its own op first (so a parameter it reads is read before the fused op updates it),
    then each fused op; its workspace is the largest transient of the ops, counted beside its held output.
    `widen` False fuses a backward op only when it reads nothing its neighbour does not (a first layer's weight
    gradient would otherwise keep the input batch alive through the layer above's backward): for small graphs,
    where every byte counts and the scheduler's model is small anyway. Either way a fused op would not hold more
    at once than the two apart (`_costs_memory`; `sizes`: bytes of tensors made outside `nodes`, the batch).
    """
    sizes = {**(sizes or {}), **{n.name: n.bytes for n in nodes}}
    last_read: dict[str, int] = {}
    for i, n in enumerate(nodes):
        for r in n.inputs:
            last_read[r.name] = i
    out: list[Node] = []
    deferred: list[Node] = []
    for i, n in enumerate(nodes):
        prev = out[-1] if out else None
        if _holds_nothing(n) and n.kind == "forward" and not any(r.name for r in n.inputs):
            deferred.append(n)
            continue
        if (prev is not None and _holds_nothing(n) and n.kind == prev.kind == "backward"
                and "seed_key" not in prev.attrs
                and (widen or all(r in prev.inputs or r.name == prev.name for r in n.inputs))
                and not _costs_memory(prev, n, sizes, {x for x, k in last_read.items() if k < i})):
            out[-1] = _merge(prev, n)
            continue
        out.append(n)
        if deferred and n.kind == "backward":
            for d in deferred:
                out[-1] = _merge(out[-1], d)
            deferred = []
    return out + deferred


def _merge(prev: Node, n: Node) -> Node:
    """`prev` running `n`'s op after its own."""
    inputs = list(prev.inputs)
    remap = {}
    for i, r in enumerate(n.inputs):
        if r.name == prev.name:  # the fused node's own output, just made
            remap[i] = {"$own": True, **({"view": [list(v) for v in r.view]} if r.view else {})}
            continue
        if r not in inputs:
            inputs.append(r)
        remap[i] = {"$t": inputs.index(r)}
    sub = {"op": n.op, "args": remap_operands(n.attrs["args"], remap), "keep": "none"}
    if n.attrs.get("kwargs"):
        sub["kwargs"] = remap_operands(n.attrs["kwargs"], remap)
    if n.attrs.get("updates"):
        sub["updates"] = n.attrs["updates"]
    if n.attrs.get("scratch"):
        sub["scratch"] = n.attrs["scratch"]
    attrs = dict(prev.attrs)
    attrs["then"] = list(prev.attrs.get("then", [])) + [sub]
    # the ops run one after another, each with its own transient: the fused node's is the largest of them
    workspace = max(prev.workspace_bytes, n.workspace_bytes)
    transient = max(prev.transient_bytes, n.transient_bytes)
    return Node(
        name=prev.name, kind=prev.kind, op=prev.op, inputs=tuple(inputs),
        params=tuple(dict.fromkeys(prev.params + n.params)), buffers=tuple(dict.fromkeys(prev.buffers + n.buffers)),
        attrs=attrs, shape=prev.shape, dtype=prev.dtype, items=prev.items, aux_bytes=prev.aux_bytes,
        aux_of=prev.aux_of, workspace_bytes=workspace, update_temporary_bytes=transient - workspace,
        flops=prev.flops + n.flops, updates=tuple(dict.fromkeys(prev.updates + n.updates)), source=prev.source)


def remap_operands(template, remap: dict[int, dict]):
    if isinstance(template, dict):
        if "$t" in template:
            return remap[template["$t"]]
        return {k: remap_operands(v, remap) for k, v in template.items()}
    if isinstance(template, list):
        return [remap_operands(v, remap) for v in template]
    return template
