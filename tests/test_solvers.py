"""Every installed solver backend agrees with HiGHS; the registry's Gurobi policy, fallback included.

Real POET models from the zoo (small_cnn: 515 variables, vgg11: 1763, both within the size-limited Gurobi
license; vgg16: 3623, over it) at tight budgets, plus hand-made MILPs with known answers. A backend's tests
skip only when its package does not import (Gurobi's also when no license is usable), and say why.
"""
from __future__ import annotations

import math
import sys
from dataclasses import replace

import numpy as np
import pytest

from edgetrain.compiler.scheduling.budget import anchors, parse_budget
from edgetrain.compiler.pipeline import CompileOptions, build_graph
from edgetrain.compiler.scheduling.steps import build_steps
from edgetrain.compiler.graph.liveness import analyze
from edgetrain.compiler.scheduling.milp import cpsat, gurobi, highs, registry, scipy_milp
from edgetrain.compiler.scheduling.milp.model import SparseMILP
from edgetrain.compiler.scheduling.poet import build as build_poet
from edgetrain.compiler.scheduling.budget import min_budget
from edgetrain.compiler.scheduling.heuristics import store_all
from edgetrain.compiler.scheduling.validator import validate
from edgetrain.targets import load_target

TARGET = load_target("rpi4")
GAP = 1e-9  # solve the agreement instances to (near) proven optimality
AGREE = 1e-6  # relative agreement of optimum objectives


def _skip_unless(name: str) -> None:
    ok, why = registry.available(name)
    if not ok:
        pytest.skip(why)


def _gurobi_limited() -> None:
    _skip_unless("gurobi")
    if not gurobi.license_limited():
        pytest.skip("a full Gurobi license is present: the size-limited fallback does not apply")


BACKENDS = {
    "scipy": lambda: pytest.importorskip("scipy.optimize", reason="pip install scipy"),
    "gurobi": lambda: _skip_unless("gurobi"),
    "cpsat": lambda: pytest.importorskip("ortools.sat.python.cp_model", reason="pip install ortools"),
}


# ---- instances -------------------------------------------------------------------------------------------

class Poet:
    """POET models of one zoo graph at budgets between the smallest feasible and store-all's peak."""

    def __init__(self, model: str):
        _, _, self.g = build_graph(CompileOptions(model=model, target="rpi4", budget="100%", out="", batch_size=2),
                                   TARGET)
        self.lv = analyze(self.g)
        self.sa = validate(self.g, build_steps(self.g, self.lv, store_all(self.g, self.lv)), TARGET, None)
        self.min = min_budget(self.lv)

    def model(self, frac: float, deadline: float | None = None, budget: int | None = None):
        if budget is None:
            budget = int(self.min + frac * (self.sa.peak_bytes - self.min))
        return build_poet(self.g, self.lv, TARGET, budget, None if deadline is None else deadline * self.sa.time_s)

    def percent(self, text: str) -> int:
        """A budget as `edgetrain compile --budget 40%` resolves it."""
        return parse_budget(text).resolve(anchors(self.g, self.lv, TARGET))


@pytest.fixture(scope="module")
def small_cnn():
    return Poet("small_cnn")


@pytest.fixture(scope="module")
def vgg11():
    return Poet("vgg11")


# (budget fraction, deadline as a multiple of store-all's time): tight budgets, with and without a deadline.
CASES = [(0.0, None), (0.3, None), (0.6, 1.2)]


@pytest.fixture(scope="module")
def reference(small_cnn):
    """HiGHS optima of the agreement instances (within the size-limited Gurobi license), solved once."""
    out = {}
    for frac, dl in CASES:
        out["small_cnn", frac, dl] = small_cnn.model(frac, dl)
    out["mcu_resnet", 0.0, None] = Poet("mcu_resnet").model(0.0)
    return {k: (pm.milp, highs.solve(pm.milp, time_limit=60, mip_gap=GAP, threads=1)) for k, pm in out.items()}


def knapsack(weights, values, capacity, *, lower=None, upper=None) -> SparseMILP:
    """max values.x s.t. weights.x <= capacity, written as a minimization with an offset."""
    m = SparseMILP()
    for k, v in enumerate(values):
        m.add_var(f"x{k}", cost=-v, lb=0 if lower is None else lower[k], ub=1 if upper is None else upper[k])
    m.add_row(list(enumerate(weights)), hi=capacity)
    m.offset = 100.0
    return m


def classic_knapsack() -> tuple[SparseMILP, float]:
    """A 0/1 knapsack whose optimum is found by enumerating all 128 choices."""
    w, v, cap = [12, 2, 1, 1, 4, 7, 3], [4, 2, 1, 2, 10, 6, 5], 15
    best = max(sum(v[k] for k in range(len(w)) if s >> k & 1) for s in range(1 << len(w))
               if sum(w[k] for k in range(len(w)) if s >> k & 1) <= cap)
    return knapsack(w, v, cap), 100.0 - best


def infeasible_model() -> SparseMILP:
    m = SparseMILP()
    a, b = m.add_var("a", cost=1.0), m.add_var("b", cost=2.0)
    m.add_row([(a, 1.0), (b, 1.0)], lo=3.0)  # two binaries cannot sum to 3
    return m


ADAPTERS = {"highs": highs.solve, "scipy": scipy_milp.solve, "gurobi": gurobi.solve, "cpsat": cpsat.solve}


def _solve(name: str, m: SparseMILP, **kw):
    kw.setdefault("threads", 1 if name != "cpsat" else 2)
    return ADAPTERS[name](m, **kw)


def _close(a: float, b: float, rel: float) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b))


# ---- agreement -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["highs", "scipy", "gurobi", "cpsat"])
def test_known_knapsack_optimum(name):
    if name in BACKENDS:
        BACKENDS[name]()
    m, best = classic_knapsack()
    r = _solve(name, m, time_limit=10, mip_gap=GAP)
    assert r.status == "optimal" and r.solver == name
    assert r.objective == pytest.approx(best, rel=1e-12) and m.is_feasible(r.values)
    assert r.bound == pytest.approx(best, rel=1e-9) and r.gap == pytest.approx(0.0, abs=1e-9)
    assert (r.variables, r.constraints, r.binaries) == (7, 1, 7)


@pytest.mark.parametrize("name", ["highs", "scipy", "gurobi", "cpsat"])
def test_infeasible_is_detected(name):
    if name in BACKENDS:
        BACKENDS[name]()
    r = _solve(name, infeasible_model(), time_limit=10, mip_gap=GAP)
    assert r.status == "infeasible" and r.values is None and r.objective is None


@pytest.mark.parametrize("name", ["scipy", "gurobi"])
def test_exact_backends_agree_with_highs_on_poet(name, reference):
    BACKENDS[name]()
    for key, (m, ref) in reference.items():
        assert ref.status == "optimal", key
        r = _solve(name, m, time_limit=60, mip_gap=GAP)
        assert r.status == "optimal", (key, r.status)
        assert m.is_feasible(r.values), key
        assert _close(r.objective, ref.objective, AGREE), (key, r.objective, ref.objective)
        assert r.bound <= ref.objective * (1 + AGREE), key  # a bound is never above the optimum
        assert (r.variables, r.constraints, r.binaries) == (ref.variables, ref.constraints, ref.binaries)


@pytest.mark.parametrize("name", ["scipy", "gurobi", "cpsat"])
def test_bounds_are_valid_at_the_default_gap(name, small_cnn):
    """`compile small_cnn --budget 40%`: unscaled, scipy's HiGHS stopped 3.5 uJ (1e-5) above the optimum and
    reported that as its bound (so did Gurobi on vgg11); objective scaling fixed both. A bound must never
    exceed the optimum, at the default gap too."""
    BACKENDS[name]()
    m = small_cnn.model(0, budget=small_cnn.percent("85%")).milp
    best = highs.solve(m, time_limit=30, mip_gap=GAP, threads=1)
    r = _solve(name, m, time_limit=30)  # the default mip_gap, 1e-4
    assert best.status == "optimal" and r.values is not None and m.is_feasible(r.values)
    assert r.objective >= best.objective * (1 - 1e-12)
    assert r.bound is not None and r.bound <= best.objective * (1 + 1e-12), (r.bound, best.objective)
    assert _close(r.objective, best.objective, 1e-4)


def test_poet_infeasible_deadline_is_detected(small_cnn):
    """Tight budget and a 5% deadline: no schedule exists; every backend proves it (CP-SAT through its
    outward-rounded relaxation, since the deadline row's coefficients are not integers)."""
    m = small_cnn.model(0.0, 1.05).milp
    for name in ["highs", "scipy", "gurobi", "cpsat"]:
        if name in BACKENDS and not registry.available(name)[0]:
            continue
        assert _solve(name, m, time_limit=20, mip_gap=GAP).status == "infeasible", name


def test_cpsat_incumbents_are_feasible_and_near_optimal(reference):
    BACKENDS["cpsat"]()
    for key, (m, ref) in reference.items():
        if key[0] != "small_cnn":
            continue
        r = cpsat.solve(m, time_limit=10, mip_gap=GAP)
        assert r.values is not None and m.is_feasible(r.values, tol=1e-15), key
        assert r.objective >= ref.objective * (1 - AGREE), key  # never better than the proven optimum
        assert _close(r.objective, ref.objective, 1e-5), (key, r.objective, ref.objective)
        # Without a deadline every row is integral (bytes, 0/1) and kept exactly; the deadline row (seconds)
        # is tightened, and the bound then comes from the outward-rounded relaxation. Either way it is valid.
        assert cpsat.scale(m).exact == (key[2] is None), key
        assert r.status == "optimal" and r.bound <= ref.objective * (1 + AGREE), key


def test_cpsat_never_claims_a_tightened_optimum():
    """0.1 + 0.2 <= 0.1 + 0.2 holds in floats, but conservative rounding of 0.1 and 0.2 excludes taking both:
    CP-SAT's solution is feasible and proven optimal for the tightened model, yet it is reported as
    "time_limit" with the relaxation's (valid) bound below it."""
    BACKENDS["cpsat"]()
    m = knapsack([0.1, 0.2], [1.0, 1.0], 0.1 + 0.2)
    assert highs.solve(m, time_limit=10, mip_gap=GAP).objective == 98.0
    assert not cpsat.scale(m).exact
    r = cpsat.solve(m, time_limit=10, mip_gap=GAP)
    assert r.status == "time_limit" and r.objective == 99.0 and m.is_feasible(r.values, tol=1e-15)
    assert r.bound == pytest.approx(98.0) and r.gap == pytest.approx(1 / 99)


def test_cpsat_rounding_is_conservative():
    """Float coefficients (times in seconds, general integers, negative lower bounds): every CP-SAT solution
    meets the float rows, it is never better than the true optimum (by enumeration), and "infeasible" is
    said only when no point is feasible."""
    BACKENDS["cpsat"]()
    rng = np.random.default_rng(7)
    for trial in range(12):
        n = 7
        m = SparseMILP()
        for k in range(n):
            lo = int(rng.integers(-2, 1))
            m.add_var(f"x{k}", cost=float(rng.uniform(-1e-6, 1e-6)), lb=lo, ub=lo + int(rng.integers(1, 4)))
        for _ in range(4):
            terms = [(k, float(rng.uniform(-1, 1) * 10.0 ** rng.integers(-7, -3))) for k in range(n)]
            act = sum(v * m.lower[k] for k, v in terms) + sum(abs(v) for _, v in terms)
            if rng.random() < 0.5:
                m.add_row(terms, hi=act * 0.7)
            else:
                m.add_row(terms, lo=-abs(act), hi=act)
        grid = np.array(np.meshgrid(*[np.arange(m.lower[k], m.upper[k] + 1) for k in range(n)])).reshape(n, -1).T
        feasible = [x for x in grid.astype(np.float64) if m.is_feasible(x, tol=1e-15)]
        best = min((m.objective(x) for x in feasible), default=None)
        r = cpsat.solve(m, time_limit=10, mip_gap=GAP)
        if r.values is None:
            assert r.status in ("infeasible", "error"), trial
            if r.status == "infeasible":
                assert best is None, trial
            continue
        assert m.is_feasible(r.values, tol=1e-15), trial
        assert r.objective >= best - 1e-12 * abs(best), trial


def test_cpsat_exact_integer_rows_prove_optimal():
    """General integers with nonzero lower bounds, integer coefficients, tiny float costs: exact scaling,
    so CP-SAT proves the optimum (checked by enumeration) and reports a valid bound."""
    BACKENDS["cpsat"]()
    m = knapsack([3, -2, 5, 4], [2.5e-6, 1.5e-6, 4.0e-6, 3.1e-6], 9, lower=[-1, -2, 0, 1], upper=[2, 1, 3, 2])
    grid = np.array(np.meshgrid(*[np.arange(lo, hi + 1) for lo, hi in zip(m.lower, m.upper)])).reshape(4, -1).T
    best = min(m.objective(x) for x in grid.astype(np.float64) if m.is_feasible(x, tol=1e-15))
    r = cpsat.solve(m, time_limit=10, mip_gap=GAP)
    assert r.status == "optimal" and _close(r.objective, best, 1e-15)
    assert best - 1e-12 <= r.bound <= best
    assert np.array_equal(r.values, np.round(r.values)) and m.is_feasible(r.values, tol=1e-15)


def test_warm_start_is_used(reference):
    """Given HiGHS's optimum as a start, Gurobi and CP-SAT return a schedule at least as good within 2 s."""
    m, ref = reference["mcu_resnet", 0.0, None]
    for name in ("gurobi", "cpsat"):
        if not registry.available(name)[0]:
            continue
        r = _solve(name, m, time_limit=2.0, mip_gap=GAP, warm_start=ref.values)
        assert r.values is not None and m.is_feasible(r.values), name
        assert r.objective <= ref.objective * (1 + 1e-12), (name, r.objective, ref.objective)


# ---- time limits -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["highs", "scipy", "gurobi", "cpsat"])
def test_time_limited_run_is_never_optimal(name, vgg11):
    """vgg11 at a tight budget and a 5% deadline takes HiGHS ~20 s and Gurobi ~6 s: 0.1 s stops them."""
    if name in BACKENDS:
        BACKENDS[name]()
    m = vgg11.model(0.3, 1.05).milp
    if name == "gurobi" and gurobi.license_limited() and not gurobi.fits_limited(m):
        pytest.skip("this instance exceeds the size-limited Gurobi license (the registry falls back to HiGHS)")
    r = _solve(name, m, time_limit=0.1, mip_gap=GAP)
    assert r.status == "time_limit", r.status
    assert r.values is None or m.is_feasible(r.values)
    if r.objective is not None and r.bound is not None:
        assert r.gap > GAP


# ---- registry and the Gurobi policy -----------------------------------------------------------------------

def test_registry_names_and_unknown_solver():
    assert set(registry.SOLVERS) == {"highs", "gurobi", "scipy", "cpsat"}
    assert registry.CHOICES[0] == "auto"
    with pytest.raises(ValueError, match="unknown solver 'cplex'"):
        registry.solve_with("cplex", classic_knapsack()[0])


@pytest.mark.parametrize("name", ["highs", "scipy", "cpsat"])
def test_solve_with_runs_the_named_backend(name):
    if name in BACKENDS:
        BACKENDS[name]()
    m, best = classic_knapsack()
    r = registry.solve_with(name, m, time_limit=10, mip_gap=GAP)
    assert (r.solver, r.requested, r.notice, r.status) == (name, name, None, "optimal")
    assert r.objective == pytest.approx(best)
    assert r.to_json()["requested"] == name and "notice" not in r.to_json()


@pytest.mark.parametrize("name,package,module", [("scipy", "scipy", "scipy.optimize"),
                                                 ("cpsat", "ortools", "ortools.sat.python.cp_model")])
def test_missing_package_names_it(monkeypatch, name, package, module):
    monkeypatch.setitem(sys.modules, module, None)  # import of it now fails, as if not installed
    ok, why = registry.available(name)
    assert not ok and f"pip install {package}" in why
    with pytest.raises(registry.SolverUnavailable, match=f"pip install {package}"):
        registry.solve_with(name, classic_knapsack()[0])


def test_missing_gurobipy_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "gurobipy", None)
    ok, why = gurobi.gurobi_available.__wrapped__()  # uncached: the real check, with gurobipy unimportable
    assert not ok and "pip install gurobipy" in why
    monkeypatch.setattr(gurobi, "gurobi_available", lambda: (ok, why))
    with pytest.raises(registry.SolverUnavailable, match="pip install gurobipy"):
        registry.solve_with("gurobi", classic_knapsack()[0])
    r = registry.solve_with("auto", classic_knapsack()[0], time_limit=10)
    assert r.solver == "highs" and r.notice is None


def test_gurobi_within_the_free_limits_runs_gurobi(small_cnn):
    _skip_unless("gurobi")
    m = small_cnn.model(0.3).milp
    assert gurobi.fits_limited(m)
    r = registry.solve_with("gurobi", m, time_limit=30, mip_gap=1e-6, threads=1)
    assert (r.solver, r.requested, r.notice, r.status) == ("gurobi", "gurobi", None, "optimal")


def test_gurobi_fallback_over_the_size_limited_license():
    """vgg16's POET model (3623 variables) is over the pip license's 2000: the real license refuses it
    (GurobiError 10010), and solve_with("gurobi") answers with HiGHS and a one-line notice saying why."""
    _gurobi_limited()
    import gurobipy as gp

    pm = Poet("vgg16").model(0.6)
    m = pm.milp
    assert m.n_vars > gurobi.LIMITED_VARIABLES and not gurobi.fits_limited(m)
    with pytest.raises(gp.GurobiError) as err:  # the real size-limited license, not a simulation
        gurobi.solve(m, time_limit=10, threads=1)
    assert err.value.errno == gurobi.TOO_LARGE
    r = registry.solve_with("gurobi", m, time_limit=30, mip_gap=1e-4, threads=1)
    assert (r.solver, r.requested) == ("highs", "gurobi")
    assert r.notice and "\n" not in r.notice and "HiGHS" in r.notice and "2000" in r.notice
    assert str(m.n_vars) in r.notice and "size-limited" in r.notice
    assert r.status in ("optimal", "time_limit") and r.values is not None and m.is_feasible(r.values)
    assert r.to_json()["notice"] == r.notice
    auto = registry.solve_with("auto", m, time_limit=30, mip_gap=1e-4, threads=1)
    assert auto.solver == "highs" and auto.notice is None  # auto uses Gurobi only with a full license


def test_gurobi_error_10010_falls_back(monkeypatch, small_cnn):
    """If the limits are not known in advance, Gurobi's own 10010 triggers the same fallback."""
    _gurobi_limited()
    import gurobipy as gp

    m = small_cnn.model(0.3).milp

    def refuse(*a, **k):
        raise gp.GurobiError(gurobi.TOO_LARGE, "Model too large for size-limited license; visit ...")

    monkeypatch.setattr(gurobi, "fits_limited", lambda m: True)
    monkeypatch.setitem(registry.SOLVERS, "gurobi", replace(registry.SOLVERS["gurobi"], solve=refuse))
    r = registry.solve_with("gurobi", m, time_limit=30, threads=1)
    assert r.solver == "highs" and "GurobiError 10010" in r.notice and r.status == "optimal"
    assert math.isfinite(r.objective)


# ---- the sub-solves follow the same policy --------------------------------------------------------------------

def test_gurobi_sub_solves_run_gurobi_within_the_license_and_hand_over_past_it(monkeypatch, small_cnn):
    """`--solver gurobi` with the size-limited license: the search's sub-MIPs and an LP relaxation run on Gurobi
    while the model fits; an LP whose added rows pass 2000 constraints goes to HiGHS, at the same optimum, and the
    compile's notices say so once."""
    from edgetrain.compiler.scheduling.search import improve

    _gurobi_limited()
    ran = []
    real = registry.SOLVERS["gurobi"]
    monkeypatch.setitem(registry.SOLVERS, "gurobi",
                        replace(real, solve=lambda m, **kw: ran.append(m.n_rows) or real.solve(m, **kw)))
    pm = small_cnn.model(0.3)
    assert gurobi.fits_limited(pm.milp)
    x0 = registry.solve_with("highs", pm.milp, time_limit=10, threads=1, solutions=1).values
    solver = registry.Solver("gurobi")
    r = improve(pm, small_cnn.lv, x0, 2.0, threads=1, solver=solver)
    assert ran and solver.notices == [] and pm.milp.is_feasible(r.values)

    lp = solver.lp(pm.milp, threads=1)
    on_gurobi, _ = lp.solve(30)
    on_highs, _ = highs.LpSession(pm.milp, threads=1).solve(30)
    assert math.isclose(on_gurobi, on_highs, rel_tol=1e-7)
    n = len(ran)
    spare = gurobi.LIMITED_CONSTRAINTS + 1 - gurobi.constraint_count(pm.milp)
    lp.add_rows([[(j % pm.milp.n_vars, 1.0)] for j in range(spare)], hi=1.0)  # x <= 1: binding nothing
    again, _ = lp.solve(30)
    assert len(ran) == n and math.isclose(again, on_highs, rel_tol=1e-7)
    assert len(solver.notices) == 1 and "HiGHS" in solver.notices[0] and "2000" in solver.notices[0]


def test_cpsat_has_its_lps_solved_by_highs_and_says_so(small_cnn):
    """CP-SAT takes integer variables only: a compile's LP relaxations go to HiGHS, with a notice."""
    _skip_unless("cpsat")
    solver = registry.Solver("cpsat")
    lp = solver.lp(small_cnn.model(0.3).milp, threads=1)
    assert isinstance(lp, highs.LpSession) and lp.solve(30) is not None
    assert len(solver.notices) == 1 and "HiGHS" in solver.notices[0]
    with pytest.raises(ValueError, match="unknown solver"):
        registry.Solver("cplex")
