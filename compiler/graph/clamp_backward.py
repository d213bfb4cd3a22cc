"""A clamp's backward that reads the clamp's output instead of its input, so the input dies in the forward pass.

torch's `hardtanh_backward(grad, x, lo, hi)` passes `grad` where `lo < x < hi` and writes 0 elsewhere (NaN
passes: both comparisons are false). For `y = hardtanh(x, lo, hi)` with `lo <= hi` the mask on `y` is the same
element for element: x <= lo gives y = lo (masked), x >= hi gives y = hi (masked), lo < x < hi gives y = x, and
a NaN x gives a NaN y (torch's clamp propagates it). So `hardtanh_backward(grad, y, lo, hi)` is bitwise the
gradient on `x` (tests/test_clamp_backward.py checks every boundary, NaN, infinity and random bit patterns).

Why it matters: in a ReLU6 network the batch norm's output is otherwise read by the ReLU6 and by the ReLU6's
backward, so it lives through the step (or is recomputed). Read by the ReLU6 alone it dies there: the ReLU6 may
write into it (graph/inplace.py), and only `y`, which the next layer's weight gradient keeps anyway, is saved.
An in-place ReLU6 (`nn.ReLU6(inplace=True)`) traces as a clone of x saved for the backward: the clone's bits are
x's, so the backward reads `y` too, and the clone, read by nobody then, is dropped.
"""
from __future__ import annotations

from dataclasses import replace

from .ir import TensorRef, TrainingGraph

BACKWARD = "aten.hardtanh_backward.default"
FORWARD = "aten.hardtanh.default"
CLONE = "aten.clone.default"


def _bounds(args: list, at: int) -> tuple[float, float] | None:
    """The literal (lo, hi) at args[at], args[at + 1], or None."""
    if len(args) != at + 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in args[at:]):
        return None
    return float(args[at]), float(args[at + 1])


def _reads(template, k: int) -> int:
    """How many times operand k appears in an argument template."""
    if isinstance(template, dict):
        return int(template.get("$t") == k) + sum(_reads(v, k) for v in template.values())
    if isinstance(template, (list, tuple)):
        return sum(_reads(v, k) for v in template)
    return 0


def _clamp_of(g: TrainingGraph) -> dict[tuple, tuple[str, tuple[float, float]]]:
    """(input tensor, its view) -> (the hardtanh node computing its clamp, (lo, hi)), for plain hardtanh nodes."""
    out = {}
    for n in g.nodes:
        args = n.attrs.get("args", [])
        if (n.op != FORWARD or n.kind != "forward" or set(n.attrs) != {"args"} or n.items is not None
                or len(n.inputs) != 1 or args[:1] != [{"$t": 0}]):
            continue
        b = _bounds(args, 1)
        if b is not None and b[0] <= b[1]:
            out[(n.inputs[0].name, n.inputs[0].view)] = (n.name, b)
    return out


def read_clamp_output(g: TrainingGraph) -> tuple[TrainingGraph, list[str]]:
    """`g` with every `hardtanh_backward(grad, x, lo, hi)` whose x is clamped by a `hardtanh(x, lo, hi)` of the
    same bounds, shape and float32 dtype reading that clamp's output instead (a new graph); also the names of the
    rewritten nodes."""
    clamps = _clamp_of(g)
    by_name = {n.name: n for n in g.nodes}
    nodes, done = [], []
    for n in g.nodes:
        args = n.attrs.get("args", [])
        hit = None
        if n.op == BACKWARD and n.kind == "backward" and len(args) == 4 and args[1] == {"$t": 1} \
                and not n.attrs.get("kwargs") and len(n.inputs) > 1:
            x = _unclone(n.inputs[1], by_name)
            found = clamps.get((x.name, x.view))
            if found is not None and found[1] == _bounds(args, 2):
                y = by_name[found[0]]
                # operand 1 read only as the mask's input (an op fused after the node may read x itself)
                if (y.shape is not None and y.dtype == "float32" == n.dtype and y.shape == n.shape
                        and _reads(n.attrs, 1) == 1 and y.name not in {r.name for r in n.inputs}):
                    hit = y
        if hit is None:
            nodes.append(n)
            continue
        inputs = list(n.inputs)
        inputs[1] = TensorRef(hit.name)
        nodes.append(replace(n, inputs=tuple(inputs)))
        done.append(n.name)
    read = {r.name for n in nodes for r in n.inputs}
    nodes = [n for n in nodes if not (_plain_clone(n) and n.name not in read)]  # a saved clone nobody reads now
    return replace(g, nodes=nodes), done


def _plain_clone(n) -> bool:
    return (n.op == CLONE and n.kind == "forward" and set(n.attrs) == {"args"} and n.attrs["args"] == [{"$t": 0}]
            and len(n.inputs) == 1 and not n.inputs[0].view and n.items is None)


def _unclone(r: TensorRef, by_name: dict) -> TensorRef:
    """The tensor a plain forward clone copies (its bits), or `r` itself."""
    n = by_name.get(r.name)
    return n.inputs[0] if n is not None and not r.view and _plain_clone(n) else r
