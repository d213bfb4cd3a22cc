"""The tensor lifetimes of a schedule's steps: what the offset planner (arena.py) packs before the C code is
rendered, since the offsets go into the code.

Each compute, recompute or page-in opens a lifetime, each free closes one; an output written over a dying operand
takes that operand's lifetime. A node's transient buffers (a tiled prefix's patches, an int8 convolution's scratch,
its streamed weights) live for its step alone. Sizes are exact bytes: int8 tensors and weights 1 an element. An
input batch read from storage by its readers (compiler/graph/input_storage.py) has no lifetime: it is never in the
arena.
"""
from __future__ import annotations

from math import prod

from edgetrain.compiler.graph.ir import IN_STORAGE  # an input batch read from storage: no lifetime
from edgetrain.compiler.graph.quantize import Q8_CONV  # an int8 convolution's scratch
from edgetrain.compiler.graph.qas_lower import QAS_BACKWARD  # int8 bias training's workspace
from edgetrain.compiler.graph.tiling import TILED_OP  # a frozen prefix computed patch by patch

from .arena import Lifetime
from .names import c_comment
from .ops import CodegenError


def _numel(shape) -> int:
    return prod(shape) if shape else 1


# What the arena holds, bytes an element: tensors, and streamed weights (an int8 prefix's int8 weights, int32 biases)
ARENA_DTYPES = {"float32": 4, "int32": 4, "int8": 1}


def tensor_bytes(node: dict) -> int:
    """The bytes a node holds (float32 and int32 4 an element, int8 1; a tuple's items one after the other; none
    for an input batch read from storage)."""
    if in_storage(node):
        return 0
    specs = node["items"] if node.get("items") else ([{"shape": node["shape"], "dtype": node["dtype"]}]
                                                     if node["shape"] is not None else [])
    for spec in specs:
        if spec["dtype"] not in ARENA_DTYPES:
            raise CodegenError(f"tensor `{c_comment(node['name'])}` has dtype {spec['dtype']}; the C runtime holds "
                               "float32, int32 and int8 only (compile with --emit c)")
    return sum(ARENA_DTYPES[spec["dtype"]] * _numel(spec["shape"]) for spec in specs)


def in_storage(node: dict) -> bool:
    """Whether `node` is an input batch its readers read from storage, patch by patch."""
    return bool(node.get("attrs", {}).get(IN_STORAGE))


def tensor_lifetime(node: dict, start: int, end: int = -1) -> Lifetime:
    return Lifetime.of_bytes(node["name"], start, end, tensor_bytes(node))


def transient_lifetimes(em, node: dict, k: int) -> dict[str, Lifetime]:
    """The buffers a node holds only while it runs at step `k`, by key: a tiled prefix's patches, an int8
    convolution's scratch (its workspace, less the weights it streams)."""
    name = node["name"]
    if node["op"] == TILED_OP:
        return {f"{name}.patches": Lifetime(f"{name} (patches)", k, k, node["workspace_bytes"] // 4)}
    if node["op"] == Q8_CONV:
        return {f"{name}.scratch": Lifetime.of_bytes(f"{name} (int16 scratch)", k, k, own_workspace(em, node))}
    if node["op"] == QAS_BACKWARD:  # its buffers apart, so that the planner may place each in its own gap
        from .qas_emit import QAS_BUFFERS, qas_layout

        lay = qas_layout(em.node_objs[name], em.graph.node, em.params)
        return {f"{name}.{b}": Lifetime.of_bytes(f"{name} ({b})", k, k, lay[b]) for b in QAS_BUFFERS if lay[b]}
    return {}


def own_workspace(em, node: dict) -> int:
    """A node's workspace less the weights it streams from storage (graph/streaming.py adds those to it)."""
    return node["workspace_bytes"] - sum(stream_bytes(em, node, p) for p in node.get("streamed", ()))


def step_lifetimes(em, steps: list[dict]) -> tuple[list[tuple], list[Lifetime]]:
    """Each step with the lifetimes of the tensors it touches, and all lifetimes (to be packed before the
    code is rendered: the offsets go into the code)."""
    by_name = em.by_name
    lifetimes: list[Lifetime] = []
    current: dict[str, Lifetime] = {}
    handed: set[str] = set()  # operands an output was written over: their free ends nothing
    # step, operand lifetimes, output lifetime, the streamed weights' lifetimes (only while the node runs)
    plan: list[tuple[dict, dict, Lifetime | None, dict[str, Lifetime]]] = []
    for k, st in enumerate(steps):
        a, name = st["action"], st["tensor"]
        node = by_name.get(name)
        if node is None and a not in ("free", "page_out"):
            raise CodegenError(f"step {k} {a}s `{c_comment(name)}`, which is not a node of the graph")
        if a in ("compute", "recompute"):
            lts = {r["t"]: current[r["t"]] for r in node["inputs"] if not in_storage(by_name[r["t"]])}
            transient = transient_lifetimes(em, node, k)  # patch buffers or scratch, only while it runs
            lts.update(transient)
            lifetimes += transient.values()
            for stats in (f"{node['aux_of']}.aux" if node.get("aux_of") else None, f"{name}.aux"):
                if stats in current:  # statistics read by a backward, or rewritten by a recompute
                    lts[stats] = current[stats]
            out = None
            into = node["attrs"].get("into")
            if into is not None:  # the output is written over a dying operand: its bytes, its offset
                x = node["inputs"][into]["t"]
                out = current[name] = lts[x]
                out.name = f"{out.name} -> {name}"
                handed.add(x)
            elif tensor_bytes(node):
                out = tensor_lifetime(node, k)
                lifetimes.append(out)
                current[name] = out
            if a == "compute" and node["aux_bytes"]:  # the statistics are made with the first computation
                stats = Lifetime(f"{name}.aux", k, -1, node["aux_bytes"] // 4)
                lifetimes.append(stats)
                current[stats.name] = lts[stats.name] = stats
            streams = stream_lifetimes(em, node, k)
            lifetimes += streams.values()
            plan.append((st, lts, out, streams))
        elif a == "page_in":
            out = tensor_lifetime(node, k)
            lifetimes.append(out)
            current[name] = out
            plan.append((st, {}, out, {}))
        elif a == "page_out":
            if name not in by_name:
                raise CodegenError(f"the schedule pages out `{c_comment(name)}`, which the C runtime keeps in place")
            plan.append((st, {}, current[name], {}))
        elif a == "free":
            lt = current.pop(name)
            if name in handed:  # its bytes live on as the output written over it
                handed.discard(name)
                lt = None
            else:
                lt.end = k
            plan.append((st, {}, lt, {}))
        else:
            raise CodegenError(f"unknown step action {a!r}")
    if current:
        raise CodegenError(f"the schedule leaves {sorted(current)[:5]} resident at the end of the step")
    return plan, lifetimes


def stream_lifetimes(em, node: dict, k: int) -> dict[str, Lifetime]:
    """The arena a node's streamed weights take while it runs at step `k`, by parameter."""
    return {p: Lifetime.of_bytes(f"{p} (streamed)", k, k, stream_bytes(em, node, p)) for p in node.get("streamed", ())}


def stream_bytes(em, node: dict, p: str) -> int:
    """Bytes a node's streamed weight takes in the arena while it runs: all of it, or its largest block; in its
    dtype (an int8 prefix's weights 1 an element, its biases 4: what the store holds and the kernels read)."""
    spec = em.params[p]
    size = ARENA_DTYPES[spec.get("dtype", "float32")]
    if p in em.blocks:
        row = _numel(spec["shape"]) // spec["shape"][0]
        return size * row * max(r1 - r0 for _, r0, r1 in em.blocks[p])
    return size * _numel(spec["shape"])
