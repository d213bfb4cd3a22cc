"""The solver backends by name, and the policy that picks one.

    res = solve_with("auto", m, time_limit=60, mip_gap=1e-4, warm_start=x0, threads=None)
    res.solver     # the backend that ran: highs | gurobi | scipy | cpsat
    res.requested  # what was asked for: auto | highs | gurobi | scipy | cpsat
    res.notice     # one line when the request was not honoured as asked (a fallback), else None

Policy:
- "highs" (the default backend), "scipy", "cpsat": that backend; a missing package raises SolverUnavailable
  naming the pip package.
- "gurobi": Gurobi. With the size-limited license that the gurobipy wheel ships, a model over its limits
  (2000 variables, 2000 constraints) is solved by HiGHS instead and `notice` says why; so is a model that
  Gurobi itself rejects as too large (GurobiError 10010). gurobipy missing, or no usable license:
  SolverUnavailable.
- "auto": Gurobi when gurobipy has a full (unrestricted) license, else HiGHS, without a notice.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass, fields

import numpy as np

from edgetrain.compiler.errors import EdgetrainError
from . import cpsat, gurobi, highs, scipy_milp
from .model import SolveResult, SparseMILP
from ..clock import clamp

SOLVERS = {"highs": highs.solve, "gurobi": gurobi.solve, "scipy": scipy_milp.solve, "cpsat": cpsat.solve}
PACKAGES = {"highs": "highspy", "gurobi": "gurobipy", "scipy": "scipy", "cpsat": "ortools"}
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
    package = PACKAGES[name]
    module = {"highspy": "highspy", "scipy": "scipy.optimize", "ortools": "ortools.sat.python.cp_model"}[package]
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        return False, f"solver {name!r} needs the Python package {package}: pip install {package}"
    return True, package


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
               warm_start: np.ndarray | None = None, threads: int | None = None) -> RoutedResult:
    """Solve `m` with the backend `name` (or "auto") under the policy above."""
    backend, notice = choose(name, m)
    kw = dict(time_limit=clamp(time_limit), mip_gap=mip_gap, warm_start=warm_start, threads=threads)  # within --time-limit
    if backend == "gurobi":
        import gurobipy as gp

        try:
            res = gurobi.solve(m, **kw)
        except gp.GurobiError as e:
            if e.errno != gurobi.TOO_LARGE:
                raise
            backend, notice = "highs", _too_large(m, f"GurobiError {e.errno}, {e.message.split(';')[0]}")
    if backend != "gurobi":
        res = SOLVERS[backend](m, **kw)
    return _routed(res, name, notice)
