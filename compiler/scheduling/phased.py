"""Large-neighbourhood search on the POET MILP: better incumbents for graphs HiGHS cannot close in time.

Two kinds of neighbourhood of the incumbent: windows (free the variables of consecutive decision tensors in
forward order, or of consecutive backward stages, fix every other variable at the incumbent, solve that
sub-MIP) and local branching (the whole model with one more row: at most k binaries differ from the
incumbent). Every solution of either is a solution of the full model (same rows, tighter bounds or one more
row), so the incumbent only improves. It proves nothing: the caller reports the gap against the full model's
proven bound.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import numpy as np

from edgetrain.compiler.graph.liveness import Liveness
from .milp import highs
from .milp.model import SparseMILP
from .poet import PoetModel, without_redundant_holds


@dataclass
class LnsResult:
    values: np.ndarray
    objective: float
    rounds: int
    improved: int
    seconds: float
    branched: int = 0  # local-branching rounds among `rounds`


# Share of the time limit for the first full solve: its bound and the incumbent the LNS starts from. 0.2 rather
# than 0.3 since local branching (ResNet-18, nrf52840, 40%, 30 s: 0.117% with the 10% moved to the LNS, 0.134%
# without).
FIRST_SHARE = 0.2
# When the first solve ends above this gap, the recompute-only restriction is solved for PROBE_SHARE of the time
# (taken from the search) and starts the search if better. ResNet-50/nrf52840/40% (first solve: 5.59 J of added
# energy, gap 3.5%): it finds 3.75 J in 25 s with no warm start, and 50 s of search from there 2.88 J (from the
# first solve's incumbent: 4.0-4.3 J). It is infeasible at the smallest budgets (returns at once) and worse than
# the first incumbent on BERT-base (483 J vs 47 J at min) and ResNet-18 40% (1.77 J vs 0.74 J): hence the gate.
PROBE_GAP = 0.02
PROBE_SHARE = 0.15
# A last solve on the plain model with at most REDO times the first solve's time is skipped (see solve_phased).
REDO = 1.5


def recompute_only(pm: PoetModel) -> SparseMILP:
    """The POET MILP with every page-out fixed at 0 (page-ins follow: P <= PO). The same problem as Checkmate's
    `poet.build(paging=False)`, but as bounds on this model: its values index this model's variables, so a
    solution is a start for the search as it is."""
    upper = list(pm.milp.upper)
    for j in pm.PO.values():
        upper[j] = 0.0
    return replace(pm.milp, upper=upper)


def owners(pm: PoetModel, lv: Liveness) -> np.ndarray:
    """For each variable, the forward index of the decision tensor it belongs to."""
    index = {name: k for k, name in enumerate(lv.decision)}
    out = np.full(pm.milp.n_vars, -1, dtype=np.int64)
    for i, j in list(pm.K.items()) + list(pm.PO.items()):
        out[j] = index[i]
    for d in (pm.S, pm.R, pm.P):
        for (_, i), j in d.items():
            out[j] = index[i]
    return out


def stages(pm: PoetModel) -> np.ndarray:
    """For each variable, its backward stage (-1 for K and PO, which belong to the forward pass)."""
    out = np.full(pm.milp.n_vars, -1, dtype=np.int64)
    for d in (pm.S, pm.R, pm.P):
        for (t, _), j in d.items():
            out[j] = t
    return out


def local_branch(m: SparseMILP, x: np.ndarray, radius: int, seconds: float, threads: int | None = None):
    """Solve `m` with one more row: at most `radius` binaries differ from `x`. Any solution is one of `m`."""
    row = [(j, -1.0 if x[j] > 0.5 else 1.0) for j in range(m.n_vars) if m.integer[j]]
    ones = sum(1 for _, v in row if v < 0)
    near = m.with_rows([row], hi=float(radius - ones))
    return highs.solve(near, time_limit=seconds, mip_gap=1e-6, warm_start=x, threads=threads)


def improve(pm: PoetModel, lv: Liveness, x0: np.ndarray, seconds: float, *, window: float = 0.1,
            stage_window: float = 0.15, round_limit: float = 2.0, radius: int = 80, turn: float = 5.0,
            keep_turn: float = 0.03, threads: int | None = None, seed: int = 0) -> LnsResult:
    """Improve the incumbent `x0` for `seconds` with two kinds of moves, in turns of about `turn` seconds:

    - local branching: the whole model, within `radius` binaries of the incumbent (one solve per turn);
    - windows: sub-MIPs of `round_limit` seconds, alternating a random (seeded) window of consecutive decision
      tensors (all their variables) and one of consecutive backward stages (all tensors' variables there).

    Local branching goes first and keeps its turns while it gains as much energy per second as the windows did in
    their last turn (before their first: `keep_turn` of the schedule's added energy per turn); the windows run when
    it misses or falls behind. A local-branching turn that gains nothing waits for the windows to move the
    incumbent, and twice as many window turns after each further miss in a row; two misses before any gain end it
    (on ResNet-50 its root LP alone takes about a turn). Ends when the windows stop gaining (three covers of both
    without gain) while local branching waits.

    Measured (ResNet-18, nrf52840, 40%, extra energy over computing every node once): windows alone reach a
    local optimum of theirs at 0.563 J in 5-16 s, from which local branching (radius 60, 5 s) finds 0.514 J in
    one turn; from the first solve's incumbent (0.736 J), three 5 s turns reach 0.52-0.53 J at radius 80-100
    (radius 30 finds nothing; 120-200 and 4 s turns less). On ResNet-50 it finds nothing in 60 s (the windows do
    the work there), on ResNet-18 at the smallest budget less than the windows: hence the turns. There its
    turns gain 2.3% then 0.5% of the added energy, at 40% 14%, 15%, 4%, 1.3%: hence `keep_turn`. Phased 30 s
    solves of that case: local branching only 0.092% gap, windows only 0.19%, turns from an even start (windows
    first explored, 5 s or 2.5 s window turns) 0.116-0.19%, turns with keep_turn 0 0.092-0.094% (smallest
    budget: 1.70%, 1.40%, 1.40-1.54%, 1.38-2.58%), with 0.03 0.092% (1.39-2.16%: at the smallest budget the
    last solve's bound varies with the 4-6 s it gets).
    """
    t0 = time.perf_counter()
    m = pm.milp
    rng = np.random.default_rng(seed)
    own, when = owners(pm, lv), stages(pm)
    n, n_stages = len(lv.decision), lv.T - lv.B0
    width = max(2, min(n, int(round(window * n))))
    stage_width = max(2, min(n_stages, int(round(stage_window * n_stages))))
    cover = n // width + n_stages // stage_width
    x = np.round(np.asarray(x0, dtype=np.float64))
    best = m.objective(x)
    lower, upper = np.asarray(m.lower, dtype=np.float64), np.asarray(m.upper, dtype=np.float64)
    rounds, improved, branched, since = 0, 0, 0, 0
    # Energy gained per second in each kind's last turn. The windows start at `keep_turn` of the incumbent's
    # added energy per turn: local branching keeps its turns while it gains that much, or what the windows
    # did in their last turn.
    rate = {"branch": math.inf, "windows": keep_turn * max(best - pm.base_energy_j, 0.0) / turn}
    misses, wait, gained = 0, 0, False  # turns in a row without gain, window turns to the next, any gain yet

    def better(r) -> bool:
        nonlocal x, best, improved
        if r.values is not None and r.objective < best - 1e-12 * abs(best) and m.is_feasible(r.values):
            x, best = np.round(r.values), r.objective
            improved += 1
            return True
        return False

    while True:
        left = seconds - (time.perf_counter() - t0)
        if left < 0.5:
            break
        branch_ok = radius > 0 and wait == 0
        if since >= 3 * cover and not branch_ok:
            break  # a local optimum of both windows, and nothing better near it found by local branching
        kind = "branch" if branch_ok and (rate["branch"] >= rate["windows"] or since >= 3 * cover) else "windows"
        start, before = time.perf_counter(), best
        if kind == "branch":
            rounds += 1
            branched += 1
            if better(local_branch(m, x, radius, min(left, turn), threads)):
                since, misses, gained = 0, 0, True
            else:
                misses += 1
                # Two misses before any gain: the model is too big for a turn (ResNet-50); stop trying.
                wait = 2 ** (misses - 1) if gained or misses < 2 else math.inf
        else:
            while time.perf_counter() - start < turn and since < 3 * cover:
                left = seconds - (time.perf_counter() - t0)
                if left < 0.5:
                    break
                if rounds % 2 == 0:
                    free = (own - rng.integers(n)) % n < width
                else:
                    first = lv.B0 + rng.integers(n_stages)
                    free = (when >= first) & (when < first + stage_width)
                sub = replace(m, lower=list(np.where(free, lower, x)), upper=list(np.where(free, upper, x)))
                rounds += 1
                since += 1
                if better(highs.solve(sub, time_limit=min(left, round_limit), mip_gap=1e-6, warm_start=x,
                                      threads=threads)):
                    since = 0
            wait = max(0, wait - 1) if best < before else wait
        rate[kind] = (before - best) / max(time.perf_counter() - start, 1e-9)
    return LnsResult(values=x, objective=best, rounds=rounds, improved=improved,
                     seconds=time.perf_counter() - t0, branched=branched)


def solve_phased(solver: str, pm: PoetModel, lv: Liveness, *, time_limit: float, mip_gap: float,
                 warm_start: np.ndarray | None, threads: int | None, lns: float, cuts: float = 0.0):
    """Full solve for FIRST_SHARE of the time; if it did not finish, in order:

    - above a PROBE_GAP gap, the recompute-only restriction for at most PROBE_SHARE of the time (a better start);
    - `cuts` > 0: window and memory cuts for at most that share (cuts.strengthen). The last solve runs on the model with
      them when their LP alone lifts the bound at least 3/4 of the way from the plain LP to what the first solve
      proved (see _worth_it). Where the LP is too slow for the last solve to re-solve it with them (ResNet-50,
      BERT-base), the cut rounds may take the last solve's time instead: their LP bound is the gain;
    - the search (`improve`) from the best incumbent for `lns` of the time and whatever the steps above left;
    - the full solve again from the search's incumbent for the rest.

    The first solve and the search stay on the plain model: the cut rows, measured, cost them their incumbents.
    The reported bound is the largest proven one (the LP with cuts among them) and the gap is the best
    incumbent's against it.
    """
    from .cuts import strengthen
    from .milp.registry import solve_with

    t0 = time.perf_counter()
    first = solve_with(solver, pm.milp, time_limit=FIRST_SHARE * time_limit, mip_gap=mip_gap, warm_start=warm_start,
                       threads=threads)
    if first.status in ("optimal", "infeasible", "error") or lns <= 0:
        return first
    start = first.values if first.values is not None else warm_start
    if start is None:
        return first
    search = lns * time_limit
    probe = None
    if first.gap is not None and first.gap > PROBE_GAP and pm.PO:
        # Far from proven: try the recompute-only restriction (page-outs fixed at 0; an easier MIP whose schedules
        # are schedules of the full model) for a better start, in the search's time.
        began = time.perf_counter()
        probe = solve_with(solver, recompute_only(pm), time_limit=PROBE_SHARE * time_limit,
                           mip_gap=mip_gap, threads=threads)
        search = max(search - (time.perf_counter() - began), 0.0)
        if probe.values is not None and pm.milp.is_feasible(probe.values) and \
                pm.milp.objective(probe.values) < pm.milp.objective(start):
            start = probe.values
    # What the last solve gets: the rest of the time after the search and the cuts' shares.
    reserve = max(time_limit - (time.perf_counter() - t0) - search - cuts * time_limit, 0.0)
    final, report, bounds, cut_off = pm, None, [first.bound], False
    planned, repeat = True, False  # a last solve planned; skipped as a repeat of the first
    if cuts > 0:
        start = without_redundant_holds(pm, lv, start)
        with_cuts, report = strengthen(pm, lv, seconds=cuts * time_limit, then=reserve, threads=threads,
                                       warm_start=start)
        bounds.append(report.lp_after)
        if report.took_then:
            reserve, planned = 0.0, False
        elif _worth_it(report, first.bound):
            final = with_cuts
    if planned and final is pm and reserve <= REDO * first.seconds:
        # The last solve would be the first one again (same model, about as long): its bound stays below the
        # first's (ResNet-50/nrf52840/min: 14.34 J of added energy vs 14.36 J; ResNet-18/jetson-agx-orin/40%:
        # 0.00772 J vs 0.00802 J), so the search takes its time.
        reserve, planned, repeat = 0.0, False, True
    # The search gets its share and what the cuts left unused (of theirs, and of the last solve's if they took it).
    local = improve(pm, lv, start, max(time_limit - (time.perf_counter() - t0) - reserve, 0.0), threads=threads)
    if final is not pm:
        clean = without_redundant_holds(pm, lv, local.values)
        local = replace(local, values=clean, objective=pm.milp.objective(clean))
        cut_off = not final.milp.is_feasible(clean)
        if cut_off:  # a bug in the cuts (they hold for every schedule without redundant holds): say so
            final = pm
    left = time_limit - (time.perf_counter() - t0)
    last = first  # when the cut rounds or the search took the last solve's time, there is none
    if planned or left > 0.5:
        last = solve_with(solver, final.milp, time_limit=max(left, 0.1), mip_gap=mip_gap,
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
    status = "optimal" if gap is not None and gap <= mip_gap * (1 + 1e-6) + 1e-12 else (
        "time_limit" if values is not None or last.status == "time_limit" else last.status)
    out = replace(last, values=values, objective=objective, bound=bound, gap=gap, status=status,
                  seconds=time.perf_counter() - t0)
    notes = [out.notice]
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
    """Whether the last solve should carry the cuts. Measured on ResNet-18 (added energy over computing
    every node once: plain LP -> LP with cuts, against the bound the first 30% of a 30 s solve proved):
    nrf52840 40% 0.275 -> 0.476 J vs 0.45 J (the cut model ended at a 0.19% gap, the plain one 0.21-0.25%);
    nrf52840 min 1.75 -> 2.7 J vs 2.8 J (1.33-1.57% vs 2.26-2.32%); jetson-agx-orin 40% 0.0057 -> 0.0068 J
    vs 0.0076 J (0.48% vs 0.26%: the bigger model only cost time there)."""
    if report.lp_after is None or report.lp_before is None or report.cuts == 0:
        return False
    if proved is None or proved <= report.lp_before:
        return report.lp_after > report.lp_before
    return report.lp_after - report.lp_before >= 0.75 * (proved - report.lp_before)
