"""The solver backends by name, the policy that picks one, and the interface every solve goes through.

    res = solve_with("auto", m, time_limit=60, mip_gap=1e-4, warm_start=x0, threads=None)
    res.solver     # the backend that ran: highs | gurobi | scipy | cpsat
    res.requested  # what was asked for: auto | highs | gurobi | scipy | cpsat
    res.notice     # one line when the request was not honoured as asked (a fallback), else None

    solver = Solver("gurobi")            # what a compile asked for, handed to every sub-solve
    solver.solve(m, time_limit=5)        # solve_with under the same name, its notice kept
    lp = solver.lp(m); lp.solve(2.0)     # an LP relaxation rows can be added to (cutting planes, rounding)
    solver.notices                       # each fallback's notice, once

Policy:
- "highs" (the default backend), "scipy", "cpsat": that backend; a missing package raises SolverUnavailable
  naming the pip package.
- "gurobi": Gurobi. With the size-limited license that the gurobipy wheel ships, a model over its limits
  (2000 variables, 2000 constraints) is solved by HiGHS instead and `notice` says why; so is a model that
  Gurobi itself rejects as too large (GurobiError 10010). gurobipy missing, or no usable license:
  SolverUnavailable.
- "auto": Gurobi when gurobipy has a full (unrestricted) license, else HiGHS, without a notice.
Ctrl-C during a compile (scheduling/interrupt.py) ends the running solve with status "interrupted" and its best
schedule, if any; after it no solve starts (each returns "interrupted" at once).
The same policy holds for every solve of a compile, the sub-solves of the phased solve included (the search's
sub-MIPs, the rounding's repairs, the cut rounds' LPs): each is routed by its own size. An LP goes to a backend
that takes continuous variables; CP-SAT does not, so a compile with cpsat solves its LPs with HiGHS and says so.

Adding a backend: an adapter module here with `solve(m, *, time_limit, mip_gap, warm_start, threads, solutions)`
returning a SolveResult, and its Backend entry in SOLVERS; `--solver` takes it from there.
"""
from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, fields, replace

import numpy as np

from edgetrain.compiler.errors import EdgetrainError
from . import cpsat, gurobi, highs, scipy_milp
from .model import SolveResult, SparseMILP
from ..clock import clamp, stopped


@dataclass(frozen=True)
class Backend:
    """One solver package behind the interface."""
    name: str
    package: str  # what `pip install` takes
    module: str  # what must import for it to run
    solve: Callable[..., SolveResult]  # solve(m, *, time_limit, mip_gap, warm_start, threads, solutions)
    # An LP relaxation kept in the solver, rows added and re-solved (HiGHS's); None: each LP solved anew by `solve`.
    lp_session: Callable | None = None
    continuous: bool = True  # takes continuous variables, so solves LPs (CP-SAT takes integers only)


SOLVERS: dict[str, Backend] = {b.name: b for b in (
    Backend("highs", "highspy", "highspy", highs.solve, lp_session=highs.LpSession),
    Backend("gurobi", "gurobipy", "gurobipy", gurobi.solve),
    Backend("scipy", "scipy", "scipy.optimize", scipy_milp.solve),
    Backend("cpsat", "ortools", "ortools.sat.python.cp_model", cpsat.solve, continuous=False),
)}
CHOICES = ("auto", *SOLVERS)  # what `--solver` accepts


class SolverUnavailable(EdgetrainError):
    """The requested solver's package is not installed, or (Gurobi) has no usable license."""


@dataclass
class RoutedResult(SolveResult):
    """A SolveResult that also says what was asked for and, after a fallback, why it was not honoured."""
    requested: str = "auto"
    notice: str | None = None
    cuts: dict | None = None  # window and memory cuts of a phased solve (phased.solve_phased), if any were tried

    def to_json(self) -> dict:
        out = super().to_json()
        out["requested"] = self.requested
        if self.notice:
            out["notice"] = self.notice
        if self.cuts is not None:
            out["cuts"] = self.cuts
        return out


def available(name: str) -> tuple[bool, str]:
    """Whether a backend can run here, and if not, why (naming the pip package to install)."""
    if name not in SOLVERS:
        raise ValueError(f"unknown solver {name!r}; choose one of {', '.join(CHOICES)}")
    if name == "gurobi":
        return gurobi.gurobi_available()
    b = SOLVERS[name]
    try:
        found = importlib.util.find_spec(b.module) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        return False, f"solver {name!r} needs the Python package {b.package}: pip install {b.package}"
    return True, b.package


def _too_large(m: SparseMILP, error: str | None = None) -> str:
    said = f" (Gurobi: {error})" if error else ""
    return (f"gurobi: this model has {m.n_vars} variables and {gurobi.constraint_count(m)} constraints, over the "
            f"{gurobi.LIMITED_VARIABLES}/{gurobi.LIMITED_CONSTRAINTS} of the size-limited license that pip "
            f"installs{said}; solved with HiGHS instead")


def choose(name: str, m: SparseMILP) -> tuple[str, str | None]:
    """The backend that `solve_with(name, m)` runs, and the notice if it is not the one asked for."""
    if name == "auto":
        ok, _ = gurobi.gurobi_available()
        return ("gurobi" if ok and not gurobi.license_limited() else "highs"), None
    ok, why = available(name)
    if not ok:
        raise SolverUnavailable(why)
    if name == "gurobi" and gurobi.license_limited() and not gurobi.fits_limited(m):
        return "highs", _too_large(m)
    return name, None


def _routed(res: SolveResult, requested: str, notice: str | None) -> RoutedResult:
    return RoutedResult(**{f.name: getattr(res, f.name) for f in fields(SolveResult)}, requested=requested,
                        notice=notice)


def solve_with(name: str, m: SparseMILP, *, time_limit: float = 60.0, mip_gap: float = 1e-4,
               warm_start: np.ndarray | None = None, threads: int | None = None,
               solutions: int | None = None) -> RoutedResult:
    """Solve `m` with the backend `name` (or "auto") under the policy above. `solutions`: stop after that many
    improving schedules (HiGHS, Gurobi; the others stop at the time limit or the gap)."""
    backend, notice = choose(name, m)
    if stopped():  # Ctrl-C (scheduling/interrupt.py): no solve starts after it
        return _routed(SolveResult(solver=backend, status="interrupted", values=None, objective=None, bound=None,
                                   gap=None, seconds=0.0, variables=m.n_vars, constraints=m.n_rows,
                                   binaries=sum(m.integer)), name, notice)
    kw = dict(time_limit=clamp(time_limit), mip_gap=mip_gap, warm_start=warm_start, threads=threads,  # clock.py
              solutions=solutions)
    if backend == "gurobi":
        import gurobipy as gp

        try:
            res = SOLVERS["gurobi"].solve(m, **kw)
        except gp.GurobiError as e:
            if e.errno != gurobi.TOO_LARGE:
                raise
            backend, notice = "highs", _too_large(m, f"GurobiError {e.errno}, {e.message.split(';')[0]}")
    if backend != "gurobi":
        res = SOLVERS[backend].solve(m, **kw)
    return _routed(res, name, notice)


class Solver:
    """The solver a compile asked for (one of CHOICES), handed to every solve of it: the main solves and the
    sub-solves. Each goes through `solve_with`'s policy, routed by its own model; the notices of the fallbacks
    are kept, once each, for the compile's report."""

    def __init__(self, name: str = "auto") -> None:
        if name != "auto" and name not in SOLVERS:
            raise ValueError(f"unknown solver {name!r}; choose one of auto, {', '.join(SOLVERS)}")
        self.name = name
        self.notices: list[str] = []

    @staticmethod
    def of(solver: "Solver | str") -> "Solver":
        return solver if isinstance(solver, Solver) else Solver(solver)

    def note(self, notice: str | None) -> None:
        if notice and notice not in self.notices:
            self.notices.append(notice)

    def solve(self, m: SparseMILP, **kw) -> RoutedResult:
        """`solve_with(self.name, m, **kw)`, its notice kept."""
        res = solve_with(self.name, m, **kw)
        self.note(res.notice)
        return res

    def lp(self, m: SparseMILP, threads: int | None = None):
        """The LP relaxation of `m` as a session: `solve(time_limit)` -> (objective, values) of its optimum or None
        when not reached in time; `add_rows(rows, hi)` adds rows `terms <= hi`. Routed as `solve_with` routes `m`."""
        backend, notice = choose(self.name, m)
        if not SOLVERS[backend].continuous:
            backend, notice = "highs", (f"{backend} takes integer variables only: the LP relaxations were solved "
                                        "with HiGHS")
        self.note(notice)
        if SOLVERS[backend].lp_session is not None:
            return SOLVERS[backend].lp_session(m, threads=threads)
        return _ResolvedLp(self, m, threads)


class _ResolvedLp:
    """An LP relaxation solved anew by the solver's `solve` after each set of added rows (the backends without an
    incremental LP), so each solve is routed by the model's size then (rows added can pass a license's limit)."""

    def __init__(self, solver: Solver, m: SparseMILP, threads: int | None) -> None:
        self.solver, self.threads = solver, threads
        self.m = replace(m, integer=[False] * m.n_vars)

    def solve(self, time_limit: float) -> tuple[float, np.ndarray] | None:
        r = self.solver.solve(self.m, time_limit=max(float(time_limit), 0.01), threads=self.threads)
        if r.status != "optimal" or r.values is None:
            return None
        return r.objective, r.values

    def add_rows(self, rows: list[list[tuple[int, float]]], hi: float = 0.0) -> None:
        self.m = self.m.with_rows(rows, hi=hi)
