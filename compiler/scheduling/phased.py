"""The phased solve: a first full solve, then, when it does not prove the gap, a recompute-only probe, window
and memory cuts, the neighbourhood search and a last full solve, each in its share of the time limit."""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from edgetrain.compiler.graph.liveness import Liveness

from .clock import stopped
from .milp.registry import Solver
from .poet import PoetModel, without_redundant_holds
from .rounding import recompute_start
from .search import improve, recompute_only

# Share of the time limit for the first full solve: its bound and the search's first incumbent. Measurements
# behind this and the constants below: docs/solver.md.
FIRST_SHARE = 0.2
# Far from proven (gap above PROBE_GAP), a start from the recompute-only restriction (its LP rounded and repaired,
# rounding.recompute_start; else, the restriction solved as a MIP) in at most PROBE_SHARE of the time (taken from
# the search). Near a proof it finds worse than the first solve's incumbent, and at the smallest budgets it is
# infeasible: hence the gate.
PROBE_GAP = 0.02
PROBE_SHARE = 0.15
# A last solve on the plain model with at most REDO times the first solve's time is skipped (see solve_phased).
REDO = 1.5



def solve_phased(solver: Solver | str, pm: PoetModel, lv: Liveness, *, time_limit: float, mip_gap: float,
                 warm_start: np.ndarray | None, threads: int | None, lns: float, cuts: float = 0.0):
    """Full solve for FIRST_SHARE of the time; if it did not finish, in order:

    - above a PROBE_GAP gap, a recompute-only start for at most PROBE_SHARE of the time: the restriction's LP rounded
      and repaired (rounding.recompute_start), or where that finds none, the restriction as a MIP for the rest;
    - `cuts` > 0: window and memory cuts for at most that share (cuts.strengthen). The last solve runs on the model with
      them when their LP alone lifts the bound at least 3/4 of the way from the plain LP to what the first solve
      proved (see _worth_it). Where the LP is too slow for the last solve to re-solve it with them, the cut
      rounds may take the last solve's time instead: their LP bound is the gain;
    - the search (`improve`) from the best incumbent for `lns` of the time and whatever the steps above left;
    - the full solve again from the search's incumbent for the rest.

    The first solve and the search stay on the plain model: the cut rows cost them their incumbents.
    The reported bound is the largest proven one (the LP with cuts among them) and the gap is the best
    incumbent's against it. Every solve, the sub-solves included, goes through `solver` (its fallbacks' notices
    are reported once each).
    """
    from .cuts import strengthen

    t0 = time.perf_counter()
    solver = Solver.of(solver)
    first = solver.solve(pm.milp, time_limit=FIRST_SHARE * time_limit, mip_gap=mip_gap, warm_start=warm_start,
                       threads=threads)
    if first.status in ("optimal", "infeasible", "error", "interrupted") or lns <= 0:
        return first
    start = first.values if first.values is not None else warm_start
    if start is None:
        return first
    search = lns * time_limit
    probe, rounding = None, None
    if first.gap is not None and first.gap > PROBE_GAP and pm.PO:
        # Far from proven: a start from the recompute-only restriction (page-outs fixed at 0; its schedules are
        # schedules of the full model), in the search's time. Its LP rounded first (deterministic); the
        # restriction as a MIP (feasibility jump's draw, by the seed) only where that finds nothing.
        began = time.perf_counter()
        rounding = recompute_start(pm, lv, PROBE_SHARE * time_limit, threads=threads, solver=solver)
        found = rounding.values
        left = PROBE_SHARE * time_limit - (time.perf_counter() - began)
        if found is None and left > 1.0:
            probe = solver.solve(recompute_only(pm), time_limit=left, mip_gap=mip_gap, threads=threads)
            found = probe.values
        search = max(search - (time.perf_counter() - began), 0.0)
        if found is not None and pm.milp.is_feasible(found) and pm.milp.objective(found) < pm.milp.objective(start):
            start = found
    # What the last solve gets: the rest of the time after the search and the cuts' shares.
    reserve = max(time_limit - (time.perf_counter() - t0) - search - cuts * time_limit, 0.0)
    final, report, bounds, cut_off = pm, None, [first.bound], False
    planned, repeat = True, False  # a last solve planned; skipped as a repeat of the first
    if cuts > 0:
        start = without_redundant_holds(pm, lv, start)
        with_cuts, report = strengthen(pm, lv, seconds=cuts * time_limit, then=reserve, threads=threads,
                                       warm_start=start, solver=solver)
        bounds.append(report.lp_after)
        if report.took_then:
            reserve, planned = 0.0, False
        elif _worth_it(report, first.bound):
            final = with_cuts
    if planned and final is pm and reserve <= REDO * first.seconds:
        # The last solve would be the first one again (same model, about as long) and its bound would stay below
        # the first's, so the search takes its time.
        reserve, planned, repeat = 0.0, False, True
    # The search gets its share and what the cuts left unused (of theirs, and of the last solve's if they took it).
    local = improve(pm, lv, start, max(time_limit - (time.perf_counter() - t0) - reserve, 0.0), threads=threads,
                    solver=solver)
    if final is not pm:
        clean = without_redundant_holds(pm, lv, local.values)
        local = replace(local, values=clean, objective=pm.milp.objective(clean))
        cut_off = not final.milp.is_feasible(clean)
        if cut_off:  # a bug in the cuts (they hold for every schedule without redundant holds): say so
            final = pm
    left = time_limit - (time.perf_counter() - t0)
    last = first  # when the cut rounds or the search took the last solve's time, there is none
    if planned or left > 0.5:
        last = solver.solve(final.milp, time_limit=max(left, 0.1), mip_gap=mip_gap,
                            warm_start=local.values, threads=threads)
        bounds.append(last.bound)
    runs = [r for r in (first, last) if r.values is not None]
    best = min(runs, key=lambda r: r.objective) if runs else last
    values, objective = best.values, best.objective
    if local.objective < (objective if objective is not None else np.inf):
        values, objective = local.values, local.objective
    bounds = [b for b in bounds if b is not None]
    bound = max(bounds) if bounds else None
    gap = None if objective is None or bound is None else max(0.0, (objective - bound) / max(abs(objective), 1e-12))
    status = "optimal" if gap is not None and gap <= mip_gap * (1 + 1e-6) + 1e-12 else "interrupted" if stopped() else (
        "time_limit" if values is not None or last.status == "time_limit" else last.status)
    out = replace(last, values=values, objective=objective, bound=bound, gap=gap, status=status,
                  seconds=time.perf_counter() - t0)
    notes = list(solver.notices)  # the fallbacks of every solve, the main ones' and the sub-solves'
    if rounding is not None:
        notes.append(rounding.note())
    if probe is not None:
        found = "no schedule" if probe.objective is None else f"{probe.objective:.6g} J"
        notes.append(f"recompute-only probe: {probe.status}, {found}, {probe.seconds:.1f} s")
    if repeat and last is first:
        notes.append("last solve skipped (the plain model again, about as long as the first: the search took its time)")
    notes.append(f"LNS: {local.rounds} rounds ({local.branched} local branching), {local.improved} improved, "
                 f"{local.seconds:.1f} s")
    if report is not None:
        kept = "kept" if final is not pm else "left out (small LP lift next to what the plain solve proved)"
        if report.took_then:
            kept = "their LP bound counts; the LP is too slow to solve the model with them in the time left"
        if cut_off:
            kept = "left out: they cut off the search's schedule (a bug; please report it)"
        notes.append(f"cuts: {report.cuts} ({report.memory} memory, the rest window) in {report.rounds} LP rounds, "
                     f"{report.seconds:.1f} s, {kept}")
        out.cuts = {**report.to_json(), "kept": final is not pm}
    out.notice = "; ".join(x for x in notes if x)
    return out


def _worth_it(report, proved: float | None) -> bool:
    """Whether the last solve should carry the cuts: when their LP alone lifts the bound at least 3/4 of the way
    from the plain LP to what the first solve proved. Below that, the bigger model costs the last solve more time
    than the cuts bring."""
    if report.lp_after is None or report.lp_before is None or report.cuts == 0:
        return False
    if proved is None or proved <= report.lp_before:
        return report.lp_after > report.lp_before
    return report.lp_after - report.lp_before >= 0.75 * (proved - report.lp_before)
