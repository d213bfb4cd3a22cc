"""A node's time and energy on a target: from its FLOPs, or from seconds measured on the device."""
from __future__ import annotations

from .ir import TrainingGraph


def apply_costs(graph: TrainingGraph, target, measured_s: dict[str, float] | None = None) -> None:
    """Annotate each node with time and energy on `target` (from FLOPs, or measured seconds when given)."""
    for n in graph.nodes:
        if measured_s is not None and n.name in measured_s:
            n.time_s = measured_s[n.name]
            n.energy_j = n.time_s * target.flops_per_s / target.flops_per_joule
        else:
            n.time_s = target.compute_time_s(n.flops)
            n.energy_j = target.compute_energy_j(n.flops)
