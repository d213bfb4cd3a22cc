"""The solver speed-ups keep the optimum, and the solve benchmark reports sizes, status, bound and gap as they are.

Real HiGHS solves of small zoo graphs (mcu_resnet: a residual graph where page-ins are pruned; small_cnn) on
nrf52840, whose paging and recompute energies are of one order, so the optimum both pages and recomputes.
"""
from __future__ import annotations

import math
import os
import re
import sys

import numpy as np
import pytest

from edgetrain.compiler.pipeline import CompileOptions, build_graph
from edgetrain.compiler.scheduling.steps import build_steps
from edgetrain.compiler.graph.liveness import analyze
from edgetrain.compiler.scheduling.milp import highs
from edgetrain.compiler.scheduling.poet import build as build_poet, reads
from edgetrain.compiler.scheduling.budget import min_budget
from edgetrain.compiler.scheduling.heuristics import store_all
from edgetrain.compiler.scheduling.schedulers import run_scheduler
from edgetrain.compiler.scheduling.validator import validate
from edgetrain.targets import load_target

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import solve as bench  # noqa: E402

TARGET = load_target("nrf52840")


class Graph:
    def __init__(self, model: str, batch: int = 2):
        _, _, self.g = build_graph(CompileOptions(model=model, target="nrf52840", budget="100%", out="",
                                                  batch_size=batch), TARGET)
        self.lv = analyze(self.g)
        self.sa = validate(self.g, build_steps(self.g, self.lv, store_all(self.g, self.lv)), TARGET, None)
        self.min = min_budget(self.lv)

    def budget(self, frac: float) -> int:
        return int(self.min + frac * (self.sa.peak_bytes - self.min))


@pytest.fixture(scope="module")
def mcu_resnet():
    return Graph("mcu_resnet")


@pytest.fixture(scope="module")
def small_cnn():
    return Graph("small_cnn")


@pytest.mark.parametrize("frac", [0.0, 0.3])
@pytest.mark.parametrize("name", ["mcu_resnet", "small_cnn"])
def test_pruned_and_tightened_model_keeps_the_optimum(name, frac, request):
    """Dominated page-ins left out, "held once" and "sources" rows added: the plain formulation's optimum."""
    G = request.getfixturevalue(name)
    b = G.budget(frac)
    plain = build_poet(G.g, G.lv, TARGET, b, prune=False, held_once="none", sources=False)
    optima = []
    for kw in ({}, {"held_once": "all"}):
        m = build_poet(G.g, G.lv, TARGET, b, **kw)
        r = highs.solve(m.milp, time_limit=60, mip_gap=1e-9, threads=1)
        assert r.status == "optimal"
        optima.append(r.objective)
        # The schedule it stands for replays in the validator at the MILP's energy and within the budget.
        rep = validate(G.g, build_steps(G.g, G.lv, m.decisions(r.values, G.lv)), TARGET, b)
        assert math.isclose(rep.energy_j, r.objective, rel_tol=1e-9)
        assert rep.peak_bytes <= b
    ref = highs.solve(plain.milp, time_limit=60, mip_gap=1e-9, threads=1)
    assert ref.status == "optimal"
    for obj in optima:
        assert math.isclose(obj, ref.objective, rel_tol=1e-9), (obj, ref.objective)


def test_page_ins_only_where_something_reads(mcu_resnet):
    G = mcu_resnet
    m = build_poet(G.g, G.lv, TARGET, G.budget(0.0))
    plain = build_poet(G.g, G.lv, TARGET, G.budget(0.0), prune=False)
    where = reads(G.lv, {i: G.lv.recomputable(i) for i in G.lv.decision})
    assert all(t in where[i] for t, i in m.P)
    assert len(m.P) < len(plain.P)  # this residual graph has page-ins nothing could read


def test_held_once_at_every_read(small_cnn):
    """At a stage whose node reads a tensor, the optimum holds it exactly once (never kept and recomputed)."""
    G = small_cnn
    m = build_poet(G.g, G.lv, TARGET, G.budget(0.0))
    r = highs.solve(m.milp, time_limit=60, mip_gap=1e-9, threads=1)
    x = np.round(r.values)
    for t in range(G.lv.B0, G.lv.T):
        for i in G.lv.needs[t]:
            held = x[m.K[i]] if t == G.lv.B0 else x[m.S[t, i]]
            held += sum(x[v[t, i]] for v in (m.R, m.P) if (t, i) in v)
            assert held == 1, (t, i)


def test_dtr_is_a_warm_start_candidate(small_cnn):
    """Where DTR fits and beats the budget-blind heuristics, the MILP starts from it."""
    G = small_cnn
    s = run_scheduler(G.g, G.lv, TARGET, G.budget(0.5), time_limit=30, mip_gap=1e-9, threads=1)
    assert s.solver["warm_start"] is not None
    d = run_scheduler(G.g, G.lv, TARGET, G.budget(0.5), scheduler="dtr")
    assert s.report.energy_j <= d.report.energy_j * (1 + 1e-12)


def test_per_model_values():
    assert bench.per_model("30,resnet50=120") == {"": 30.0, "resnet50": 120.0}
    assert bench.per_model("1e-3") == {"": 1e-3}
    with pytest.raises(SystemExit):
        bench.per_model("resnet50=120")


def test_benchmark_rows(small_cnn):
    """`min` is the smallest feasible budget; baselines that cannot meet it say so; sizes are reported."""
    rows = bench.bench_model("small_cnn", "nrf52840", ["100%", "min"], 2, 20.0, 1e-3, threads=1)
    full, tight = rows
    assert tight["budget_bytes"] == small_cnn.min == tight["min_feasible_bytes"]
    assert tight["ref_vars"] == 5 * tight["nodes"] ** 2 + tight["nodes"] * tight["edges"]
    assert 0 < tight["vars"] < tight["ref_vars"]
    assert tight["status"] == "optimal" and tight["gap"] <= 1e-3
    assert tight["bound"] <= tight["objective"] and tight["peak_bytes"] <= tight["budget_bytes"]
    assert tight["baselines"]["store-all"]["status"] == "infeasible"
    assert tight["baselines"]["checkmate"]["status"] == "infeasible"  # the input cannot be recomputed
    assert full["baselines"]["store-all"]["energy_j"] == pytest.approx(full["energy_j"], rel=1e-12)
    for r in rows:  # no baseline that fits spends less than POET's proven bound
        for b in r["baselines"].values():
            if b["energy_j"] is not None:
                assert b["energy_j"] >= r["bound"] * (1 - 1e-12)


def test_benchmark_never_calls_a_time_limited_solve_optimal():
    """ResNet-18 on nrf52840 at its smallest budget takes HiGHS far more than 0.5 s to prove 0.1%."""
    rows = bench.bench_model("resnet18", "nrf52840", ["min"], 8, 0.5, 1e-3, threads=1, baselines=())
    r = rows[0]
    assert r["status"] != "optimal"
    assert r["gap"] is None or r["gap"] > 1e-3
    assert r["energy_j"] is not None and r["peak_bytes"] <= r["budget_bytes"]


def test_bound_ladder_climbs_to_the_proven_optimum():
    """benchmarks/relaxation.py: the cuts lift the LP, no bound passes the optimum, and the model with the
    cuts proves the same optimum as the plain one (the cuts keep it). ("+memory" need not reach "+window":
    each loop stops when its bound stalls, and with more rows to add it may stop elsewhere.)"""
    import relaxation

    r = relaxation.ladder("small_cnn", "nrf52840", "min", 2, cut_seconds=10, mip_seconds=30, threads=1)
    assert r["budget_bytes"] == min_budget(Graph("small_cnn").lv)
    assert r["mip_plain"]["status"] == r["mip_cuts"]["status"] == "optimal" and r["proven"]
    assert r["mip_cuts"]["objective"] == pytest.approx(r["mip_plain"]["objective"], rel=1e-6)
    best = r["best"]
    for lifted in (r["window"], r["both"], r["mip_plain"]["bound"], r["mip_cuts"]["bound"]):
        assert r["lp"] - 1e-9 <= lifted <= best * (1 + 1e-6)
    assert r["both"] > r["lp"] * 1.05  # measured: 0.0196 -> 0.0266 J; the cuts must do something here
    assert r["window_cuts"] > 0 and r["memory_cuts"] > 0
    assert r["closed"] == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize("frac", [0.0, 0.2, 0.5, 1.0])
@pytest.mark.parametrize("name", ["mcu_resnet", "small_cnn"])
def test_greedy_keep_fits_the_budget(name, frac, request):
    """The budget-aware start validates within its budget (or says it found none); at store-all's peak it
    is store-all; and it never pages a tensor it keeps."""
    from edgetrain.compiler.scheduling.warmstart import greedy_keep

    G = request.getfixturevalue(name)
    b = G.budget(frac)
    for paging in (True, False):
        d = greedy_keep(G.g, G.lv, TARGET, b, paging=paging, retain=True)
        if d is None:
            assert frac < 1.0
            continue
        rep = validate(G.g, build_steps(G.g, G.lv, d), TARGET, b)  # raises if over the budget
        assert not (d.keep & d.page_out)
        if not paging:
            assert not d.page_out and not any(d.page_in.values())
        if frac == 1.0:
            assert rep.energy_j == pytest.approx(G.sa.energy_j, rel=1e-12)


def test_greedy_keep_beats_paging_everything_on_resnet18():
    """ResNet-18, nrf52840, batch 8, 40%: the start the MILP had before (page-all, 51.7 J; 53.7 J while it also
    paged out what it never paged in) is far worse."""
    from edgetrain.compiler.scheduling.budget import anchors, parse_budget
    from edgetrain.compiler.scheduling.heuristics import page_all
    from edgetrain.compiler.scheduling.warmstart import greedy_keep

    G = Graph("resnet18", batch=8)
    b = parse_budget("90%").resolve(anchors(G.g, G.lv, TARGET))
    mine = validate(G.g, build_steps(G.g, G.lv, greedy_keep(G.g, G.lv, TARGET, b)), TARGET, b).energy_j
    pages = validate(G.g, build_steps(G.g, G.lv, page_all(G.g, G.lv, retain=True)), TARGET, b).energy_j
    assert mine < pages - 2.0, (mine, pages)


@pytest.mark.parametrize("frac", [0.0, 0.2, 0.5])
@pytest.mark.parametrize("name", ["mcu_resnet", "small_cnn"])
def test_best_start_is_never_worse_than_one_greedy_and_is_deterministic(name, frac, request):
    """Every drop order and the refill validate within the budget; the best is the cheapest of them, never
    above the first order's greedy alone, and the same on a second run."""
    from edgetrain.compiler.scheduling import warmstart as W

    G = request.getfixturevalue(name)
    b = G.budget(frac)
    for paging in (True, False):
        one = W._greedy(G.g, G.lv, TARGET, b, paging, True, *W.RUNS[0])
        best, info = W.best_start(G.g, G.lv, TARGET, b, paging=paging)
        if one is None:
            assert best is None or validate(G.g, build_steps(G.g, G.lv, best.decisions), TARGET, b)
            continue
        single = validate(G.g, build_steps(G.g, G.lv, one.decisions), TARGET, b).energy_j
        rep = validate(G.g, build_steps(G.g, G.lv, best.decisions), TARGET, b)  # raises if over the budget
        assert rep.energy_j == pytest.approx(best.energy_j, rel=1e-12) == info["energy_j"]
        assert best.energy_j <= single * (1 + 1e-12)
        assert info["starts"] == info["of"] == len(W.RUNS) and info["evaluations"] > 0
        again, info2 = W.best_start(G.g, G.lv, TARGET, b, paging=paging)
        assert again.energy_j == best.energy_j and again.keep == best.keep and info2["order"] == info["order"]
        assert again.decisions == best.decisions


def test_a_spent_time_share_runs_only_the_first_cheap_order(small_cnn):
    """With no time at all, only the first order starts, and it stops at once without a start: the starts never
    run past their share of the compile's time. With time, the first order is a jitter covering the excess."""
    from edgetrain.compiler.scheduling import warmstart as W

    G = small_cnn
    best, info = W.best_start(G.g, G.lv, TARGET, G.budget(0.5), seconds=0.0)
    assert info["starts"] == 1 and info["of"] == len(W.RUNS) and best is None
    best, info = W.best_start(G.g, G.lv, TARGET, G.budget(0.5))
    assert best is not None and info["starts"] == len(W.RUNS)
    first = W._greedy(G.g, G.lv, TARGET, G.budget(0.5), True, True, *W.RUNS[0])
    assert first is not None and first.order.startswith(f"bytes-per-joule~{W.JITTER_SEEDS[0]}/batch")


def test_refill_adds_back_only_what_fits_and_pays(small_cnn):
    """A start with one droppable tensor dropped needlessly (the budget is store-all's) gets it back."""
    from edgetrain.compiler.scheduling import warmstart as W

    G = small_cnn
    b = G.budget(1.0)
    s = W._greedy(G.g, G.lv, TARGET, b, True, True)
    assert s is not None and not s.dropped
    victim = max(s.keep, key=lambda i: G.lv.size[i])
    d, rep = W._evaluate(G.g, G.lv, TARGET, s.keep - {victim}, True, True)
    worse = W.Start(d, s.keep - {victim}, rep.energy_j, "by hand", 1, [victim])
    assert worse.energy_j > s.energy_j
    back = W.refill(G.g, G.lv, TARGET, b, worse, True, True)
    assert back.keep == s.keep and back.energy_j == s.energy_j and back.order == "by hand+refill"
    tight = max(rep.stage_peaks)
    if tight < max(W._evaluate(G.g, G.lv, TARGET, s.keep, True, True)[1].stage_peaks):
        assert W.refill(G.g, G.lv, TARGET, tight, worse, True, True).keep == worse.keep  # no room for it


def test_greedy_starts_count_inside_the_time_limit(small_cnn):
    """The solver's report says how many starts ran and how long they took."""
    G = small_cnn
    s = run_scheduler(G.g, G.lv, TARGET, G.budget(0.3), time_limit=5.0)
    starts = s.solver["greedy_starts"]
    assert starts["starts"] >= 1 and starts["seconds"] >= 0 and starts["evaluations"] > 0


def test_a_page_in_of_a_held_tensor_is_dropped_with_its_page_out(small_cnn):
    """A time-limited incumbent may page in a tensor it already holds (build_steps skips that page-in, so its
    page-out is never used and strict validation refuses it): the scheduler's clean-up drops both."""
    from edgetrain.compiler.scheduling.poet import without_redundant_holds

    G = small_cnn
    model = build_poet(G.g, G.lv, TARGET, G.sa.peak_bytes)
    x = model.vector(store_all(G.g, G.lv))
    (t, i), j = next(((t, i), j) for (t, i), j in model.P.items() if x[model.entering(t, i, G.lv.B0)] > 0.5)
    x[j] = x[model.PO[i]] = 1.0
    with pytest.raises(Exception, match="never paged in"):
        validate(G.g, build_steps(G.g, G.lv, model.decisions(x, G.lv)), TARGET, None, strict=True)
    clean = without_redundant_holds(model, G.lv, x)
    assert clean[j] == 0 and clean[model.PO[i]] == 0
    rep = validate(G.g, build_steps(G.g, G.lv, model.decisions(clean, G.lv)), TARGET, None, strict=True)
    assert rep.energy_j == pytest.approx(G.sa.energy_j, rel=1e-12)


def test_lns_only_improves_and_stays_feasible(mcu_resnet):
    from edgetrain.compiler.scheduling.heuristics import page_all
    from edgetrain.compiler.scheduling.search import improve

    G = mcu_resnet
    b = G.budget(0.1)
    pm = build_poet(G.g, G.lv, TARGET, b)
    x0 = pm.vector(page_all(G.g, G.lv, retain=False))
    assert pm.milp.is_feasible(x0)
    r = improve(pm, G.lv, x0, 5.0, threads=1)
    assert r.rounds >= 1 and r.branched >= 1 and pm.milp.is_feasible(r.values)
    assert r.objective <= pm.milp.objective(x0) and r.objective == pytest.approx(pm.milp.objective(r.values))
    opt = highs.solve(pm.milp, time_limit=60, mip_gap=1e-9, threads=1)
    assert r.objective >= opt.objective * (1 - 1e-12)  # a heuristic never beats the proven optimum


def test_local_branching_stays_within_its_radius_and_reaches_the_optimum_it_can(mcu_resnet):
    """local_branch solves the whole model within `radius` flipped binaries of the incumbent: its schedule is
    feasible, no worse, at most `radius` flips away; radius 0 can only return the incumbent; a radius as large
    as the distance to a proven optimum reaches the optimum's energy."""
    from edgetrain.compiler.scheduling.heuristics import page_all
    from edgetrain.compiler.scheduling.search import local_branch

    G = mcu_resnet
    pm = build_poet(G.g, G.lv, TARGET, G.budget(0.1))
    m = pm.milp
    x0 = pm.vector(page_all(G.g, G.lv, retain=False))
    opt = highs.solve(m, time_limit=60, mip_gap=1e-9, threads=1)
    far = int(np.sum(np.abs(np.round(opt.values) - x0)))
    assert far > 4 and opt.objective < m.objective(x0) * (1 - 1e-9)
    stay = local_branch(m, x0, 0, 30.0, threads=1)
    assert stay.objective == pytest.approx(m.objective(x0), rel=1e-12)
    near = local_branch(m, x0, far // 2, 30.0, threads=1)
    assert m.is_feasible(near.values) and near.objective <= m.objective(x0) * (1 + 1e-12)
    assert np.sum(np.abs(np.round(near.values) - x0)) <= far // 2
    full = local_branch(m, x0, far, 60.0, threads=1)
    assert full.objective == pytest.approx(opt.objective, rel=1e-6)


def test_recompute_only_probe_is_a_restriction(mcu_resnet):
    """The probe's model fixes every page-out at 0: where the full optimum pages (30% of the range) it is
    infeasible; where it does not (60%), its optimum pages nothing, is a schedule of the full model and costs
    the full optimum."""
    from edgetrain.compiler.scheduling.search import recompute_only

    G = mcu_resnet
    for frac, feasible in ((0.3, False), (0.6, True)):
        pm = build_poet(G.g, G.lv, TARGET, G.budget(frac))
        full = highs.solve(pm.milp, time_limit=60, mip_gap=1e-9, threads=1)
        only = highs.solve(recompute_only(pm), time_limit=60, mip_gap=1e-9, threads=1)
        assert full.status == "optimal"
        pages = any(full.values[j] > 0.5 for j in pm.PO.values())
        assert pages is not feasible and only.status == ("optimal" if feasible else "infeasible")
        if feasible:
            assert not any(only.values[j] > 0.5 for j in list(pm.PO.values()) + list(pm.P.values()))
            assert pm.milp.is_feasible(only.values)
            assert only.objective == pytest.approx(full.objective, rel=1e-6)


def test_phased_solve_reports_a_proven_bound():
    """ResNet-18/nrf52840 at its smallest budget: 6 s does not prove 0.1%; the LNS phase ran, the incumbent is a
    valid schedule, the bound is below it, and the status is not optimal."""
    G = Graph("resnet18", batch=8)
    s = run_scheduler(G.g, G.lv, TARGET, G.min, time_limit=6, mip_gap=1e-3, threads=1, lns=0.35)
    info = s.solver
    assert info["status"] == "time_limit" and info["gap"] > 1e-3
    assert "LNS" in info.get("notice", "")
    assert info["bound"] <= info["objective"] and s.report.energy_j <= info["objective"] * (1 + 1e-12)
    assert s.report.peak_bytes <= G.min


@pytest.fixture(scope="module")
def resnet18():
    return Graph("resnet18")


@pytest.mark.parametrize("frac, repaired", [(0.3, True), (0.5, True), (0.7, False)])
def test_rounded_recompute_only_start(resnet18, frac, repaired):
    """The restriction's LP rounded (and, where the rounding overflows a stage, repaired by the sub-MIP over the
    overflowing stages' tensors): a schedule of the full model that pages nothing, replays in the validator at the
    MILP's energy within the budget, comes out the same twice, and costs less than the restriction's first MIP
    schedule (the probe's feasibility-jump draw) on ResNet-18 at batch 2."""
    from edgetrain.compiler.scheduling.rounding import recompute_start
    from edgetrain.compiler.scheduling.search import recompute_only

    G, b = resnet18, resnet18.budget(frac)
    pm = build_poet(G.g, G.lv, TARGET, b)
    r = recompute_start(pm, G.lv, 60, threads=1)
    assert r.values is not None and pm.milp.is_feasible(r.values)
    assert (r.repaired == "first schedule") is repaired and (r.overflow > 0) is repaired
    assert not any(r.values[j] > 0.5 for j in list(pm.PO.values()) + list(pm.P.values()))
    assert r.lp <= r.objective and r.objective == pytest.approx(pm.milp.objective(r.values), rel=1e-12)
    rep = validate(G.g, build_steps(G.g, G.lv, pm.decisions(r.values, G.lv)), TARGET, b)
    assert math.isclose(rep.energy_j, r.objective, rel_tol=1e-9) and rep.peak_bytes <= b
    again = recompute_start(pm, G.lv, 60, threads=1)
    assert np.array_equal(again.values, r.values)
    draw = highs.solve(recompute_only(pm), time_limit=60, threads=1, solutions=1)
    assert draw.values is not None and r.objective < draw.objective


# -- one interface for every solve ----------------------------------------------------------------------------

class Recorder:
    """A solver backend registered for a test ("recording": HiGHS underneath) that records the kind of every model
    it is handed, and a count of the HiGHS instances made anywhere: one made outside it is a solve that bypassed
    the interface."""

    def __init__(self, monkeypatch):
        from edgetrain.compiler.scheduling.milp import registry

        self.calls: list[str] = []
        self.made = self.inside = 0
        make, solve = highs._highs, highs.solve

        def counting(*a, **k):
            self.made += 1
            return make(*a, **k)

        def recording(m, **kw):
            before = self.made
            r = solve(m, **kw)
            self.inside += self.made - before
            self.calls.append("mip" if any(m.integer) else "lp")
            return r

        monkeypatch.setattr(highs, "_highs", counting)
        monkeypatch.setitem(registry.SOLVERS, "recording",
                            registry.Backend("recording", "highspy", "highspy", recording))

    @property
    def bypassed(self) -> int:
        return self.made - self.inside


def test_every_sub_solve_goes_through_the_solver_it_is_given(mcu_resnet, monkeypatch):
    """Local branching, the search's windows, the rounding's LP and repairs, the cut rounds' LPs: each solves with
    the solver it is handed, and no HiGHS instance is made behind its back (a direct HiGHS call would show)."""
    from edgetrain.compiler.scheduling.cuts import strengthen
    from edgetrain.compiler.scheduling.heuristics import page_all
    from edgetrain.compiler.scheduling.milp.registry import Solver
    from edgetrain.compiler.scheduling.rounding import recompute_start
    from edgetrain.compiler.scheduling.search import improve, local_branch

    rec = Recorder(monkeypatch)
    G = mcu_resnet
    pm = build_poet(G.g, G.lv, TARGET, G.budget(0.1))
    x0 = pm.vector(page_all(G.g, G.lv, retain=False))
    solver = Solver("recording")
    kinds = {}
    for name, run in (("local branching", lambda: local_branch(pm.milp, x0, 10, 5.0, threads=1, solver=solver)),
                      ("search", lambda: improve(pm, G.lv, x0, 2.0, threads=1, solver=solver)),
                      ("rounding", lambda: recompute_start(pm, G.lv, 10.0, threads=1, solver=solver)),
                      ("cuts", lambda: strengthen(pm, G.lv, seconds=3.0, threads=1, solver=solver))):
        n = len(rec.calls)
        run()
        kinds[name] = set(rec.calls[n:])
    assert kinds["local branching"] == {"mip"} and kinds["search"] == {"mip"}, kinds
    assert "lp" in kinds["rounding"] and kinds["cuts"] == {"lp"}, kinds
    assert rec.made > 0 and rec.bypassed == 0
    highs.solve(pm.milp, time_limit=1, threads=1)  # what a solve around the interface looks like to the test
    assert rec.bypassed == 1


def test_the_phased_solve_routes_every_solve_through_the_requested_solver(resnet18, monkeypatch):
    """`--solver X --lns --cuts`: the first and last solves, the probe, the search and the cut rounds all run
    on X (here a recording backend registered for the test)."""
    rec = Recorder(monkeypatch)
    G = resnet18  # its smallest budget is not proven in 8 s, so every phase runs
    s = run_scheduler(G.g, G.lv, TARGET, G.min, time_limit=8, mip_gap=1e-3, threads=1, lns=0.35, cuts=0.15,
                      solver="recording")
    info = s.solver
    assert info["name"] == "highs" and info["requested"] == "recording"  # HiGHS's result, as the backend returns it
    assert "LNS" in info["notice"] and info["cuts"]["rounds"] > 0, info
    searched = int(re.search(r"LNS: (\d+) rounds", info["notice"]).group(1))  # one sub-MIP each
    assert rec.calls[0] == "mip" and rec.calls.count("mip") >= 1 + searched, (rec.calls, info["notice"])
    assert rec.calls.count("lp") >= info["cuts"]["rounds"] and rec.bypassed == 0, (rec.calls, rec.made)
    assert s.report.peak_bytes <= G.min
