"""The pass that fits a training graph to the C runtime (the table: `ops.py`): it refuses, in one error, every
op the C runtime cannot run; redraws dropout masks instead of keeping them; and gives each node the C
runtime's memory (int32 indices and labels, no gradient workspace, only the operands its kernels read)."""
from __future__ import annotations

from dataclasses import replace

import torch

from edgetrain.runtime.python.aten_call import resolve
from edgetrain.runtime.python.optimizers import c_refusal

from edgetrain.compiler.errors import UnsupportedModelError
from edgetrain.compiler.graph.ir import Node, TrainingGraph  # the graph it lowers

from .emitters import ELEMENTWISE
from .operands import bind, node_cases, node_ops, state_shapes
from edgetrain.compiler.graph.qas_lower import QAS_BACKWARD

from .ops import AUX_ITEMS, BATCH_NORM, C_OPS, DROPOUT, DROPOUT_BACKWARD, Q8_OPS, STATS_OPS, supported_text
from .q8_emit import q8_scratch_bytes
from .qas_emit import qas_workspace_bytes  # int8 bias training's gradients and sums


def lower_for_c(g: TrainingGraph) -> TrainingGraph:
    """The training graph as the C runtime holds it, or one error naming every op it cannot run."""
    _check_optimizer(g)
    g = replace(g, nodes=_stats_as_aux(_running_stats_by_rows(_redraw_dropout_masks(g.nodes), state_shapes(g))))
    by_name = {n.name: n for n in g.nodes}
    state = state_shapes(g)
    problems: dict[tuple[str, str], list[str]] = {}  # (op, why) -> where
    for n in g.nodes:
        if n.kind in ("input", "labels"):
            continue
        where = f"node `{n.name}` ({_source(n, by_name)})"
        if (n.aux_bytes and n.op not in STATS_OPS) or (n.aux_of and by_name[n.aux_of].op not in STATS_OPS):
            problems.setdefault((n.op, "keeps statistics for its backward, which the C runtime has no kernel for"),
                                []).append(where)
            continue
        if n.op in STATS_OPS and n.attrs.get("keep", 0) != 0:
            problems.setdefault((n.op, "keeps a statistic as a tensor of its own, read by more than its backward, "
                                 "which the C runtime has no kernel for"), []).append(where)
            continue
        if n.op == DROPOUT and n.attrs.get("seed_key") == n.name:
            problems.setdefault((n.op, "is a dropout no draw of the model's eager forward pairs with, whose mask "
                                 "the exactness reference cannot redraw; use an nn.Dropout module"), []).append(where)
            continue
        missing = [o["op"] for o in node_ops(n) if o["op"] not in C_OPS]
        for op in missing:
            problems.setdefault((op, "has no kernel in the C runtime"), []).append(where)
        if missing or n.op in Q8_OPS:  # an int8 prefix node: the pass that made it admitted only what C runs
            continue
        try:
            cases = node_cases(n, by_name, state)
        except RuntimeError as e:  # an operand seen through a view of a layout the C arena does not have
            problems.setdefault((n.op, f"reads an operand the C runtime cannot lay out ({str(e).splitlines()[0][:80]})"),
                                []).append(where)
            continue
        for case in cases:
            why = C_OPS[case.op].refuse(case) or _strided_operand(case)
            if why:
                problems.setdefault((case.op, why), []).append(where)
    if problems:
        lines = []
        for (op, why), wheres in problems.items():
            more = f" and {len(wheres) - 3} more" if len(wheres) > 3 else ""
            lines.append(f"op `{op}` {why}: at {', '.join(wheres[:3])}{more}")
        listed = "\n  - ".join(lines)
        raise UnsupportedModelError(
            f"--emit c: {len(problems)} op(s) of the model cannot run in the C runtime:\n  - {listed}\n"
            f"The C runtime supports: {supported_text()}. Remove or replace these ops, or use --emit python.")
    # an int8 convolution's kernel takes its int16 scratch: the node's workspace
    nodes = [replace(n, workspace_bytes=qas_workspace_bytes(n, g.node, g.params)) if n.op == QAS_BACKWARD
             else replace(n, workspace_bytes=q8_scratch_bytes(n, g.params)) if n.op in Q8_OPS else _as_c(n)
             for n in g.nodes]
    return replace(g, nodes=nodes, frozen_in_flash=True)  # frozen weights are const: flash, not RAM


def _source(n: Node, by_name: dict[str, Node]) -> str:
    """Where a node comes from in the user's code: its own line, else (a step torch added to the backward, such as
    an in-place op's copies) the line of the nearest node it reads that has one."""
    if n.source:
        return n.source
    if n.kind == "loss":
        return "the loss"
    seen, todo = set(), [r.name for r in n.inputs]
    while todo:
        m = by_name.get(todo.pop(0))
        if m is None or m.name in seen:
            continue
        seen.add(m.name)
        if m.source:
            return f"no line of its own; it reads node `{m.name}`: {m.source}"
        todo += [r.name for r in m.inputs]
    return "unknown source"


def _redraw_dropout_masks(nodes: list[Node]) -> list[Node]:
    """The C runtime keeps no dropout mask: a dropout's backward redraws it from its forward's key and p (its
    attrs `seed_key` and `dropout_p`), and the mask's own node, read by nothing else, goes."""
    by_name = {n.name: n for n in nodes}
    readers: dict[str, set[str]] = {}
    for n in nodes:
        for r in n.inputs:
            readers.setdefault(r.name, set()).add(n.op)
    out = []
    for n in nodes:
        if n.op == DROPOUT and n.attrs.get("keep") == 1 and readers.get(n.name, set()) <= {DROPOUT_BACKWARD}:
            continue
        if n.op == DROPOUT_BACKWARD and len(n.inputs) == 2 and by_name[n.inputs[1].name].op == DROPOUT \
                and n.attrs["args"][:2] == [{"$t": 0}, {"$t": 1}]:
            fwd = by_name[n.inputs[1].name]
            p = bind(DROPOUT, fwd.attrs["args"], fwd.attrs.get("kwargs", {}))["p"]
            n = replace(n, inputs=n.inputs[:1], attrs={**n.attrs, "args": [{"$t": 0}, None, *n.attrs["args"][2:]],
                                                       "seed_key": fwd.attrs.get("seed_key"), "dropout_p": p})
        out.append(n)
    return out


# Ops whose kernels run over contiguous floats: they cannot read a strided view.
_FLAT_OPS = set(ELEMENTWISE) | {"aten.add.Tensor", "aten.mul.Tensor", "aten.div.Tensor", "aten.clone.default",
                                 "aten.copy.default"}


def _strided_operand(case) -> str | None:
    if case.op not in _FLAT_OPS:
        return None
    strided = [k for k, v in case.args.items() if isinstance(v, torch.Tensor) and not v.is_contiguous()]
    if not strided:
        return None
    return (f"reads `{strided[0]}` through a strided view (a channel slice of a batch of more than one), which its "
            "kernel over contiguous floats cannot; at --batch-size 1 the slice is contiguous")


def _running_stats_by_rows(nodes: list[Node], state: dict) -> list[Node]:
    """A batch norm computed by blocks of channels (frontend/channel_blocks.py) makes its new running statistics
    by block, concatenated into the buffer: in C each block's kernel updates its rows of the buffer in place,
    as a whole batch norm updates the whole buffer, and the blocks' statistics nodes and the cat go."""
    by_name = {n.name: n for n in nodes}
    readers: dict[str, set[str]] = {}
    for n in nodes:
        for r in n.inputs:
            readers.setdefault(r.name, set()).add(n.name)
    gone, added = set(), {}  # base batch norm -> the buffer updates it makes
    for n in nodes:
        ops = node_ops(n)
        if n.op != "aten.cat.default" or any(o["op"] != n.op or o["updates"] or len(o["buffer_updates"]) != 1
                                              or o["buffer_updates"][0].get("view") for o in ops):
            continue
        found = [_stat_blocks(n, o, by_name, readers, state) for o in ops]
        if all(f is not None for f in found):
            for f in found:
                for stat, base, k, buf in f:
                    gone.add(stat)
                    added.setdefault(base, []).append({"item": k, "buffer": buf})
            gone.add(n.name)
    return [replace(n, attrs={**n.attrs, "updates": [*n.attrs.get("updates", []), *added[n.name]]})
            if n.name in added else n for n in nodes if n.name not in gone]


def _stat_blocks(cat: Node, o: dict, by_name: dict[str, Node], readers: dict, state: dict) -> list | None:
    """(statistic's node, its batch norm, output k, buffer) for each part of a cat (`o`, one of the node's ops)
    that is a buffer's running statistic made by blocks of its rows in order; None where it is not that."""
    buf, parts = o["buffer_updates"][0]["buffer"], o["args"][0] if o["args"] else None
    if not isinstance(parts, list) or (o["args"][1:] or [0])[0] not in (0, -1) or buf not in state:
        return None
    out, at = [], 0
    for marker in parts:
        r = cat.inputs[marker["$t"]] if isinstance(marker, dict) and "$t" in marker else None
        stat = by_name.get(r.name) if r is not None and not r.view else None
        base = by_name.get(r.name.rsplit(".out", 1)[0]) if stat is not None else None
        k = stat.attrs.get("keep") if stat is not None else None
        if base is None or base is stat or stat.op != BATCH_NORM or base.op != BATCH_NORM or k not in (3, 4) \
                or readers.get(stat.name) != {cat.name} or stat.shape is None:
            return None
        rows = stat.shape[0]
        arg = base.attrs["args"][k]  # output 3 is the new running mean (argument 3), 4 the running variance
        view = [[v[0], *[list(x) if isinstance(x, (list, tuple)) else x for x in v[1:]]] for v in arg.get("view", ())] \
            if isinstance(arg, dict) else None
        if not isinstance(arg, dict) or arg.get("$b") != buf or view != [["aten.slice.Tensor", [0, at, at + rows]]]:
            return None
        out.append((stat.name, base.name, k, buf))
        at += rows
    return out if at == state[buf][0][0] else None


def _stats_as_aux(nodes: list[Node]) -> list[Node]:
    """Batch norm's and layer norm's statistics as the C runtime holds them: one block beside the forward's
    output that its backward reads (the node's aux). torch's graph makes them nodes of their own
    (`<forward>.out1`, `.out2`) where they are over an eighth of the output (a batch norm over few positions
    per channel, a layer norm over few features); those nodes go when their one reader is the backward, and
    it reads the block instead."""
    by_name = {n.name: n for n in nodes}
    parts: dict[str, str] = {}  # statistic's node -> its forward's
    for n in nodes:
        base = n.name.rsplit(".out", 1)[0]
        if n.op in STATS_OPS and n.attrs.get("keep") in (1, 2) and base != n.name and base in by_name \
                and by_name[base].op == n.op and not by_name[base].aux_bytes:
            parts[n.name] = base
    readers: dict[str, list[Node]] = {}
    for n in nodes:
        for r in n.inputs:
            if r.name in parts:
                readers.setdefault(r.name, []).append(n)
    merged: dict[str, tuple[str, dict[str, int]]] = {}  # backward -> (forward, statistic's node -> its $aux)
    for base in set(parts.values()):
        mine = sorted((p for p in parts if parts[p] == base), key=lambda p: by_name[p].attrs["keep"])
        who = {r.name for p in mine for r in readers.get(p, [])}
        if len(who) != 1:
            continue
        reader = by_name[next(iter(who))]
        if reader.kind != "backward" or reader.aux_of or any(r.view for r in reader.inputs if r.name in parts):
            continue
        merged[reader.name] = (base, {p: j for j, p in enumerate(mine)})
    if not merged:
        return nodes
    gone = {p for _, index in merged.values() for p in index}
    out = []
    for n in nodes:
        if n.name in gone:
            continue
        forward = next(((b, index) for b, index in merged.values() if b == n.name), None)
        if forward:
            kept = [by_name[p].attrs["keep"] for p in forward[1]]
            n = replace(n, attrs={**n.attrs, "aux": kept}, aux_bytes=sum(by_name[p].bytes for p in forward[1]))
        if n.name in merged:
            base, index = merged[n.name]
            remap, inputs = {}, []
            for i, r in enumerate(n.inputs):
                if r.name in index:
                    remap[i] = {"$aux": index[r.name]}
                else:
                    remap[i] = {"$t": len(inputs)}
                    inputs.append(r)
            attrs = {k: _substitute(v, remap) if k in ("args", "kwargs", "then") else v for k, v in n.attrs.items()}
            n = replace(n, inputs=tuple(inputs), attrs=attrs, aux_of=base)
        out.append(n)
    return out


def _substitute(a, remap: dict[int, dict | None]):
    """An argument template with each `{"$t": i}` marker replaced by remap[i]."""
    if isinstance(a, dict) and "$t" in a:
        return remap.get(a["$t"])
    if isinstance(a, list):
        return [_substitute(v, remap) for v in a]
    if isinstance(a, dict):
        return {k: _substitute(v, remap) for k, v in a.items()}
    return a


def _check_optimizer(g: TrainingGraph) -> None:
    problem = c_refusal(g.optimizer.to_json())  # the optimizer's unit names its C kernel, if it has one
    if problem:
        raise UnsupportedModelError(f"--emit c: {problem}")


def _as_c(n: Node) -> Node:
    """A node with the C runtime's memory: int32 indices and labels, no gradient workspace nor update temporaries,
    only the operands its kernels read."""
    dtype = n.dtype
    if n.kind == "labels" or (n.op == "aten.max_pool2d_with_indices.default" and n.attrs.get("keep") == 1):
        dtype = "int32"
    if n.kind in ("input", "labels"):
        return replace(n, dtype=dtype)
    read: set[int] = set()
    for o in node_ops(n):
        read |= _read_operands(o)
    keep = sorted(read)
    remap = {k: {"$t": j} for j, k in enumerate(keep)}
    # No scratch in C kernels: the plan's ops carry none.
    attrs = {k: _substitute(v, remap) if k in ("args", "kwargs", "then") else v for k, v in n.attrs.items()
             if k != "scratch"}
    if "then" in attrs:
        attrs["then"] = [{k: v for k, v in o.items() if k != "scratch"} for o in attrs["then"]]
    aux_bytes = 4 * AUX_ITEMS * n.shape[1] if n.op == BATCH_NORM else n.aux_bytes
    # nor update temporaries: the C optimizer kernels update in place
    return replace(n, dtype=dtype, workspace_bytes=0, update_temporary_bytes=0,
                   inputs=tuple(n.inputs[k] for k in keep), attrs=attrs, aux_bytes=aux_bytes)


def _read_operands(o: dict) -> set[int]:
    """The `$t` operands an op's kernel reads."""
    found: dict[str, set[int]] = {}

    def visit(name, a):
        if isinstance(a, dict) and "$t" in a:
            found.setdefault(name, set()).add(a["$t"])
        elif isinstance(a, list):
            for v in a:
                visit(name, v)

    schema = resolve(o["op"])._schema
    for i, a in enumerate(o["args"]):
        visit(schema.arguments[i].name, a)
    for name, a in o["kwargs"].items():
        visit(name, a)
    kernel = C_OPS[o["op"]]
    wanted = set(found) if kernel.reads is None else kernel.reads(bind(o["op"], o["args"], o["kwargs"]))
    return set().union(*(found[k] for k in wanted if k in found))
