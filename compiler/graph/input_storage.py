"""The input batch read from storage patch by patch, never whole in RAM, where only patch-by-patch nodes read it.

A frozen prefix computed tile by tile (tiling.py) reads its input through gathers: each tile copies its
receptive field (with the halo and zero padding) into a patch buffer. When every reader of the input batch is
such a node and every one of its reads of the batch is such a copy, a runtime that reads the batch where it
lies (the C firmware: its driver hands the plan a reader of the data file) never holds the batch whole: the
input node is marked `in_storage` and holds 0 B (ir.Node.bytes), so the schedule, the ledger and the arena
leave it out, and the bytes each computation of its readers reads are reported like streamed weights.
Pure functions: nothing here solves or reads files.
"""
from __future__ import annotations

import json
from dataclasses import replace

from .ir import IN_STORAGE, Node, TrainingGraph
from .tiling import DIRECT, TILED_OP, tileable_stages


def input_node(g: TrainingGraph) -> Node | None:
    return next((n for n in g.nodes if n.kind == "input"), None)


def _plan(n: Node) -> dict:
    return json.loads(n.attrs["args"][2])


def readable_from_storage(g: TrainingGraph) -> bool:
    """Whether the input batch is read only by patch-by-patch nodes, each of its reads a gathered patch."""
    x = input_node(g)
    if x is None or x.dtype != "float32" or x.shape is None or len(x.shape) != 4:
        return False
    readers = [n for n in g.nodes if any(r.name == x.name for r in n.inputs)]
    return bool(readers) and all(n.op == TILED_OP and not any(r.view for r in n.inputs) and n.inputs[0].name == x.name
                                 and len(n.inputs) == 1 and _gathers_copy(_plan(n)) for n in readers)


def _gathers_copy(plan: dict) -> bool:
    """Every read of the input a patch of its own: a gathered copy, or an int8 plan's quantisation of its crop."""
    return all(gt["copy"] or op["op"] in DIRECT for tile in plan["tiles"]
               for op, step in zip(plan["ops"], tile["steps"]) for gt in step if gt["from"] == 0)


def with_input_in_storage(g: TrainingGraph) -> TrainingGraph:
    """`g` with its input batch marked as read from storage (0 B in RAM) where `readable_from_storage`; else `g`."""
    x = input_node(g)
    if x is None or x.attrs.get(IN_STORAGE) or not readable_from_storage(g):
        return g
    marked = replace(x, attrs={**x.attrs, IN_STORAGE: True})
    return replace(g, nodes=[marked if n is x else n for n in g.nodes])


def tiles_can_read_input(g: TrainingGraph) -> bool:
    """Whether a tiling of `g`'s frozen forward prefix could read the input batch patch by patch alone (every
    reader of it a stage the tiling may replace): no plan then needs the batch whole in RAM. True where it is read
    from storage already."""
    x = input_node(g)
    if x is None or x.dtype != "float32" or x.shape is None or len(x.shape) != 4:
        return False
    if input_in_storage(g):
        return True
    readers = {t for t, n in enumerate(g.nodes) if any(r.name == x.name for r in n.inputs)}
    return bool(readers) and readers <= tileable_stages(g)


def input_in_storage(g: TrainingGraph) -> bool:
    x = input_node(g)
    return bool(x is not None and x.attrs.get(IN_STORAGE))


def read_bytes(n: Node) -> int:
    """The bytes of the input batch one computation of patch-by-patch node `n` reads from storage: each gathered
    region of it, halos included (a region two tiles share is read by both)."""
    plan = _plan(n)
    shape = plan["tensors"][0]
    return sum(4 * shape[0] * shape[1] * gt["crop"][1] * gt["crop"][3]
               for tile in plan["tiles"] for step in tile["steps"] for gt in step if gt["from"] == 0)
