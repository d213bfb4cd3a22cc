"""A budget-aware start for the POET MILP: keep what fits, bring the rest back the cheaper way.

The other heuristics ignore the budget (store-all, checkpointing, paging) or cannot page (DTR), so at tight
budgets the MILP often started from paging everything, far from the optimum. Here each decision tensor is brought
back for backward by the cheaper of a page-in (storing it after its forward compute) or a recompute (with the
inputs that are not kept, recursively); tensors are then dropped from the kept set, one at a time, at the first
stage over the budget, the one freeing the most bytes per joule of extra energy first, until the schedule
validates.
"""
from __future__ import annotations

from .steps import Decisions, build_steps, on_demand
from edgetrain.compiler.graph.ir import TrainingGraph
from edgetrain.compiler.graph.liveness import Liveness
from .validator import validate


def _bring_costs(g: TrainingGraph, lv: Liveness, target, keep: set[str], paging: bool) -> tuple[dict, set]:
    """Per tensor, the energy of bringing it back once if not kept, and the tensors cheaper to page in.
    A stored input counts its page-in only: its page-out is paid once, for every reader."""
    cost: dict[str, float] = {}
    fetch: dict[str, float] = {}
    page_first: set[str] = set()
    for i in lv.decision:  # forward order: inputs first
        page = (target.page_in_energy_j(lv.size[i]) + target.page_out_energy_j(lv.size[i])) if paging else None
        rec = None
        if lv.recomputable(i):
            rec = g.node(i).energy_j + sum(0.0 if j in keep else fetch[j] for j in lv.inputs_of[i])
        if page is not None and (rec is None or page < rec):
            page_first.add(i)
            cost[i], fetch[i] = page, target.page_in_energy_j(lv.size[i])
        else:
            cost[i] = fetch[i] = float("inf") if rec is None else rec
    return cost, page_first


def _schedule(g, lv, target, keep: set[str], paging: bool, retain: bool) -> Decisions:
    cost, page_first = _bring_costs(g, lv, target, keep, paging)
    stored = {i for i in page_first if i not in keep} if paging else set()
    stored |= {i for i in lv.decision if not lv.recomputable(i) and i not in keep and paging}
    return on_demand(g, lv, keep=keep, page_out=stored, retain=retain, page_first=page_first,
                     kept_for_recompute=False)


def greedy_keep(g: TrainingGraph, lv: Liveness, target, budget_bytes: int, *, paging: bool = True,
                retain: bool = False) -> Decisions | None:
    """The schedule described above, or None when dropping every droppable tensor still does not fit."""
    keep = {i for t in range(lv.B0, lv.T) for i in lv.needs[t]}  # store-all's: what backward reads
    pinned = set() if paging else {i for i in lv.decision if not lv.recomputable(i)}
    for _ in range(len(lv.decision) + 1):
        try:
            d = _schedule(g, lv, target, keep, paging, retain)
        except ValueError:
            return None
        rep = validate(g, build_steps(g, lv, d), target, None)
        over = [t for t, p in enumerate(rep.stage_peaks) if p > budget_bytes]
        if not over:
            return d
        t = over[0]
        held = {i for i in keep if lv.end[i] < t} if t < lv.B0 else set(d.resident.get(t, ())) & keep
        cands = sorted(held - pinned)
        if not cands:
            return None
        cost, _ = _bring_costs(g, lv, target, keep, paging)
        uses = {i: max(1, sum(i in lv.needs[s] for s in range(lv.B0, lv.T))) for i in cands}
        keep.discard(max(cands, key=lambda i: (lv.size[i] / max(cost[i] * uses[i], 1e-30), i)))
    return None
