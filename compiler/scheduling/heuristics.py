"""Heuristic schedulers: plain backprop, Chen's sqrt(n) checkpointing, paging-only (Capuchin-like), and a
DTR-like greedy eviction. Each returns `Decisions`; the schedulers module validates them. They are also the
MILP's warm starts.
"""
from __future__ import annotations

import math

from .steps import Decisions, on_demand
from edgetrain.compiler.graph.ir import TrainingGraph
from edgetrain.compiler.graph.liveness import Liveness


def store_all(g: TrainingGraph, lv: Liveness) -> Decisions:
    """Plain backprop: hold every tensor a backward node reads, from its forward compute to its last reader."""
    read = {i for t in range(lv.B0, lv.T) for i in lv.needs[t]}
    return on_demand(g, lv, keep=read, page_out=set(), kept_for_recompute=False)


def _cut_tensors(g: TrainingGraph, lv: Liveness) -> list[str]:
    """Forward tensors every path from input to loss passes through (Chen's candidate checkpoints)."""
    pos = {n.name: k for k, n in enumerate(g.nodes[: lv.L + 1])}
    covered = [0] * (lv.L + 2)
    for n in g.nodes[: lv.L + 1]:
        for r in n.inputs:
            a, b = pos[r.name], pos[n.name]
            for p in range(a + 1, b):
                covered[p] += 1
    return [i for i in lv.decision if covered[pos[i]] == 0]


def checkpoint(g: TrainingGraph, lv: Liveness, segments: int | None = None) -> Decisions:
    """Keep ~sqrt(n) evenly spaced cut tensors (and the input); recompute the rest segment by segment."""
    cuts = [c for c in _cut_tensors(g, lv) if lv.recomputable(c)]
    n = len(lv.decision)
    segments = segments or max(1, round(math.sqrt(n)))
    # A tensor whose recompute would read a parameter already updated when a later stage reads it is kept too
    last_need = {i: t for t in range(lv.B0, lv.T) for i in lv.needs[t]}
    keep = {i for i in lv.decision if not lv.recomputable(i) or last_need.get(i, -1) > lv.recompute_until[i]}
    if cuts:
        step = len(cuts) / segments
        keep |= {cuts[min(len(cuts) - 1, int(k * step))] for k in range(segments)}
    return on_demand(g, lv, keep=keep, page_out=set())


def page_all(g: TrainingGraph, lv: Liveness, retain: bool) -> Decisions:
    return on_demand(g, lv, keep=set(), page_out=set(lv.decision), retain=retain, prefer_recompute=False)


def candidates(g: TrainingGraph, lv: Liveness, paging: bool) -> dict[str, Decisions]:
    out = {"store-all": store_all(g, lv), "checkpoint": checkpoint(g, lv)}
    n = len(lv.decision)
    for s in sorted({2, 3, max(1, n // 4), max(1, n // 2), n}):
        out[f"checkpoint-{s}"] = checkpoint(g, lv, s)
    if paging:
        out["page-all"] = page_all(g, lv, retain=True)
        out["page-all-min"] = page_all(g, lv, retain=False)
        # Keep the cheap-to-recompute tensors' inputs on storage: recompute what is cheap, page the rest.
        out["page+recompute"] = on_demand(g, lv, keep=set(), page_out=set(lv.decision), retain=True)
    return out




def paging_only(g: TrainingGraph, lv: Liveness, retain: bool = True) -> Decisions:
    """Capuchin-like: page out every tensor backward needs right after its forward compute, page it in just
    before its first backward reader; `retain` keeps it until its last reader, else it is paged in per reader."""
    return page_all(g, lv, retain=retain)


def dtr(g: TrainingGraph, lv: Liveness, budget_bytes: int) -> Decisions | None:
    """DTR-like greedy eviction (Kirisame et al.): run in order; whenever a stage would exceed the budget,
    evict the resident tensor with the smallest h = cost / (bytes x staleness), where cost is the energy of
    recomputing it and its evicted inputs; bring evicted tensors back by recomputation when read.
    Returns None when greedy eviction cannot fit the budget (DTR has no paging: the input is never evicted).
    """
    size, B0 = lv.size, lv.B0
    last_use = {i: lv.end[i] for i in lv.decision}
    energy = {i: g.node(i).rec_energy_j for i in lv.decision}
    pinned = {i for i in lv.decision if not lv.recomputable(i)}

    def cost(i: str, resident: set[str], seen: set[str]) -> float:
        c = energy[i]
        for j in lv.inputs_of[i]:
            if j not in resident and j not in seen:
                seen.add(j)
                c += cost(j, resident, seen)
        return c

    def h(i: str, t: int, resident: set[str]) -> float:
        return cost(i, resident, {i}) / (size[i] * max(1, t - last_use[i]))

    keep = set(lv.decision)
    for t in range(B0):  # forward: a tensor past its last forward use may be dropped
        held = {i for i in keep if lv.end[i] < t}
        over = lv.static[t] + sum(size[i] for i in held) - budget_bytes
        while over > 0:
            cands = sorted(held - pinned, key=lambda i: (h(i, t, keep), i))
            if not cands:
                return None
            keep.discard(cands[0])
            held.discard(cands[0])
            over -= size[cands[0]]
    order = {name: k for k, name in enumerate(lv.decision)}
    d = Decisions(page_out=set())
    resident = set(keep)
    for t in range(B0, lv.T):
        resident = {i for i in resident if lv.window_end[i] >= t}
        have, recs = set(resident), []

        def bring(i: str) -> bool:
            if i in have:
                return True
            if not (lv.recomputable(i) and t <= lv.recompute_until[i]):
                return False
            if not all(bring(j) for j in lv.inputs_of[i]):
                return False
            recs.append(i)
            have.add(i)
            return True

        if not all(bring(i) for i in lv.needs[t]):
            return None
        protected = set(lv.needs[t]) | set(recs) | {j for i in recs for j in lv.inputs_of[i]}
        recs.sort(key=order.__getitem__)

        def peak() -> int:
            """The stage's peak: while node t runs, or while a recompute with a workspace runs before it."""
            held = sum(size[i] for i in resident)
            top, done = lv.static[t] + held + sum(size[i] for i in recs), held
            for i in recs:
                done += size[i]
                top = max(top, lv.before_node(g, t) + done + g.node(i).transient_bytes)
            return top

        while peak() > budget_bytes:
            cands = sorted((resident - protected) - pinned, key=lambda i: (h(i, t, resident), i))
            if not cands:
                return None
            resident.discard(cands[0])
            have.discard(cands[0])
        d.resident[t] = set(resident)
        d.recompute[t] = list(recs)
        d.page_in[t] = []
        for i in lv.needs[t]:
            last_use[i] = t
        resident = have
    d.keep = set(d.resident[B0])
    return d
