"""Large-neighbourhood search on the POET MILP: better incumbents for graphs HiGHS cannot close in time.

Repeatedly free the variables of a window of consecutive decision tensors (forward order), fix every other
variable at the incumbent, and solve that sub-MIP from the incumbent. Every sub-MIP solution is a solution of
the full model (same rows, tighter bounds), so the incumbent only improves; the window slides by half its
width. It proves nothing: the caller reports the gap against the full model's proven bound.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np

from .liveness import Liveness
from .milp import highs
from .poet import PoetModel


@dataclass
class LnsResult:
    values: np.ndarray
    objective: float
    rounds: int
    improved: int
    seconds: float


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


def improve(pm: PoetModel, lv: Liveness, x0: np.ndarray, seconds: float, *, window: float = 0.1,
            round_limit: float = 5.0, threads: int | None = None) -> LnsResult:
    """Slide a window over the decision tensors for `seconds`; return the best solution found."""
    t0 = time.perf_counter()
    m = pm.milp
    own = owners(pm, lv)
    n = len(lv.decision)
    width = max(2, min(n, int(round(window * n))))
    x = np.round(np.asarray(x0, dtype=np.float64))
    best = m.objective(x)
    lower, upper = np.asarray(m.lower, dtype=np.float64), np.asarray(m.upper, dtype=np.float64)
    start, rounds, improved = 0, 0, 0
    while True:
        left = seconds - (time.perf_counter() - t0)
        if left < 0.5:
            break
        free = (own - start) % n < width
        sub = replace(m, lower=list(np.where(free, lower, x)), upper=list(np.where(free, upper, x)))
        r = highs.solve(sub, time_limit=min(left, round_limit), mip_gap=1e-6, warm_start=x, threads=threads)
        rounds += 1
        if r.values is not None and r.objective < best - 1e-12 * abs(best) and m.is_feasible(r.values):
            x, best = np.round(r.values), r.objective
            improved += 1
        start = (start + max(1, width // 2)) % n
        if rounds * max(1, width // 2) >= 3 * n and improved == 0:
            break  # three sweeps with no gain: a local optimum for this neighbourhood
    return LnsResult(values=x, objective=best, rounds=rounds, improved=improved,
                     seconds=time.perf_counter() - t0)


def solve_phased(solver: str, pm: PoetModel, lv: Liveness, *, time_limit: float, mip_gap: float,
                 warm_start: np.ndarray | None, threads: int | None, lns: float):
    """Full solve for 30% of the time; if it did not finish, LNS from its incumbent for `lns` of the time,
    then the full solve again from the LNS incumbent for the rest. Both full solves bound the same model, so
    the reported bound is the larger one and the gap is the best incumbent's against it."""
    from .milp.registry import solve_with

    t0 = time.perf_counter()
    first = solve_with(solver, pm.milp, time_limit=0.3 * time_limit, mip_gap=mip_gap, warm_start=warm_start,
                       threads=threads)
    if first.status in ("optimal", "infeasible", "error") or lns <= 0:
        return first
    start = first.values if first.values is not None else warm_start
    if start is None:
        return first
    local = improve(pm, lv, start, lns * time_limit, threads=threads)
    left = time_limit - (time.perf_counter() - t0)
    last = solve_with(solver, pm.milp, time_limit=max(left, 0.1), mip_gap=mip_gap, warm_start=local.values,
                      threads=threads)
    runs = [r for r in (first, last) if r.values is not None]
    best = min(runs, key=lambda r: r.objective) if runs else last
    values, objective = best.values, best.objective
    if local.objective < (objective if objective is not None else np.inf):
        values, objective = local.values, local.objective
    bounds = [r.bound for r in (first, last) if r.bound is not None]
    bound = max(bounds) if bounds else None
    gap = None if objective is None or bound is None else max(0.0, (objective - bound) / max(abs(objective), 1e-12))
    status = "optimal" if gap is not None and gap <= mip_gap * (1 + 1e-6) + 1e-12 else (
        "time_limit" if values is not None or last.status == "time_limit" else last.status)
    out = replace(last, values=values, objective=objective, bound=bound, gap=gap, status=status,
                  seconds=time.perf_counter() - t0)
    out.notice = "; ".join(x for x in (out.notice, f"LNS: {local.rounds} rounds, {local.improved} improved, "
                                       f"{local.seconds:.1f} s") if x)
    return out
