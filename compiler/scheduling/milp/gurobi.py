"""Gurobi adapter (gurobipy, matrix API): used when asked for, or by `registry` when a full license exists.

The gurobipy wheel from the package index carries a size-limited license: at most 2000 variables and 2000
linear constraints, above which `optimize()` raises GurobiError 10010 ("Model too large for size-limited
license"). `gurobi_available()` says whether gurobipy imports and has a usable license at all,
`license_limited()` whether that license is the size-limited one (probed once by optimizing an empty model
just over the variable limit), and `fits_limited(m)` whether a model is within its limits.

The objective is scaled by a power of two before Gurobi sees it (see `model.objective_scale`).
gurobipy imports lazily, so this module loads without it. `solve` lets GurobiError propagate (10010
included); `registry.solve_with` turns 10010 into a HiGHS fallback with a notice.
"""
from __future__ import annotations

import functools
import importlib
import os
import time

import numpy as np

from .. import interrupt
from ..clock import stop
from .model import SolveResult, SparseMILP
from .quiet import quiet_stdout
from .model import objective_scale
from .scipy_milp import matrix

LIMITED_VARIABLES = 2000
LIMITED_CONSTRAINTS = 2000
TOO_LARGE = 10010  # GurobiError.errno: "Model too large for size-limited license"


def _env():
    """One quiet environment per process (creating it checks the license; OutputFlag=0 hides the banner).

    Keyed by process id: a worker forked from a process that already holds an environment makes its own."""
    return _env_of(os.getpid())


@functools.lru_cache(maxsize=None)
def _env_of(pid: int):
    import gurobipy as gp

    env = gp.Env(empty=True)
    env.setParam("OutputFlag", 0)
    env.start()
    return env


@functools.lru_cache(maxsize=1)
def gurobi_available() -> tuple[bool, str]:
    """(True, version and license) if gurobipy imports and a license is usable; else (False, why)."""
    try:
        import gurobipy as gp
    except ImportError as e:
        return False, f"solver 'gurobi' needs the Python package gurobipy ({e}): pip install gurobipy"
    try:
        importlib.import_module("scipy.sparse")  # the matrix API takes a scipy.sparse matrix
    except ImportError as e:
        return False, f"solver 'gurobi' also needs the Python package scipy ({e}): pip install scipy"
    version = ".".join(map(str, gp.gurobi.version()))
    try:
        _env()
    except gp.GurobiError as e:
        return False, f"gurobipy {version} has no usable license (GurobiError {e.errno}: {e.message})"
    kind = "size-limited" if license_limited() else "full"
    return True, f"gurobipy {version}, {kind} license"


@functools.lru_cache(maxsize=1)
def license_limited() -> bool:
    """True if the license is the size-limited one: an empty model of LIMITED_VARIABLES + 1 variables
    cannot be optimized (GurobiError 10010). False for a full license; raises if there is no license."""
    import gurobipy as gp

    with gp.Model(env=_env()) as probe:
        probe.addMVar(LIMITED_VARIABLES + 1)
        try:
            probe.optimize()
        except gp.GurobiError as e:
            if e.errno == TOO_LARGE:
                return True
            raise
    return False


def _rows(m: SparseMILP):
    """Gurobi's rows: each finite side of a row becomes one <=, >= or == constraint (a ranged row is two).

    Returns (matrix in CSR form, senses, right-hand sides)."""
    from scipy import sparse

    lo = np.asarray(m.rows_lo, dtype=np.float64)
    hi = np.asarray(m.rows_hi, dtype=np.float64)
    a = matrix(m).tocsr()
    eq = np.isfinite(lo) & np.isfinite(hi) & (lo == hi)
    le = np.isfinite(hi) & ~eq
    ge = np.isfinite(lo) & ~eq
    idx = np.concatenate([np.flatnonzero(eq), np.flatnonzero(le), np.flatnonzero(ge)])
    sense = np.array(["="] * int(eq.sum()) + ["<"] * int(le.sum()) + [">"] * int(ge.sum()), dtype="<U1")
    rhs = np.concatenate([hi[eq], hi[le], lo[ge]])
    return sparse.csr_array(a[idx]), sense, rhs


def constraint_count(m: SparseMILP) -> int:
    """How many linear constraints Gurobi sees for this model (what the license limit counts)."""
    lo = np.asarray(m.rows_lo, dtype=np.float64)
    hi = np.asarray(m.rows_hi, dtype=np.float64)
    eq = np.isfinite(lo) & np.isfinite(hi) & (lo == hi)
    return int(eq.sum() + (np.isfinite(hi) & ~eq).sum() + (np.isfinite(lo) & ~eq).sum())


def fits_limited(m: SparseMILP) -> bool:
    """Whether the model is within the size-limited license's 2000 variables and 2000 constraints."""
    return m.n_vars <= LIMITED_VARIABLES and constraint_count(m) <= LIMITED_CONSTRAINTS


def solve(m: SparseMILP, *, time_limit: float = 60.0, mip_gap: float = 1e-4, warm_start: np.ndarray | None = None,
          threads: int | None = None, solutions: int | None = None) -> SolveResult:
    """`solutions`: stop after that many schedules (Gurobi's SolutionLimit)."""
    import gurobipy as gp
    from gurobipy import GRB

    lower = np.asarray(m.lower, dtype=np.float64)
    upper = np.asarray(m.upper, dtype=np.float64)
    cost = np.asarray(m.cost, dtype=np.float64)
    scale = objective_scale(cost)
    integer = np.asarray(m.integer, dtype=bool)
    binary = integer & (lower >= 0) & (upper <= 1)
    vtype = np.where(binary, GRB.BINARY, np.where(integer, GRB.INTEGER, GRB.CONTINUOUS))
    with gp.Model(env=_env()) as g:
        g.Params.TimeLimit = float(time_limit)
        g.Params.MIPGap = float(mip_gap)
        if threads:
            g.Params.Threads = int(threads)
        if solutions:
            g.Params.SolutionLimit = int(solutions)
        x = g.addMVar(m.n_vars, lb=np.where(np.isfinite(lower), lower, -GRB.INFINITY),
                      ub=np.where(np.isfinite(upper), upper, GRB.INFINITY), obj=cost * scale,
                      vtype=vtype)
        g.ModelSense = GRB.MINIMIZE
        g.ObjCon = float(m.offset) * scale
        a, sense, rhs = _rows(m)
        if len(rhs):
            g.addMConstr(a, x, sense, rhs)
        if warm_start is not None:
            x.Start = np.asarray(warm_start, dtype=np.float64)
        t0 = time.perf_counter()
        # Ctrl-C: terminate() ends it within a moment, so it is waited for (the model must outlive the solve).
        # GurobiError 10010 propagates: the registry falls back to HiGHS.
        with quiet_stdout():  # Gurobi catches Ctrl-C itself while it optimizes, and says so on stdout
            interrupt.run(g.optimize, g.terminate, grace=None)
        seconds = time.perf_counter() - t0
        code = g.Status
        values = np.asarray(x.X, dtype=np.float64) if g.SolCount > 0 else None
        objective = m.objective(values) if values is not None else None
        bound = None
        if code in (GRB.OPTIMAL, GRB.TIME_LIMIT, GRB.INTERRUPTED, GRB.NODE_LIMIT, GRB.SOLUTION_LIMIT,
                    GRB.ITERATION_LIMIT, GRB.WORK_LIMIT):
            with_bound = g.ObjBound if g.IsMIP else g.ObjVal
            bound = float(with_bound) / scale if np.isfinite(with_bound) else None
    if code == GRB.OPTIMAL:
        status = "optimal"
    elif code == GRB.INFEASIBLE or (code == GRB.INF_OR_UNBD and np.isfinite(lower).all() and np.isfinite(upper).all()):
        status = "infeasible"  # with every variable bounded the model cannot be unbounded
    elif code == GRB.INTERRUPTED:
        stop()  # Ctrl-C, which Gurobi catches itself while it optimizes: the compile's other solves stop too
        status = "interrupted"
    elif code in (GRB.TIME_LIMIT, GRB.INTERRUPTED, GRB.NODE_LIMIT, GRB.SOLUTION_LIMIT, GRB.ITERATION_LIMIT,
                  GRB.WORK_LIMIT):
        status = "time_limit"
    else:
        status = "error"
    gap = None
    if objective is not None and bound is not None:
        gap = max(0.0, (objective - bound) / max(abs(objective), 1e-12))
    return SolveResult(solver="gurobi", status=status, values=values, objective=objective, bound=bound, gap=gap,
                       seconds=seconds, variables=m.n_vars, constraints=m.n_rows, binaries=int(integer.sum()))
