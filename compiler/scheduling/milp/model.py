"""A solver-neutral sparse MILP: variables with bounds, costs and integrality; rows lo <= a.x <= hi."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
import math

import numpy as np


def objective_scale(cost: np.ndarray) -> float:
    """A power of two (so exact) that brings the largest |cost| into [1, 2).

    POET's costs are energies from ~1e-6 J to a few J. Unscaled, a solver's optimality tolerances (HiGHS's
    dual feasibility 1e-7 and absolute MIP gap 1e-6, Gurobi's OptimalityTol 1e-6) are as large as the
    smallest costs: scipy's HiGHS and Gurobi each stopped at schedules a few microjoules above the optimum
    (small_cnn and vgg11 at tight budgets) and reported that value as their bound.
    Scaled, the smallest costs are far above the tolerances; objective and bound are mapped back exactly."""
    top = float(np.abs(cost).max()) if len(cost) else 0.0
    if top == 0.0 or not np.isfinite(top):
        return 1.0
    # [1, 2) rather than larger: HiGHS's primal heuristics are tuned for objective coefficients of order one
    # (docs/solver.md compares scales).
    return math.ldexp(1.0, 1 - math.frexp(top)[1])



def merge_terms(terms: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """A row's terms with a variable named twice made one entry (solvers reject duplicates) and zeros dropped."""
    merged: dict[int, float] = {}
    for c, v in terms:
        merged[c] = merged.get(c, 0.0) + float(v)
    return [(c, v) for c, v in merged.items() if v != 0.0]


@dataclass
class SolveResult:
    solver: str
    status: str  # optimal | time_limit | feasible (a solution, optimality not proven) | infeasible | error
    #              | interrupted (Ctrl-C: scheduling/interrupt.py; `values` the best schedule found, if any)
    values: np.ndarray | None  # the incumbent, if any
    objective: float | None
    bound: float | None
    gap: float | None  # relative, (objective - bound) / |objective|
    seconds: float
    variables: int
    constraints: int
    binaries: int

    def to_json(self) -> dict:
        return {"name": self.solver, "status": self.status, "objective": self.objective, "bound": self.bound,
                "gap": self.gap, "seconds": round(self.seconds, 4), "variables": self.variables,
                "constraints": self.constraints, "binaries": self.binaries}


@dataclass
class SparseMILP:
    cost: list[float] = field(default_factory=list)
    lower: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)
    integer: list[bool] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    rows_lo: list[float] = field(default_factory=list)
    rows_hi: list[float] = field(default_factory=list)
    _ri: list[int] = field(default_factory=list)  # triplets: row, column, value
    _ci: list[int] = field(default_factory=list)
    _v: list[float] = field(default_factory=list)
    offset: float = 0.0

    @property
    def n_vars(self) -> int:
        return len(self.cost)

    @property
    def n_rows(self) -> int:
        return len(self.rows_lo)

    def add_var(self, name: str, cost: float = 0.0, lb: float = 0.0, ub: float = 1.0, integer: bool = True) -> int:
        self.cost.append(float(cost))
        self.lower.append(lb)
        self.upper.append(ub)
        self.integer.append(integer)
        self.names.append(name)
        return len(self.cost) - 1

    def add_row(self, terms: list[tuple[int, float]], lo: float = -math.inf, hi: float = math.inf) -> int:
        r = len(self.rows_lo)
        for c, v in merge_terms(terms):
            self._ri.append(r)
            self._ci.append(c)
            self._v.append(v)
        self.rows_lo.append(lo)
        self.rows_hi.append(hi)
        return r

    def with_rows(self, rows: list[list[tuple[int, float]]], lo: float = -math.inf,
                  hi: float = math.inf) -> "SparseMILP":
        """A copy with `rows` added (each lo <= terms <= hi); this model is left as it is."""
        out = replace(self, rows_lo=list(self.rows_lo), rows_hi=list(self.rows_hi), _ri=list(self._ri),
                      _ci=list(self._ci), _v=list(self._v))
        for terms in rows:
            out.add_row(terms, lo=lo, hi=hi)
        return out

    def csc(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Column-wise sparse matrix: (start, index, value)."""
        cols = np.asarray(self._ci, dtype=np.int64)
        order = np.argsort(cols, kind="stable")
        index = np.asarray(self._ri, dtype=np.int32)[order]
        value = np.asarray(self._v, dtype=np.float64)[order]
        counts = np.bincount(cols, minlength=self.n_vars)
        start = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        return start, index, value

    def row_activity(self, x: np.ndarray) -> np.ndarray:
        act = np.zeros(self.n_rows)
        np.add.at(act, np.asarray(self._ri, dtype=np.int64), np.asarray(self._v) * x[np.asarray(self._ci, dtype=np.int64)])
        return act

    def is_feasible(self, x: np.ndarray, tol: float = 1e-6) -> bool:
        act = self.row_activity(x)
        lo, hi = np.asarray(self.rows_lo), np.asarray(self.rows_hi)
        with np.errstate(invalid="ignore"):  # an infinite side: tol * inf is inf, never NaN below
            ok_lo = np.isneginf(lo) | (act >= lo - tol * (1 + np.abs(lo)))
            ok_hi = np.isposinf(hi) | (act <= hi + tol * (1 + np.abs(hi)))
        return bool(np.all(ok_lo) and np.all(ok_hi))

    def objective(self, x: np.ndarray) -> float:
        return float(np.dot(self.cost, x)) + self.offset
