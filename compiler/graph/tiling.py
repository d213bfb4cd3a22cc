"""A frozen forward prefix computed patch by patch (MCUNetV2's patch-based inference), as one graph node.

The first stages of a CNN hold its largest activations, and when the backbone is frozen no gradient flows
through them and nothing of theirs is saved: only their last output is needed. This pass replaces such a
prefix (convolutions, ReLU/ReLU6 and residual adds over frozen weights) by one node that computes its output
tile by tile: each tile's receptive field is read from the prefix's input with its halo, and every
intermediate exists only as a patch, so the full-resolution intermediates never exist at once. Where one
segment is not enough (its halos grow with its depth), the frozen nodes after it are tiled again, from its
whole output on. The halos are
computed once per tile that needs them: the added FLOPs are in the node's cost. The node's workspace is the
patches' buffers, packed by their lifetimes within a tile (`plan["buffers"]`, offsets in floats), which the
C firmware uses as they are and the Python runtime (runtime/python/patch_forward.py) counts.

An int8 prefix (compiler/graph/quantize.py's nodes: the input's quantisation, convolutions, ReLU/ReLU6, adds) is
tiled the same way (`plan["dtype"]` "int8"): its patches a byte an element, each buffer on whole words (the SIMD
kernels load words; `plan["buffers"]` in bytes, `workspace_bytes` their extent), a convolution's operand padded
with its input's zero point, each op's attrs["q8"] in the plan. The quantisation reads its crop of the float input
directly (no float patch). Each output pixel's integer sum is the same whatever the tile, so tiling changes no
int8 value (runtime/python/int8_prefix.py computes both ways).

The plan the node carries (attrs["plan"], JSON) is all either runtime needs: per tile, each tensor's region
and, per op, the crop and zero padding of each operand. Pure functions: nothing here solves or reads files.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace

from .ir import Node, TensorRef, TrainingGraph
from .quantize import Q8_ADD, Q8_CONV, Q8_QUANTIZE, Q8_RELU, Q8_RELU6

TILED_OP = "edgetrain.patch_forward.default"
CONV = "aten.convolution.default"
UNARY = {"aten.hardtanh.default": "hardtanh", "aten.relu.default": "relu"}
ADD = "aten.add.Tensor"
# the int8 nodes a prefix may tile; the plan names each op as the integer reference's program does ("q8_conv2d")
Q8_TILED = (Q8_QUANTIZE, Q8_CONV, Q8_RELU, Q8_RELU6, Q8_ADD)
CONVS = ("conv", "q8_conv2d")
DIRECT = ("q8_quantize",)  # ops that read their operand's crop in place: no gathered copy
GRIDS = (2, 3, 4, 5, 6, 8)  # tiles per side tried


@dataclass(frozen=True)
class Tiling:
    """The chosen rewrite: the nodes replaced (by name), the grid and the tiled graph."""

    nodes: tuple[str, ...]
    grid: int
    graph: TrainingGraph
    added_flops: int


def _t(a) -> bool:
    return isinstance(a, dict) and set(a) == {"$t"}


def _p(a) -> bool:
    return isinstance(a, dict) and set(a) == {"$p"}


def _op_of(n: Node, frozen: set[str]) -> dict | None:
    """The prefix op `n` is, as the plan writes it; None when it cannot be tiled."""
    if n.kind != "forward" or n.shape is None or len(n.shape) != 4 or n.streamed or not {"args"} <= set(n.attrs) \
            or not set(n.attrs) <= {"args", "scratch", "into"} \
            or any(r.view for r in n.inputs) or n.dtype != "float32" or not set(n.params) <= frozen:
        return None
    a = n.attrs["args"]
    if n.op == CONV and len(a) == 9 and _t(a[0]) and _p(a[1]) and (a[2] is None or _p(a[2])) and not a[6] \
            and len(a[3]) == 2 and list(a[7]) == [0, 0]:
        return {"op": "conv", "operands": [0], "weight": a[1]["$p"], "bias": a[2]["$p"] if a[2] else None,
                "stride": list(a[3]), "padding": list(a[4]), "dilation": list(a[5]), "groups": a[8]}
    if n.op in UNARY and _t(a[0]) and all(isinstance(v, (int, float)) for v in a[1:]):
        return {"op": UNARY[n.op], "operands": [0], "literals": list(a[1:])}
    if n.op == ADD and len(a) == 2 and _t(a[0]) and _t(a[1]):
        return {"op": "add", "operands": [0, 1]}
    return None


def _q8_op_of(n: Node, frozen: set[str]) -> dict | None:
    """The int8 prefix op `n` is, as the plan writes it (its quantisation whole); None when it cannot be tiled."""
    if n.op not in Q8_TILED or n.kind != "forward" or n.shape is None or len(n.shape) != 4 or n.streamed \
            or any(r.view for r in n.inputs) or not set(n.params) <= frozen or n.dtype != "int8":
        return None
    q8, op = n.attrs["q8"], n.op.split(".")[1]
    if n.op == Q8_CONV:
        return {"op": op, "operands": [0], "weight": q8["weight"], "bias": q8["bias"], "stride": list(q8["stride"]),
                "padding": list(q8["padding"]), "dilation": list(q8["dilation"]), "groups": q8["groups"], "q8": q8}
    return {"op": op, "operands": [0, 1] if op == "q8_add" else [0], "q8": q8}


def _prefix(g: TrainingGraph) -> tuple[str, list[int], list[dict]]:
    """The tensor the prefix reads and its tileable nodes (stage indices, ops): from the first forward node on,
    reading the input batch; or, where a prefix is computed patch by patch already, from the node after the last
    such node on, reading its output (a further segment: a whole tensor between two tiled ones)."""
    frozen = set(g.params) - set(g.trainable_params)
    tiled = [i for i, n in enumerate(g.nodes) if n.op == TILED_OP]
    if tiled:
        start, source = tiled[-1] + 1, g.nodes[tiled[-1]].name
    else:
        start = next((i for i, n in enumerate(g.nodes) if n.kind == "forward"), None)
        if start is None or not g.nodes[start].inputs:
            return "", [], []
        source = g.nodes[start].inputs[0].name
        if g.node(source).kind != "input":
            return "", [], []
    if len(g.node(source).shape or ()) != 4:
        return "", [], []
    known, stages, ops = {source}, [], []
    int8 = g.nodes[start].op in Q8_TILED  # one dtype a chain: an int8 prefix's nodes, or float ones
    for i in range(start, len(g.nodes)):
        n = g.nodes[i]
        op = _q8_op_of(n, frozen) if int8 else _op_of(n, frozen)
        if op is None or any(r.name not in known for r in n.inputs) or n.shape[0] != g.node(source).shape[0]:
            break
        known.add(n.name)
        stages.append(i)
        ops.append(op)
    return source, stages, ops


def tileable_stages(g: TrainingGraph) -> set[int]:
    """Stages a tiling may replace: those of the frozen forward prefix before its last cut."""
    _, stages, _ = _prefix(g)
    cuts = _cuts(g, stages)
    return set(stages[:cuts[-1]]) if cuts else set()


def _cuts(g: TrainingGraph, stages: list[int]) -> list[int]:
    """Prefix lengths k whose first k nodes' tensors are read after them only through the k-th's output."""
    readers: dict[str, set[int]] = {}
    for i, n in enumerate(g.nodes):
        for r in n.inputs:
            readers.setdefault(r.name, set()).add(i)
    out = []
    for k in range(2, len(stages) + 1):
        inside = set(stages[:k])
        if all(readers.get(g.nodes[s].name, set()) <= inside for s in stages[:k - 1]):
            out.append(k)
    return out


def _bounds(size: int, parts: int) -> list[tuple[int, int]]:
    edges = [round(k * size / parts) for k in range(parts + 1)]
    return [(a, b) for a, b in zip(edges, edges[1:]) if b > a]


def _window(op: dict, region: tuple[int, int, int, int], weight_hw: tuple[int, int] | None):
    """The operand region (unclipped: y0, y1, x0, x1) op needs to make `region` of its output."""
    y0, y1, x0, x1 = region
    if op["op"] not in CONVS:
        return region
    (sh, sw), (ph, pw), (dh, dw), (kh, kw) = op["stride"], op["padding"], op["dilation"], weight_hw
    return (y0 * sh - ph, (y1 - 1) * sh - ph + dh * (kh - 1) + 1, x0 * sw - pw, (x1 - 1) * sw - pw + dw * (kw - 1) + 1)


def _clip(r, h: int, w: int):
    return max(r[0], 0), min(r[1], h), max(r[2], 0), min(r[3], w)


def _union(a, b):
    return b if a is None else (min(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), max(a[3], b[3]))


def build_plan(g: TrainingGraph, source: str, stages: list[int], ops: list[dict], grid: int) -> dict:
    """The plan of computing nodes `stages` (with `ops`) from `source` in grid x grid output tiles."""
    names = [source] + [g.nodes[s].name for s in stages]
    index = {name: j for j, name in enumerate(names)}
    shapes = [list(g.node(nm).shape) for nm in names]  # [n, c, h, w]
    n_batch = shapes[0][0]
    ops = [dict(op, operands=[index[g.nodes[s].inputs[k].name] for k in op["operands"]]) for s, op in zip(stages, ops)]
    whw = [tuple(g.params[op["weight"]].shape[2:]) if op["op"] in CONVS else None for op in ops]
    int8 = any(op["op"].startswith("q8_") for op in ops)
    m = len(names) - 1
    h_out, w_out = shapes[m][2], shapes[m][3]
    tiles, sizes = [], {}
    for ty in _bounds(h_out, grid):
        for tx in _bounds(w_out, grid):
            region: list = [None] * (m + 1)
            region[m] = (ty[0], ty[1], tx[0], tx[1])
            for i in range(m - 1, -1, -1):
                for a in ops[i]["operands"]:
                    need = _clip(_window(ops[i], region[i + 1], whw[i]), shapes[a][2], shapes[a][3])
                    region[a] = _union(region[a], need)
            region[0] = (0, shapes[0][2], 0, shapes[0][3])  # the input is whole in memory
            steps = []
            for i, op in enumerate(ops):
                gathers = []
                for a in op["operands"]:
                    win = _window(op, region[i + 1], whw[i])
                    c = _clip(win, shapes[a][2], shapes[a][3])
                    pad = [c[0] - win[0], win[1] - c[1], c[2] - win[2], win[3] - c[3]]
                    crop = [c[0] - region[a][0], c[1] - c[0], c[2] - region[a][2], c[3] - c[2]]  # y, h, x, w
                    whole = crop == [0, region[a][1] - region[a][0], 0, region[a][3] - region[a][2]]
                    copy = not (whole and not any(pad)) and op["op"] not in DIRECT
                    gathers.append({"from": a, "crop": crop, "pad": pad, "copy": copy})
                    if gathers[-1]["copy"]:
                        key = ("g", i, len(gathers) - 1)
                        words = n_batch * shapes[a][1] * (win[1] - win[0]) * (win[3] - win[2])
                        sizes[key] = max(sizes.get(key, 0), words)
                steps.append(gathers)
            for j in range(1, m + 1):
                r = region[j]
                sizes[("t", j)] = max(sizes.get(("t", j), 0), n_batch * shapes[j][1] * (r[1] - r[0]) * (r[3] - r[2]))
            tiles.append({"regions": [list(r) for r in region], "steps": steps})
    flops = sum(_tile_flops(op, shapes, t, i, whw[i]) for t in tiles for i, op in enumerate(ops))
    if int8:  # a byte an element, each buffer on whole words
        buffers, nbytes = _pack(ops, {k: -(-v // 4) * 4 for k, v in sizes.items()}, m)
        return {"dtype": "int8", "tensors": shapes, "ops": ops, "tiles": tiles, "buffers": buffers,
                "workspace_bytes": nbytes, "flops": flops}
    buffers, words = _pack(ops, sizes, m)
    return {"tensors": shapes, "ops": ops, "tiles": tiles, "buffers": buffers, "workspace_floats": words,
            "flops": flops}


def _tile_flops(op: dict, shapes, tile: dict, i: int, weight_hw) -> int:
    y0, y1, x0, x1 = tile["regions"][i + 1]
    outs = shapes[0][0] * shapes[i + 1][1] * (y1 - y0) * (x1 - x0)
    if op["op"] not in CONVS:
        return outs
    cin = shapes[op["operands"][0]][1] // op["groups"]
    return 2 * outs * cin * weight_hw[0] * weight_hw[1]


def _pack(ops: list[dict], sizes: dict, m: int) -> tuple[dict, int]:
    """First-fit offsets (in the unit of `sizes`: floats, or bytes) for the patch buffers: tensor j's from its op
    (j - 1) to its last reader (the output's through the last op, when it is placed), an operand copy during its op
    only."""
    last = {j: m - 1 for j in range(1, m + 1)}
    for i, op in enumerate(ops):
        for a in op["operands"]:
            if a:
                last[a] = max(last[a], i)
    spans = []
    for key, words in sizes.items():
        if key[0] == "t":
            spans.append((key[1] - 1, last[key[1]], words, f"t{key[1]}"))
        else:
            spans.append((key[1], key[1], words, f"g{key[1]}.{key[2]}"))
    placed: list[tuple[int, int, int, int]] = []  # start, end, offset, words
    offsets = {}
    for start, end, words, name in sorted(spans, key=lambda s: (s[0], -s[2])):
        live = [(o, w) for s, e, o, w in placed if s <= end and start <= e]
        at = min(c for c in [0] + [o + w for o, w in live]
                 if all(c + words <= o or o + w <= c for o, w in live))
        placed.append((start, end, at, words))
        offsets[name] = at
    return offsets, max((o + w for _, _, o, w in placed), default=0)


def tiled_graph(g: TrainingGraph, source: str, stages: list[int], ops: list[dict], grid: int) -> tuple[TrainingGraph, int]:
    """`g` with nodes `stages` replaced by one patch-by-patch node named after the last (its readers unchanged);
    also the FLOPs the halos add."""
    plan = build_plan(g, source, stages, ops, grid)
    replaced = [g.nodes[s] for s in stages]
    last = replaced[-1]
    params = tuple(dict.fromkeys(p for n in replaced for p in n.params))
    pref = [{"$p": p} for p in params]
    pos = {p: k for k, p in enumerate(params)}
    plan["ops"] = [dict(op, weight=pos[op["weight"]], bias=None if op["bias"] is None else pos[op["bias"]])
                   if op["op"] in CONVS else op for op in plan["ops"]]
    flops = plan.pop("flops")
    plan["replaces"], plan["grid"] = [n.name for n in replaced], grid
    text = json.dumps(plan, separators=(",", ":"))
    if plan.get("dtype") == "int8":
        # The patch buffers, then an int8 convolution's int16 scratch (its node's workspace: the C kernel's, which
        # depends on the window, not the patch), the whole rounded to words (where the firmware places it).
        scratch = -(-(plan["workspace_bytes"] + max(n.workspace_bytes for n in replaced)) // 4) * 4
    else:
        # The patch buffers, and the largest kernel scratch of an op it replaced (a convolution's re-laid-out weight
        # on a CPU target: a patch's convolution needs no more than the whole one did).
        scratch = 4 * plan["workspace_floats"] + max(n.attrs.get("scratch", 0) for n in replaced)
    node = Node(name=last.name, kind="forward", op=TILED_OP, inputs=(TensorRef(source),), params=params,
                attrs={"args": [{"$t": 0}, pref, text], "scratch": scratch},
                shape=last.shape, dtype=last.dtype, workspace_bytes=scratch, flops=flops,
                source=f"{replaced[0].source} .. {last.source}" if replaced[0].source != last.source else last.source)
    drop = set(stages)
    nodes = [node if i == stages[-1] else n for i, n in enumerate(g.nodes) if i not in drop or i == stages[-1]]
    return replace(g, nodes=nodes), flops - sum(n.flops for n in replaced)


def tiled_prefixes(g: TrainingGraph) -> list[dict]:
    """What `g` computes patch by patch: per such node, the nodes it replaced, its grid and its patch buffers."""
    out = []
    for n in g.nodes:
        if n.op == TILED_OP:
            plan = json.loads(n.attrs["args"][2])
            out.append({"node": n.name, "replaces": plan["replaces"], "grid": plan["grid"],
                        "tiles": len(plan["tiles"]), "patch_bytes": n.workspace_bytes, "flops": n.flops})
    return out


def tile_frozen_prefix(g: TrainingGraph, fits, min_bytes) -> Tiling | None:
    """The tiling of `g`'s frozen forward prefix (after the segments tiled already) that `fits` (a predicate on a
    graph) with the fewest added FLOPs (fewer tiles on ties); else the one with the smallest `min_bytes` (graph ->
    bytes) below `g`'s; None when no prefix can be tiled or none lowers it."""
    source, stages, ops = _prefix(g)
    if not stages:
        return None
    best_fit, best_low = None, None
    base = min_bytes(g)
    for k in _cuts(g, stages):
        for grid in GRIDS:
            h, w = g.nodes[stages[k - 1]].shape[2:]
            if grid > min(h, w):
                continue
            tg, added = tiled_graph(g, source, stages[:k], ops[:k], grid)
            t = Tiling(tuple(g.nodes[s].name for s in stages[:k]), grid, tg, added)
            if fits(tg):
                if best_fit is None or (added, grid) < (best_fit.added_flops, best_fit.grid):
                    best_fit = t
            else:
                low = min_bytes(tg)
                if low < base and (best_low is None or low < best_low[0]):
                    best_low = (low, t)
    if best_fit is not None:
        return best_fit
    return best_low[1] if best_low else None


def tile_segments(g: TrainingGraph, fits, min_bytes) -> list[Tiling]:
    """Segments of the frozen prefix tiled one after another until `g` fits: the first as `tile_frozen_prefix`
    picks it, then, while the graph does not fit, the frozen forward nodes after it from its output on (its
    output a whole tensor, smaller than what the segments replace). Each segment lowers `min_bytes`; the last
    Tiling's graph holds them all."""
    done: list[Tiling] = []
    while not done or not fits(done[-1].graph):
        t = tile_frozen_prefix(done[-1].graph if done else g, fits, min_bytes)
        if t is None:
            break
        done.append(t)
    return done
