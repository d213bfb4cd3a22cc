"""OR-Tools CP-SAT adapter: a fast incumbent finder for all-integer models (POET's are all binary).

CP-SAT takes integer coefficients only, so the float model is scaled and rounded *conservatively*:

- Rows. Each row is scaled by a power of two (exact in floating point): rows whose coefficients are already
  integers keep scale 1; others are scaled so that their largest |coefficient| lies in [2^29, 2^30). With
  every variable written as x = l + y, y >= 0 (l its lower bound), a `<=` side keeps ceil(coefficient) and
  floor(right-hand side), a `>=` side floor(coefficient) and ceil(right-hand side); a ranged or equality row
  whose rounding is not exact becomes two rows. Hence every solution CP-SAT returns is feasible for the float
  model (exactly, not just within a tolerance). A row whose scaled coefficients are all integers is kept
  exactly: for integer variables, rounding its right-hand side loses nothing.
- Objective. Costs are scaled by a power of two (largest |cost| in [2^35, 2^36)) and rounded to the nearest
  integer; the model's `offset` is passed as CP-SAT's (float) objective offset. The reported objective is
  always the float model's, `m.objective(x)`, of the returned solution.

Bound: CP-SAT's `best_objective_bound` bounds the *scaled* model. It is mapped back (divided by the scale,
minus the worst-case objective rounding error over the variables' boxes) and reported only when every row
was kept exactly (`exact`): then the scaled model has the same feasible set as the float model and the
mapped bound is a valid lower bound. When some row was tightened (e.g. POET's deadline row, whose
coefficients are seconds), CP-SAT's feasible set is a strict subset of the float model's, its optimum
can be above the float optimum, and its bound is no bound of the float model. Then, if CP-SAT proved the
tightened model optimal with time to spare, the *outward*-rounded relaxation (a `<=` side keeps
floor(coefficient) and floor(right-hand side): every float-feasible integer point still meets it) is solved
with the remaining time, hinted with that optimum, and its mapped bound, which is valid, is reported.
Otherwise `bound` and `gap` are None.

Status: "optimal" only if CP-SAT proves OPTIMAL and a valid mapped bound puts the gap within `mip_gap`;
otherwise, with or without an incumbent, "time_limit": not proven for the float model, whether the time
ran out or not.
"infeasible" only with a proof for the float model: CP-SAT proves the exact model infeasible, or, when rows
were tightened, the tightened model and then the outward-rounded relaxation (a `<=` side keeps
floor(coefficient), which every float-feasible point still meets) both infeasible. When the relaxation is
feasible, nothing is proven and the status is "error" with no values.

`warm_start` becomes CP-SAT's solution hint; `threads` sets `num_workers` (default 2). Continuous variables
are rejected with ValueError. ortools imports lazily, so this module loads without it.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from .. import interrupt
from ..clock import stopped
from .model import SolveResult, SparseMILP

ROW_BITS = 30  # a scaled non-integer row's largest |coefficient| is in [2^(ROW_BITS-1), 2^ROW_BITS)
OBJ_BITS = 36  # likewise for the objective
ACTIVITY_LIMIT = 2.0**62  # CP-SAT needs every row's and the objective's activity to fit in int64
UNBOUNDED = 2**40  # an integer variable without a finite bound is boxed to [-2^40, 2^40] (and marked inexact)


@dataclass
class ScaledModel:
    """The CP-SAT model of a SparseMILP and what is needed to map its results back."""
    model: object  # cp_model.CpModel
    exact: bool  # every row (and every bound) kept exactly: same feasible set as the float model
    obj_scale: float  # CP-SAT objective = obj_scale * (float objective), up to rounding
    obj_correction: float  # min over the box of sum (c - q/scale) x: add to a mapped bound to keep it valid
    obj_exact: bool  # the costs were rounded without loss
    lower: np.ndarray
    upper: np.ndarray
    trivially_infeasible: bool = False  # an empty or over-tightened row that no assignment meets


def _csr(m: SparseMILP):
    """Rows of the model as CSR (duplicates summed): (row start, column, value)."""
    ri = np.asarray(m._ri, dtype=np.int64)
    ci = np.asarray(m._ci, dtype=np.int64)
    v = np.asarray(m._v, dtype=np.float64)
    key, inverse = np.unique(ri * max(m.n_vars, 1) + ci, return_inverse=True)
    vals = np.bincount(inverse, weights=v, minlength=len(key))
    rows, cols = key // max(m.n_vars, 1), key % max(m.n_vars, 1)
    keep = vals != 0.0
    rows, cols, vals = rows[keep], cols[keep], vals[keep]
    start = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=m.n_rows))]).astype(np.int64)
    return start, cols, vals


def _side(scaled: np.ndarray, cols: np.ndarray, coef: np.ndarray, rhs: float, k: int, lower: np.ndarray,
          upward: bool) -> int:
    """Right-hand side of one rounded side in terms of x: floor/ceil(s*rhs - sum s*a*l) + sum coef*l."""
    ls = lower[cols]
    nz = ls != 0
    if not nz.any():
        h = math.ldexp(rhs, k)  # exact: a power-of-two scaling
        return math.floor(h) if upward else math.ceil(h)
    h = Fraction(math.ldexp(rhs, k)) - sum(Fraction(float(a)) * int(l) for a, l in zip(scaled[nz], ls[nz]))
    base = math.floor(h) if upward else math.ceil(h)
    return base + sum(int(c) * int(l) for c, l in zip(coef[nz], ls[nz]))


def _range(coef: np.ndarray, cols: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> tuple[int, int]:
    """Smallest and largest activity of an integer row over the variables' box."""
    cf = coef.astype(np.float64)
    if float(np.abs(cf) @ np.maximum(np.abs(lower[cols]), np.abs(upper[cols])).astype(np.float64)) > ACTIVITY_LIMIT:
        raise ValueError("a row's activity does not fit CP-SAT's 64-bit integers")
    a, b = coef * lower[cols], coef * upper[cols]  # exact in int64 after the check above
    return int(np.minimum(a, b).sum()), int(np.maximum(a, b).sum())


def scale(m: SparseMILP, *, relax: bool = False) -> ScaledModel:
    """Build the conservatively rounded CP-SAT model (see the module doc).

    With `relax`, round the other way (a `<=` side keeps floor(coefficient), a `>=` side ceil): every
    float-feasible integer point stays feasible, so the rounded model's infeasibility proves the float
    model's."""
    from ortools.sat.python import cp_model

    integer = np.asarray(m.integer, dtype=bool)
    if not integer.all():
        j = int(np.flatnonzero(~integer)[0])
        raise ValueError(f"CP-SAT needs integer variables; {m.names[j] if m.names else j} is continuous")
    exact = True
    lower = np.ceil(np.asarray(m.lower, dtype=np.float64))
    upper = np.floor(np.asarray(m.upper, dtype=np.float64))
    if not (np.isfinite(lower).all() and np.isfinite(upper).all()):
        exact = False
        lower = np.where(np.isfinite(lower), lower, -UNBOUNDED)
        upper = np.where(np.isfinite(upper), upper, UNBOUNDED)
    lower, upper = lower.astype(np.int64), upper.astype(np.int64)
    model = cp_model.CpModel()
    proto = model.proto
    trivially_infeasible = bool((lower > upper).any())
    for lo, hi in zip(lower.tolist(), upper.tolist()):
        proto.variables.add().domain.extend([lo, max(lo, hi)])

    start, cols_all, vals_all = _csr(m)
    rows_lo = np.asarray(m.rows_lo, dtype=np.float64)
    rows_hi = np.asarray(m.rows_hi, dtype=np.float64)
    for r in range(m.n_rows):
        cols, a = cols_all[start[r]:start[r + 1]], vals_all[start[r]:start[r + 1]]
        lo, hi = rows_lo[r], rows_hi[r]
        if len(a) == 0:
            trivially_infeasible |= not (lo <= 0.0 <= hi)
            continue
        k = 0 if np.all(a == np.round(a)) else ROW_BITS - math.frexp(float(np.abs(a).max()))[1]
        scaled = np.ldexp(a, k)
        up, dn = np.ceil(scaled), np.floor(scaled)
        row_exact = bool(np.all(up == scaled))
        exact &= row_exact
        sides = []  # (coefficients, low, high, smallest and largest activity) of each CP-SAT row
        if row_exact:
            c = up.astype(np.int64)
            amin, amax = _range(c, cols, lower, upper)
            low = _side(scaled, cols, c, lo, k, lower, upward=False) if np.isfinite(lo) else amin
            high = _side(scaled, cols, c, hi, k, lower, upward=True) if np.isfinite(hi) else amax
            sides.append((c, low, high, amin, amax))
        else:
            if np.isfinite(hi):
                c = (dn if relax else up).astype(np.int64)
                amin, amax = _range(c, cols, lower, upper)
                sides.append((c, amin, _side(scaled, cols, c, hi, k, lower, upward=True), amin, amax))
            if np.isfinite(lo):
                c = (up if relax else dn).astype(np.int64)
                amin, amax = _range(c, cols, lower, upper)
                sides.append((c, _side(scaled, cols, c, lo, k, lower, upward=False), amax, amin, amax))
        for c, low, high, amin, amax in sides:
            low, high = max(low, amin), min(high, amax)
            if low > high:
                trivially_infeasible = True
                continue
            if low == amin and high == amax:
                continue  # redundant over the variables' box
            nz = c != 0
            ct = proto.constraints.add().linear
            ct.vars.extend(cols[nz].tolist())
            ct.coeffs.extend(c[nz].tolist())
            ct.domain.extend([low, high])

    cost = np.asarray(m.cost, dtype=np.float64)
    span = np.maximum(np.abs(lower), np.abs(upper)).astype(np.float64)
    if np.all(cost == np.round(cost)):
        k = 0
    else:
        k = OBJ_BITS - math.frexp(float(np.abs(cost).max()))[1]
        while k > -1000 and float(np.abs(np.rint(np.ldexp(cost, k))) @ span) > ACTIVITY_LIMIT / 4:
            k -= 1
    q = np.rint(np.ldexp(cost, k))
    obj_scale = math.ldexp(1.0, k)
    d = cost - q / obj_scale
    correction = float(np.minimum(d * lower, d * upper).sum())
    nz = np.flatnonzero(q)
    proto.objective.vars.extend(nz.tolist())
    proto.objective.coeffs.extend(q[nz].astype(np.int64).tolist())
    proto.objective.offset = math.ldexp(float(m.offset), k)
    return ScaledModel(model=model, exact=exact, obj_scale=obj_scale, obj_correction=correction,
                       obj_exact=bool(np.all(d == 0.0)), lower=lower, upper=upper,
                       trivially_infeasible=trivially_infeasible)


def solve(m: SparseMILP, *, time_limit: float = 60.0, mip_gap: float = 1e-4, warm_start: np.ndarray | None = None,
          threads: int | None = None, solutions: int | None = None) -> SolveResult:
    """`solutions`: 1 stops at the first schedule; CP-SAT has no limit on a larger count, so that is ignored."""
    from ortools.sat.python import cp_model

    def result(status, values=None, objective=None, bound=None, gap=None, seconds=0.0):
        return SolveResult(solver="cpsat", status=status, values=values, objective=objective, bound=bound, gap=gap,
                           seconds=seconds, variables=m.n_vars, constraints=m.n_rows, binaries=sum(m.integer))

    sm = scale(m)
    t0 = time.perf_counter()
    if sm.trivially_infeasible:
        return result(_infeasible(m, sm, time_limit, threads), seconds=time.perf_counter() - t0)
    proto = sm.model.proto
    if warm_start is not None:
        hint = np.clip(np.rint(np.asarray(warm_start, dtype=np.float64)), sm.lower, sm.upper).astype(np.int64)
        proto.solution_hint.vars.extend(range(m.n_vars))
        proto.solution_hint.values.extend(hint.tolist())
    solver = _solver(time_limit, threads)
    if solutions == 1:
        solver.parameters.stop_after_first_solution = True
    # Leave room for the objective's rounding error in the gap that is reported against `mip_gap`.
    solver.parameters.relative_gap_limit = float(mip_gap) if sm.obj_exact else float(mip_gap) / 2
    done, code = interrupt.run(lambda: solver.solve(sm.model), solver.stop_search)  # Ctrl-C: StopSearch
    if not done:
        return result("interrupted", seconds=time.perf_counter() - t0)
    if code == cp_model.INFEASIBLE:
        left = time_limit - (time.perf_counter() - t0)
        return result(_infeasible(m, sm, left, threads), seconds=time.perf_counter() - t0)
    seconds = time.perf_counter() - t0
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return result("interrupted" if stopped() else "time_limit" if code == cp_model.UNKNOWN else "error",
                      seconds=seconds)
    values = np.asarray(solver.response_proto.solution, dtype=np.float64)[: m.n_vars]
    objective = m.objective(values)
    mapped = None  # a valid lower bound of the float model, if one is known
    if sm.exact:
        mapped = _mapped(sm, solver.best_objective_bound)
    elif code == cp_model.OPTIMAL and _boxed(m):
        mapped = _relaxed_bound(m, values, time_limit - (time.perf_counter() - t0), threads, mip_gap)
    seconds = time.perf_counter() - t0
    bound = gap = None
    if mapped is not None:
        bound = min(objective, mapped)
        gap = max(0.0, (objective - bound) / max(abs(objective), 1e-12))
    optimal = code == cp_model.OPTIMAL and gap is not None and gap <= mip_gap
    return result("optimal" if optimal else "interrupted" if stopped() else "time_limit", values, objective, bound,
                  gap, seconds)


def _mapped(sm: ScaledModel, scaled_bound: float) -> float | None:
    """A bound of the scaled model as a bound of the float model (valid if the rows were kept exactly or
    rounded outward): undo the scale, then allow for the objective's rounding over the variables' box."""
    return scaled_bound / sm.obj_scale + sm.obj_correction if np.isfinite(scaled_bound) else None


def _boxed(m: SparseMILP) -> bool:
    """Every variable has finite bounds (else the scaled model boxes it and is no relaxation)."""
    return bool(np.isfinite(m.lower).all() and np.isfinite(m.upper).all())


def _relaxed_bound(m: SparseMILP, incumbent: np.ndarray, time_limit: float, threads: int | None,
                   mip_gap: float) -> float | None:
    """Bound of the outward-rounded relaxation, solved with what is left of the time, hinted with the
    tightened model's optimum (feasible for it). None if time is up or CP-SAT gives no finite bound."""
    from ortools.sat.python import cp_model

    if time_limit <= 0 or stopped():
        return None
    relaxed = scale(m, relax=True)
    proto = relaxed.model.proto
    proto.solution_hint.vars.extend(range(m.n_vars))
    proto.solution_hint.values.extend(np.rint(incumbent).astype(np.int64).tolist())
    solver = _solver(time_limit, threads)
    solver.parameters.relative_gap_limit = float(mip_gap) / 2
    if solver.solve(relaxed.model) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    return _mapped(relaxed, solver.best_objective_bound)


def _solver(time_limit: float, threads: int | None):
    from ortools.sat.python import cp_model

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(float(time_limit), 0.0)
    solver.parameters.num_workers = int(threads) if threads else 2
    solver.parameters.catch_sigint_signal = False  # Ctrl-C is edgetrain's (interrupt.py): StopSearch ends a solve
    solver.parameters.log_search_progress = False
    return solver


def _infeasible(m: SparseMILP, sm: ScaledModel, time_limit: float, threads: int | None) -> str:
    """Status after the tightened model proved infeasible: "infeasible" if that is a proof for the float model
    (the model was exact, or the outward-rounded relaxation is infeasible too), else "error"."""
    from ortools.sat.python import cp_model

    if sm.exact:
        return "infeasible"
    if stopped():
        return "interrupted"
    if not _boxed(m) or time_limit <= 0:
        return "error"  # boxed unbounded variables: the relaxation would not be one
    relaxed = scale(m, relax=True)
    if relaxed.trivially_infeasible:
        return "infeasible"
    relaxed.model.proto.clear_objective()  # a feasibility question: stop at the first solution
    return "infeasible" if _solver(time_limit, threads).solve(relaxed.model) == cp_model.INFEASIBLE else "error"
