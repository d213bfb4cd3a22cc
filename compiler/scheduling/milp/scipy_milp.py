"""`scipy.optimize.milp` adapter (HiGHS inside, BSD licensed).

Same signature as `highs.solve`; the objective is scaled by a power of two first (`objective_scale`).
Three options that scipy does not expose and are therefore ignored:
`warm_start` (scipy's `milp` takes no initial solution), `threads` (scipy sets no thread count) and `solutions`
(no solution limit: it stops at the time limit or the gap).
scipy imports lazily, so the module loads without it; `solve` raises ImportError if it is missing.
"""
from __future__ import annotations

import time

import numpy as np

from .. import interrupt
from .model import SolveResult, SparseMILP, objective_scale


def matrix(m: SparseMILP):
    """The constraint matrix as a scipy.sparse CSC array (rows x variables), duplicates summed."""
    from scipy import sparse

    start, index, value = m.csc()
    a = sparse.csc_array((value, index, start), shape=(m.n_rows, m.n_vars))
    a.sum_duplicates()
    return a


def solve(m: SparseMILP, *, time_limit: float = 60.0, mip_gap: float = 1e-4, warm_start: np.ndarray | None = None,
          threads: int | None = None, solutions: int | None = None) -> SolveResult:
    """Solve with scipy.optimize.milp. `warm_start`, `threads` and `solutions` are accepted and ignored (see module
    doc)."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    del warm_start, threads, solutions  # not supported by scipy.optimize.milp
    constraints = None
    if m.n_rows:
        constraints = LinearConstraint(matrix(m), np.asarray(m.rows_lo, dtype=np.float64),
                                       np.asarray(m.rows_hi, dtype=np.float64))
    cost = np.asarray(m.cost, dtype=np.float64)
    scale = objective_scale(cost)
    t0 = time.perf_counter()
    # scipy's milp cannot be asked to stop: on Ctrl-C it is left to run out its time limit, its schedule lost.
    done, res = interrupt.run(lambda: milp(
        cost * scale, integrality=np.asarray(m.integer, dtype=np.uint8),
        bounds=Bounds(np.asarray(m.lower, dtype=np.float64), np.asarray(m.upper, dtype=np.float64)),
        constraints=constraints, options={"disp": False, "time_limit": float(time_limit), "mip_rel_gap": float(mip_gap)}),
        None)
    seconds = time.perf_counter() - t0
    if not done:
        return SolveResult(solver="scipy", status="interrupted", values=None, objective=None, bound=None, gap=None,
                           seconds=seconds, variables=m.n_vars, constraints=m.n_rows, binaries=sum(m.integer))
    # scipy: 0 optimal, 1 iteration or time limit, 2 infeasible, 3 unbounded, 4 other.
    status = {0: "optimal", 1: "time_limit", 2: "infeasible"}.get(res.status, "error")
    values = np.asarray(res.x, dtype=np.float64) if getattr(res, "x", None) is not None else None
    objective = m.objective(values) if values is not None else None
    dual = getattr(res, "mip_dual_bound", None)
    bound = float(dual) / scale + m.offset if dual is not None and np.isfinite(dual) else None
    gap = None
    if objective is not None and bound is not None:
        gap = max(0.0, (objective - bound) / max(abs(objective), 1e-12))
    return SolveResult(solver="scipy", status=status, values=values, objective=objective, bound=bound, gap=gap,
                       seconds=seconds, variables=m.n_vars, constraints=m.n_rows, binaries=sum(m.integer))
