"""What fills the memory of a schedule, step by step and at each stage's peak, replayed as the validator does.

Categories (their sum is the validator's memory at every step it measures):
- state: parameters, optimizer state and buffers, held for the whole step;
- activations: tensors of input, labels, forward and loss nodes, and batch-norm statistics;
- gradients: tensors of backward nodes;
- paging: a tensor whose RAM copy is held for paging: from its page-out until its free, and from its
  page-in until the end of the stage that paged it in (brought back for that stage's node);
- workspace: the running node's transient bytes (its parameter gradients, scratch).

The validator measures memory while each node runs (everything resident, the node's output and workspace)
and at each page-in; a stage's peak is the largest of those in the stage. `breakdown` returns, for every step,
the composition while it runs, and for every stage the composition at the first step that reaches its peak,
so the stacked stage bars sum to `Report.stage_peaks` exactly.
"""
from __future__ import annotations

from dataclasses import dataclass, field

CATEGORIES = ("state", "activations", "gradients", "paging", "workspace")
_GRADIENT_KINDS = ("backward",)


@dataclass
class Breakdown:
    steps: list[dict[str, int]] = field(default_factory=list)  # per step: composition while it runs
    after: list[int] = field(default_factory=list)  # per step: bytes resident once it is done
    measured: list[bool] = field(default_factory=list)  # the validator measures this step (compute, page-in)
    stage: list[int] = field(default_factory=list)  # per step: its stage
    stage_peaks: list[dict[str, int]] = field(default_factory=list)  # per stage: composition at its peak
    stage_peak_step: list[int] = field(default_factory=list)  # per stage: the step of its peak

    def totals(self) -> list[int]:
        return [sum(c.values()) for c in self.stage_peaks]


def _category(node) -> str:
    return "gradients" if node.kind in _GRADIENT_KINDS else "activations"


def breakdown(graph, steps: list[dict]) -> Breakdown:
    """Replay ``steps`` (JSON steps: stage, action, tensor) on ``graph``; see the module's text."""
    nodes = {n.name: n for n in graph.nodes}
    resident: dict[str, tuple[int, str]] = {}  # tensor -> (bytes, category)
    paged_in_at: dict[str, int] = {}  # tensor -> stage that paged it in (paging until that stage ends)
    out = Breakdown(stage_peaks=[dict.fromkeys(CATEGORIES, 0) for _ in graph.nodes],
                    stage_peak_step=[-1] * len(graph.nodes))
    best = [-1] * len(graph.nodes)
    current = -1

    def composition() -> dict[str, int]:
        c = dict.fromkeys(CATEGORIES, 0)
        c["state"] = graph.state_bytes
        for b, cat in resident.values():
            c[cat] += b
        return c

    for k, st in enumerate(steps):
        t, act, name = st["stage"], st["action"], st["tensor"]
        if t != current:  # tensors paged in for an earlier stage are plain resident tensors now
            for x in [x for x, s in paged_in_at.items() if s < t]:
                del paged_in_at[x]
                if x in resident:
                    resident[x] = (resident[x][0], _category(nodes[x]))
            current = t
        measured = act in ("compute", "recompute", "page_in")
        if act in ("compute", "recompute"):
            n = nodes[name]
            if n.into is not None:  # its output takes the dying operand's bytes (graph/inplace.py)
                resident.pop(n.into, None)
            c = composition()
            c[_category(n)] += n.bytes
            if act == "compute":
                c["activations"] += n.aux_bytes
            c["workspace"] += n.transient_bytes
            if n.bytes:
                resident[name] = (n.bytes, _category(n))
            if act == "compute" and n.aux_bytes:
                resident[f"{name}.aux"] = (n.aux_bytes, "activations")
        elif act == "page_in":
            resident[name] = (nodes[name].bytes, "paging")
            paged_in_at[name] = t
            c = composition()
        elif act == "page_out":
            c = composition()
            if name in resident:
                resident[name] = (resident[name][0], "paging")
        elif act == "free":
            c = composition()
            resident.pop(name, None)
            paged_in_at.pop(name, None)
        else:
            raise ValueError(f"step {k}: unknown action {act!r}")
        out.steps.append(c)
        out.after.append(graph.state_bytes + sum(b for b, _ in resident.values()))
        out.measured.append(measured)
        out.stage.append(t)
        if measured:
            total = sum(c.values())
            if total > best[t]:
                best[t] = total
                out.stage_peaks[t] = c
                out.stage_peak_step[t] = k
    return out


__all__ = ["CATEGORIES", "Breakdown", "breakdown"]
