"""Prefetch: move each page-in earlier, so that the Python runtime reads it while earlier nodes compute.

A page-in at stage t holds its tensor's RAM from the moment the read starts. Moved to the start of an
earlier stage s, the tensor is counted in every instant of stages s..t-1, exactly as the validator, and the
runtime's ledger, count it: the steps are the memory model, so all three keep agreeing to the byte. The
pass never raises the schedule's peak (a stage takes the tensor only if its own peak plus the tensor stays
within `limit`, by default the schedule's peak), never moves a page-in before its tensor's last earlier
step (its free, or a recompute), and moves it only as far back as the target says the read needs: until
the compute time of the stages it overlaps covers the page-in's time. Energy and the serial time model are
unchanged (the overlap is a gain the runtime may or may not get, so the prediction does not count on it).
The C runtime reads synchronously, so its schedules are left as they are.
"""
from __future__ import annotations

from dataclasses import replace

from edgetrain.compiler.graph.ir import TrainingGraph
from .steps import Step
from .validator import validate


def prefetch(g: TrainingGraph, steps: list[Step], target, limit: int | None = None) -> list[Step]:
    """`steps` with every page-in moved as early as the rules above allow (a new list; `steps` is kept)."""
    peaks = list(validate(g, steps, target, None).stage_peaks)
    limit = max(peaks) if limit is None else limit
    index = {n.name: k for k, n in enumerate(g.nodes)}
    moved: dict[int, int] = {}  # position of a page-in in `steps` -> the stage it now starts at
    last: dict[str, int] = {}  # tensor -> stage of its latest step so far
    for k, st in enumerate(steps):
        if st.action == "page_in" and st.tensor in last:
            size = g.nodes[index[st.tensor]].bytes
            need, covered, s = target.page_in_time_s(size), 0.0, st.stage
            while s - 1 > last[st.tensor] and covered < need and peaks[s - 1] + size <= limit:
                s -= 1
                covered += g.nodes[s].time_s
            for u in range(s, st.stage):
                peaks[u] += size
            if s < st.stage:
                moved[k] = s
        last[st.tensor] = st.stage
    if not moved:
        return list(steps)
    ahead: dict[int, list[Step]] = {}  # stage -> page-ins that now open it, in their original order
    for k, s in moved.items():
        st = steps[k]
        ahead.setdefault(s, []).append(replace(st, stage=s, reason=f"{st.reason}; read ahead from stage {s}"))
    out: list[Step] = []
    for k, st in enumerate(steps):
        if k in moved:
            continue
        if st.stage in ahead and (not out or out[-1].stage != st.stage):
            out += ahead.pop(st.stage)
        out.append(st)
    return out
