"""A recompute-only start from the LP relaxation: round it, then repair the stages the rounding overflows.

The recompute-only restriction (every page-out at 0, `search.recompute_only`) is where the good schedules of the
tight nrf52840 budgets lie, but HiGHS's first schedule of it is a feasibility-jump draw that depends on the seed.
Its LP relaxation is nearly integral on which tensors to keep from the forward pass; what it spreads thinly is
the backward pass: it recomputes a residual chain a little at every stage and holds a growing fraction of it.
So the start is built in two steps, both deterministic:

1. Rounding: keep the tensors with K >= 1/2 (and what cannot be recomputed); at each backward stage recompute what
   the stage reads and is not held (with its inputs, recursively), and hold into the next stage what the LP holds
   there with S >= 1/2.
2. Repair: the stages this overflows recompute a whole residual chain at once. A sub-MIP frees the variables of
   the tensors those stages recompute and of their inputs (at every stage), fixes every other tensor at the
   rounding, and takes its first schedule: where to recompute and hold the chains within the budget. A second
   one frees what those stages hold too; the cheaper schedule is the start.

Every schedule it returns satisfies the full model (`pm.milp.is_feasible`). Figures: docs/solver.md.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np

from edgetrain.compiler.graph.liveness import Liveness

from .milp.registry import Solver
from .poet import PoetModel
from .search import recompute_only
from .steps import Decisions

HALF = 0.5  # rounding threshold of K and S


@dataclass
class RoundedStart:
    values: np.ndarray | None  # a schedule of the full model, or None
    objective: float | None
    lp: float | None  # the restriction's LP optimum (a bound of the restriction only)
    rounded: float | None  # energy of the rounded schedule, before repair
    overflow: int  # backward and forward stages the rounding puts over the budget
    repaired: str  # "not needed", "first schedule", or why the repair sub-MIP has none
    freed: int  # tensors the repair freed
    seconds: float

    def note(self) -> str:
        found = "no schedule" if self.objective is None else f"{self.objective:.6g} J"
        if self.lp is None:
            return f"recompute-only rounding: no LP optimum in time, {self.seconds:.1f} s"
        fix = "" if self.repaired == "not needed" else \
            f", {self.overflow} stages over the budget repaired by a sub-MIP of {self.freed} tensors ({self.repaired})"
        return f"recompute-only rounding: {found} (rounded {self.rounded:.6g} J{fix}), {self.seconds:.1f} s"


def rounded(pm: PoetModel, lv: Liveness, x: np.ndarray, threshold: float = HALF) -> Decisions:
    """The schedule of step 1 above from LP values `x`. Raises ValueError when a tensor that cannot be recomputed
    is needed and not kept."""
    order = {name: k for k, name in enumerate(lv.decision)}
    keep = {i for i, j in pm.K.items() if x[j] >= threshold or not lv.recomputable(i)}
    d = Decisions(keep=set(keep), page_out=set())
    resident = set(keep)

    def bring(i: str, t: int, recs: list[str], have: set[str]) -> None:
        if i in have:
            return
        if not lv.recomputable(i) or t > lv.recompute_until[i]:
            raise ValueError(f"{i} is needed at stage {t} but neither kept nor recomputable")
        for j in lv.inputs_of[i]:
            bring(j, t, recs, have)
        recs.append(i)
        have.add(i)

    for t in range(lv.B0, lv.T):
        d.resident[t] = {i for i in resident if lv.window_end[i] >= t}
        recs: list[str] = []
        have = set(d.resident[t])
        for i in lv.needs[t]:
            bring(i, t, recs, have)
        d.page_in[t] = []
        d.recompute[t] = sorted(recs, key=order.__getitem__)
        resident = {i for i in have if t < lv.window_end[i] and (s := pm.S.get((t + 1, i))) is not None
                    and x[s] >= threshold}
    return d


def over_budget(pm: PoetModel, lv: Liveness, d: Decisions) -> list[int]:
    """Stages whose memory row `d` breaks: forward stages holding too many kept tensors, backward stages holding
    and recomputing too much."""
    budget = pm.free[lv.B0] + lv.static[lv.B0]  # free[t] is the budget less stage t's fixed bytes
    held = [0] * lv.T
    for i in d.keep:
        for t in range(lv.end[i] + 1, lv.B0):
            held[t] += lv.size[i]
    for t in range(lv.B0, lv.T):
        held[t] += sum(lv.size[i] for i in d.resident[t] | set(d.recompute[t]) if t <= lv.window_end[i])
    return [t for t in range(lv.T) if held[t] > budget - lv.static[t]]


def recompute_start(pm: PoetModel, lv: Liveness, seconds: float, threads: int | None = None,
                    solver: Solver | str = "auto") -> RoundedStart:
    """Steps 1 and 2 above within `seconds` (the LP, then the repair with what is left)."""
    t0 = time.perf_counter()
    solver = Solver.of(solver)
    only = recompute_only(pm)
    lp = solver.lp(only, threads=threads).solve(seconds)
    if lp is None:
        return RoundedStart(None, None, None, None, 0, "no LP", 0, time.perf_counter() - t0)
    bound, x = lp
    try:
        d = rounded(pm, lv, x)
    except ValueError:
        return RoundedStart(None, None, bound, None, 0, "no rounding", 0, time.perf_counter() - t0)
    xr = pm.vector(d)
    energy = pm.milp.objective(xr)
    over = over_budget(pm, lv, d)
    if pm.milp.is_feasible(xr):
        return RoundedStart(xr, energy, bound, energy, 0, "not needed", 0, time.perf_counter() - t0)
    # Two repairs, the best kept: the chains (what the overflowing backward stages recompute) and their inputs;
    # then also what those stages hold. Neither contains the other's schedules as first found: on ResNet-50 the
    # first gives 2.857 J added, the second 6.18 J; on ResNet-18 at batch 2 the first 1.92 J or nothing, the
    # second 1.02 J. Every kept tensor is freed when a forward stage overflows (or another row breaks).
    recomputed = {i for t in over if t >= lv.B0 for i in d.recompute[t]}
    held = {i for t in over if t >= lv.B0 for i in d.resident[t] if t <= lv.window_end[i]}
    best, status, freed, tried = None, "infeasible", 0, []
    for chain in (recomputed, recomputed | held):
        if not over or min(over) < lv.B0:
            chain = chain | set(pm.K)
        chain = chain | {j for i in chain for j in lv.inputs_of[i]}
        left = seconds - (time.perf_counter() - t0)
        if left <= 0.1 or chain in tried:
            break
        tried.append(chain)
        res = _repair(pm, only, xr, chain, left, threads, solver)
        status = res.status
        if res.values is not None and pm.milp.is_feasible(np.round(res.values)):
            x1 = np.round(res.values)
            if best is None or pm.milp.objective(x1) < pm.milp.objective(best):
                best, freed = x1, len(chain)
    return RoundedStart(best, pm.milp.objective(best) if best is not None else None, bound, energy, len(over),
                        "first schedule" if best is not None else status, freed, time.perf_counter() - t0)


def _repair(pm: PoetModel, only, xr: np.ndarray, chain: set[str], seconds: float, threads: int | None,
            solver: Solver):
    """The restriction with the K, S and R of every tensor outside `chain` fixed at `xr`: its first schedule."""
    fixed = np.zeros(pm.milp.n_vars, dtype=bool)
    for i, j in pm.K.items():
        fixed[j] = i not in chain
    for (_, i), j in list(pm.S.items()) + list(pm.R.items()):
        fixed[j] = i not in chain
    lower = np.where(fixed, xr, np.asarray(only.lower, dtype=np.float64))
    upper = np.where(fixed, xr, np.asarray(only.upper, dtype=np.float64))
    sub = replace(only, lower=list(lower), upper=list(upper))
    # The first schedule of the sub-MIP (feasibility jump's, on ResNet-50 in 2-3 s) is the start: its root bound is
    # the restriction's LP again, so proving more would take the rest of the time for nothing.
    return solver.solve(sub, time_limit=max(seconds, 0.1), threads=threads, solutions=1)
