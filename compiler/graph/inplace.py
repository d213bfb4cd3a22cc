"""In-place execution as a fact of the graph: a node whose output may take the bytes of an operand that dies there.

A backend says which of an op's arguments its kernel may overwrite with the output (`table`: op -> argument
positions, each read element by element before that element is written: runtime/python/inplace.py's twins and
out= variants, codegen/c/ops.py's kernels). `mark_in_place` records, per node, the operand whose bytes its output
takes (`attrs["into"]`, the operand's index) where that operand

- has a fixed life that ends at this node (its last reader; a decision tensor may be kept or recomputed, so
  whether it dies here is the schedule's choice, not the graph's),
- is a plain tensor of a node that holds one output (not seen through a view, not an item of a tuple, not the
  input batch nor the labels), read once by the node, and no op fused after it reads it,
- has the output's shape and dtype.

A node whose one output is dropped into its workspace (a gradient its fused optimizer step reads, `keep: none`)
records no shape: its output is the operand's shape and dtype where the op says so (`dropped_output_bytes`), so a
gradient accumulated by addmm or index_put ends in the accumulator's buffer.

Every memory model counts it alike: the output adds no bytes at its node (liveness `shared`, the validator,
the Python runtime's ledger, the C arena's offsets), and the operand's free that ends the stage releases none.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from .ir import TrainingGraph
from .liveness import analyze


def _arg_inputs(args: list, positions: tuple[int, ...]) -> list[int]:
    """The node's input indices passed as plain tensors at `positions` of the op's arguments, in that order."""
    out = []
    for j in positions:
        a = args[j] if j < len(args) else None
        if isinstance(a, dict) and set(a) == {"$t"} and isinstance(a["$t"], int):
            out.append(a["$t"])
    return out


def _then_reads(attrs: dict, k: int) -> bool:
    """Whether an op fused after the node's own reads its input k."""
    def walk(x) -> bool:
        if isinstance(x, dict):
            return x.get("$t") == k or any(walk(v) for v in x.values())
        if isinstance(x, list):
            return any(walk(v) for v in x)
        return False
    return walk(attrs.get("then", []))


def dropped_output_bytes(n) -> int:
    """The bytes of a node's one output that it drops into its workspace (`keep: none`, no shape recorded), the
    kernel scratch aside; 0 for any other node."""
    if n.attrs.get("keep") != "none" or n.items is not None or n.shape is not None:
        return 0
    return n.workspace_bytes - n.attrs.get("scratch", 0)


def _dropped_like(n, p) -> bool:
    """A dropped output has operand `p`'s shape and dtype: index_put's is its first argument's; addmm's first
    argument broadcasts to its 2-D output and shares its dtype, so a 2-D one as large is the output's shape."""
    if dropped_output_bytes(n) != p.bytes or p.shape is None:
        return False
    return n.op == "aten.index_put.default" or (n.op == "aten.addmm.default" and len(p.shape) == 2)


def candidates(g: TrainingGraph, table: Mapping[str, tuple[int, ...]]) -> dict[int, int]:
    """Stage -> the input index whose bytes node t's output takes, by the rule above (the first allowed)."""
    lv = analyze(g)
    decision = set(lv.decision)
    index = {n.name: t for t, n in enumerate(g.nodes)}
    out: dict[int, int] = {}
    for t, n in enumerate(g.nodes):
        positions = table.get(n.op)
        dropped = dropped_output_bytes(n) > 0
        if not positions or n.items is not None or (n.shape is None and not dropped) \
                or n.kind in ("input", "labels"):
            continue
        names = [r.name for r in n.inputs]
        for k in _arg_inputs(n.attrs.get("args", []), positions):
            if k >= len(n.inputs):
                continue
            r = n.inputs[k]
            p = g.nodes[index[r.name]] if r.name in index else None
            if (p is None or r.view or names.count(r.name) != 1 or r.name in decision or lv.end.get(r.name) != t
                    or p.kind in ("input", "labels") or p.items is not None
                    or (not _dropped_like(n, p) if dropped else p.shape != n.shape or p.dtype != n.dtype)
                    or _then_reads(n.attrs, k) or r.name == n.aux_of):
                continue
            out[t] = k
            break
    return out


def mark_in_place(g: TrainingGraph, table: Mapping[str, tuple[int, ...]]) -> TrainingGraph:
    """`g` with `attrs["into"]` on every node whose output may take a dying operand's bytes (a new graph)."""
    spots = candidates(g, table)
    nodes = [replace(n, attrs={**{k: v for k, v in n.attrs.items() if k != "into"},
                               **({"into": spots[t]} if t in spots else {})})
             for t, n in enumerate(g.nodes)]
    return replace(g, nodes=nodes)
