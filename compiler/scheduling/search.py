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

from .clock import stopped
from .milp.model import SparseMILP
from .milp.registry import Solver
from .poet import PoetModel


@dataclass
class LnsResult:
    values: np.ndarray
    objective: float
    rounds: int
    improved: int
    seconds: float
    branched: int = 0  # local-branching rounds among `rounds`


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


def local_branch(m: SparseMILP, x: np.ndarray, radius: int, seconds: float, threads: int | None = None,
                 solver: Solver | str = "auto"):
    """Solve `m` with one more row: at most `radius` binaries differ from `x`. Any solution is one of `m`."""
    row = [(j, -1.0 if x[j] > 0.5 else 1.0) for j in range(m.n_vars) if m.integer[j]]
    ones = sum(1 for _, v in row if v < 0)
    near = m.with_rows([row], hi=float(radius - ones))
    return Solver.of(solver).solve(near, time_limit=seconds, mip_gap=1e-6, warm_start=x, threads=threads)


def improve(pm: PoetModel, lv: Liveness, x0: np.ndarray, seconds: float, *, window: float = 0.1,
            stage_window: float = 0.15, round_limit: float = 2.0, radius: int = 80, turn: float = 5.0,
            keep_turn: float = 0.03, threads: int | None = None, seed: int = 0,
            solver: Solver | str = "auto") -> LnsResult:
    """Improve the incumbent `x0` for `seconds` with two kinds of moves, in turns of about `turn` seconds:

    - local branching: the whole model, within `radius` binaries of the incumbent (one solve per turn);
    - windows: sub-MIPs of `round_limit` seconds, alternating a random (seeded) window of consecutive decision
      tensors (all their variables) and one of consecutive backward stages (all tensors' variables there).

    Local branching goes first and keeps its turns while it gains as much energy per second as the windows did in
    their last turn (before their first: `keep_turn` of the schedule's added energy per turn); the windows run when
    it misses or falls behind. A local-branching turn that gains nothing waits for the windows to move the
    incumbent, and twice as many window turns after each further miss in a row; two misses before any gain end it
    (a model whose root LP alone takes about a turn). Ends when the windows stop gaining (three covers of both
    without gain) while local branching waits.

    Local branching finds moves that no window holds (schedules that differ all over the network); the windows
    gain more where its LP is slow or at the smallest budgets: hence the turns. Figures: docs/solver.md.
    """
    t0 = time.perf_counter()
    solver = Solver.of(solver)
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
        if left < 0.5 or stopped():  # out of time, or Ctrl-C (scheduling/interrupt.py)
            break
        branch_ok = radius > 0 and wait == 0
        if since >= 3 * cover and not branch_ok:
            break  # a local optimum of both windows, and nothing better near it found by local branching
        kind = "branch" if branch_ok and (rate["branch"] >= rate["windows"] or since >= 3 * cover) else "windows"
        start, before = time.perf_counter(), best
        if kind == "branch":
            rounds += 1
            branched += 1
            if better(local_branch(m, x, radius, min(left, turn), threads, solver)):
                since, misses, gained = 0, 0, True
            else:
                misses += 1
                # Two misses before any gain: the model is too big for a turn; stop trying.
                wait = 2 ** (misses - 1) if gained or misses < 2 else math.inf
        else:
            while time.perf_counter() - start < turn and since < 3 * cover:
                left = seconds - (time.perf_counter() - t0)
                if left < 0.5 or stopped():
                    break
                if rounds % 2 == 0:
                    free = (own - rng.integers(n)) % n < width
                else:
                    first = lv.B0 + rng.integers(n_stages)
                    free = (when >= first) & (when < first + stage_width)
                sub = replace(m, lower=list(np.where(free, lower, x)), upper=list(np.where(free, upper, x)))
                rounds += 1
                since += 1
                if better(solver.solve(sub, time_limit=min(left, round_limit), mip_gap=1e-6, warm_start=x,
                                       threads=threads)):
                    since = 0
            wait = max(0, wait - 1) if best < before else wait
        rate[kind] = (before - best) / max(time.perf_counter() - start, 1e-9)
    return LnsResult(values=x, objective=best, rounds=rounds, improved=improved,
                     seconds=time.perf_counter() - t0, branched=branched)


