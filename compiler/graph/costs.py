"""A node's time and energy on a target: from its FLOPs, or from seconds measured on the device, plus the
page-in of the frozen weights it streams from storage."""
from __future__ import annotations

from dataclasses import replace

from .aten_node import weight_rows
from .ir import Node, TrainingGraph

# The key of a node's recompute among measured seconds, where it runs another kernel than its first computation
RECOMPUTED = "{}@recompute"


def stream_in(g: TrainingGraph, n: Node, target) -> tuple[int, float, float]:
    """Bytes, seconds and joules of paging node `n`'s streamed weights in (one page-in each, or one per block of
    output channels), per computation."""
    rows = n.attrs.get("stream_rows", {})
    sizes = []
    for p in n.streamed:
        spec = g.params[p]
        per = rows.get(p, spec.shape[0])
        row = spec.bytes // spec.shape[0]
        r0, r1 = weight_rows(n, spec.shape[0]) if p in rows else (0, spec.shape[0])  # its rows
        sizes += [row * min(per, r1 - r) for r in range(r0, r1, per)]
    return (sum(sizes), sum(target.page_in_time_s(b) for b in sizes),
            sum(target.page_in_energy_j(b) for b in sizes))


def costed(graph: TrainingGraph, target, measured_s: dict[str, float] | None = None) -> TrainingGraph:
    """`graph` with every node's time and energy on `target` (apply_costs's), its own nodes untouched."""
    out = replace(graph, nodes=[replace(n) for n in graph.nodes])
    apply_costs(out, target, measured_s)
    return out


def apply_costs(graph: TrainingGraph, target, measured_s: dict[str, float] | None = None) -> None:
    """Annotate each node with time and energy on `target` (from FLOPs, or measured seconds when given); a node
    that streams weights pays their page-in with every computation, so recomputing it pays it again."""
    for n in graph.nodes:
        if measured_s is not None and n.name in measured_s:
            n.time_s = measured_s[n.name]
            n.energy_j = n.time_s * target.flops_per_s / target.flops_per_joule
        else:
            n.time_s = target.compute_time_s(n.flops)
            n.energy_j = target.compute_energy_j(n.flops)
        again = RECOMPUTED.format(n.name)
        if measured_s is not None and again in measured_s:  # timed by the profiler as its recompute runs
            n.recompute_time_s = measured_s[again]
            n.recompute_energy_j = n.recompute_time_s * target.flops_per_s / target.flops_per_joule
        elif n.recompute_flops is not None:
            n.recompute_time_s = target.compute_time_s(n.recompute_flops)
            n.recompute_energy_j = target.compute_energy_j(n.recompute_flops)
        if n.streamed:
            _, seconds, joules = stream_in(graph, n, target)
            n.time_s += seconds
            n.energy_j += joules
