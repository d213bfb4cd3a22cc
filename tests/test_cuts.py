"""Window cuts (compiler/scheduling/cuts.py): valid (every schedule without a redundant hold satisfies them, the optimum
is unchanged), effective (they raise the LP bound where the staircase is), and used by the phased solve.

Real HiGHS solves on nrf52840, where paging and recomputing cost the same order of energy.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from edgetrain.compiler.scheduling.budget import anchors, parse_budget
from edgetrain.compiler.scheduling.cuts import separate, separate_memory, strengthen
from edgetrain.compiler.scheduling.heuristics import candidates, dtr
from edgetrain.compiler.scheduling.milp import highs
from edgetrain.compiler.scheduling.poet import build as build_poet, without_redundant_holds
from edgetrain.compiler.scheduling.schedulers import run_scheduler
from edgetrain.compiler.scheduling.warmstart import greedy_keep

from test_solve_speedups import TARGET, Graph, mcu_resnet, small_cnn  # noqa: F401 - fixtures


@pytest.fixture(scope="module")
def resnet18():
    return Graph("resnet18", batch=8)


def schedules(G, budget: int, pm) -> list[np.ndarray]:
    """Every heuristic schedule that fits, as MILP vectors, plus the plain model's proven optimum."""
    options = dict(candidates(G.g, G.lv, True))
    for name, d in (("dtr", dtr(G.g, G.lv, budget)), ("greedy", greedy_keep(G.g, G.lv, TARGET, budget))):
        if d is not None:
            options[name] = d
    out = [pm.vector(d) for d in options.values()]
    out = [x for x in out if pm.milp.is_feasible(x)]
    opt = highs.solve(pm.milp, time_limit=60, mip_gap=1e-9, threads=1)
    assert opt.status == "optimal"
    return out + [opt.values]


@pytest.mark.parametrize("frac", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("name", ["mcu_resnet", "small_cnn"])
def test_cuts_keep_the_optimum_and_hold_for_every_schedule(name, frac, request):
    G = request.getfixturevalue(name)
    b = G.budget(frac)
    pm = build_poet(G.g, G.lv, TARGET, b)
    cut, report = strengthen(pm, G.lv, seconds=20, threads=1)
    assert cut.milp.n_rows == pm.milp.n_rows + report.cuts
    assert report.lp_after >= report.lp_before - 1e-9 * abs(report.lp_before)
    plain = highs.solve(pm.milp, time_limit=60, mip_gap=1e-9, threads=1)
    strong = highs.solve(cut.milp, time_limit=60, mip_gap=1e-9, threads=1)
    assert plain.status == strong.status == "optimal"
    assert math.isclose(plain.objective, strong.objective, rel_tol=1e-9), (plain.objective, strong.objective)
    assert report.lp_after <= plain.objective * (1 + 1e-9)  # the LP with cuts is a lower bound
    for x in schedules(G, b, pm):
        clean = without_redundant_holds(pm, G.lv, x)
        assert pm.milp.is_feasible(clean) and pm.milp.objective(clean) <= pm.milp.objective(x) + 1e-12
        assert cut.milp.is_feasible(clean, tol=1e-9), "a window cut removes a schedule without redundant holds"


def test_some_tight_case_gets_cuts(mcu_resnet, small_cnn):
    """The validity test above must not pass because no cut was ever added."""
    counts = []
    for G in (mcu_resnet, small_cnn):
        pm = build_poet(G.g, G.lv, TARGET, G.budget(0.0))
        counts.append(strengthen(pm, G.lv, seconds=20, threads=1)[1].cuts)
    assert max(counts) > 0, counts


def test_redundant_holds_are_removed(small_cnn):
    G = small_cnn
    pm = build_poet(G.g, G.lv, TARGET, G.sa.peak_bytes * 2)  # room for a tensor held twice
    x = pm.vector(candidates(G.g, G.lv, True)["store-all"])
    redundant = [(t, i) for (t, i), j in pm.R.items() if t > G.lv.B0 and x[pm.S[t, i]] > 0.5]
    assert redundant, "store-all holds every recomputable tensor: some recompute is redundant"
    y = x.copy()
    for key in redundant[:3]:
        y[pm.R[key]] = 1.0
    assert pm.milp.is_feasible(y) and pm.milp.objective(y) > pm.milp.objective(x)
    clean = without_redundant_holds(pm, G.lv, y)
    assert np.array_equal(clean, x)


def test_cuts_lift_the_lp_bound_on_resnet18(resnet18):
    """The staircase this was written for (ResNet-18, nrf52840, 40%): the LP's added energy over computing
    every node once grows by more than half (measured 0.275 -> 0.476 J), and the first LP point violates cuts."""
    G = resnet18
    b = parse_budget("80%").resolve(anchors(G.g, G.lv, TARGET))
    pm = build_poet(G.g, G.lv, TARGET, b)
    base = pm.milp.offset
    lp = highs.LpSession(pm.milp, threads=1).solve(60)
    assert lp is not None and separate(pm, G.lv, lp[1])
    _, report = strengthen(pm, G.lv, seconds=30, threads=1)
    assert report.lp_after - base >= 1.5 * (report.lp_before - base), report.to_json()


def test_phased_solve_with_cuts_reports_them(resnet18):
    G = resnet18
    s = run_scheduler(G.g, G.lv, TARGET, G.min, time_limit=8, mip_gap=1e-3, threads=1, lns=0.35, cuts=0.15)
    info = s.solver
    assert "cuts" in info and info["cuts"]["cuts"] > 0 and "memory, the rest window" in info["notice"]
    assert info["bound"] >= info["cuts"]["lp_after"] - 1e-9 * abs(info["bound"])  # a proven bound is reported
    assert info["bound"] <= info["objective"] and s.report.peak_bytes <= G.min
    assert info["status"] != "optimal" or info["gap"] <= 1e-3


def test_compile_runs_the_phased_solve_when_asked(tmp_path, capsys):
    """`compile --lns --cuts`: ResNet-18 on nrf52840 at 40% does not prove 0.01% in 8 s, so the
    neighbourhood search and the cuts run, the schedule records them, and the plan is still exact-checked
    elsewhere (it is an ordinary validated schedule)."""
    import json

    from edgetrain.compiler.workbench.cli import main

    out = tmp_path / "p"
    main(["compile", "resnet18", "--target", "nrf52840", "--budget", "80%", "--time-limit", "25", "--lns", "0.35",
          "--cuts", "0.15", "--out", str(out), "--json"])
    r = json.loads(capsys.readouterr().out)
    assert r["ok"] is not False and "LNS" in r["solver"].get("notice", ""), r["solver"]
    body = json.loads((out / "schedule.json").read_text())
    assert "cuts" in body["solver"] and body["solver"]["bound"] <= body["solver"]["objective"]


def test_slow_lp_cut_rounds_take_the_time_of_a_solve_that_could_not_use_them(mcu_resnet, resnet18, monkeypatch):
    """strengthen(then=...): when 8 times the plain LP does not fit in the caller's later solve, the rounds take
    that time too and say so; the phased solve then leaves the cuts out of its last solve but counts their LP
    bound."""
    import edgetrain.compiler.scheduling.cuts as cuts_mod

    G = mcu_resnet
    pm = build_poet(G.g, G.lv, TARGET, G.budget(0.0))
    opt = highs.solve(pm.milp, time_limit=60, mip_gap=1e-9, threads=1)
    _, slow = strengthen(pm, G.lv, seconds=5, then=1e-6, threads=1)
    _, fast = strengthen(pm, G.lv, seconds=5, then=1e6, threads=1)
    assert slow.took_then and not fast.took_then
    assert slow.lp_after <= opt.objective * (1 + 1e-9)
    original = cuts_mod.strengthen
    monkeypatch.setattr(cuts_mod, "strengthen", lambda *a, **k: original(*a, **{**k, "then": 1e-6}))
    G = resnet18  # its smallest budget is not proven in 6 s, so every phase runs
    s = run_scheduler(G.g, G.lv, TARGET, G.min, time_limit=6, mip_gap=1e-3, threads=1, lns=0.3, cuts=0.3)
    info = s.solver
    assert info["cuts"]["took_then"] and not info["cuts"]["kept"] and "too slow" in info["notice"]
    assert info["cuts"]["lp_after"] - 1e-9 <= info["bound"] <= info["objective"] * (1 + 1e-12)


@pytest.mark.parametrize("limit, lns, skipped", [(6, 0.45, True), (10, 0.05, False)])
def test_a_last_solve_that_would_repeat_the_first_is_skipped(resnet18, monkeypatch, limit, lns, skipped):
    """Cuts left out and a last solve no longer than REDO times the first: it would be the first solve again (its
    bound stays below the first's), so the search takes its time (6 s, lns 0.45: about as long as the first).
    With far more time left it runs (10 s, lns 0.05: about three times the first; a narrower margin is at the
    mercy of the machine's load). Either way the schedule is valid and the bound below it."""
    import edgetrain.compiler.scheduling.cuts as cuts_mod
    import edgetrain.compiler.scheduling.phased as phased
    import edgetrain.compiler.scheduling.milp.registry as registry

    events, searching = [], []
    solve, improve = registry.solve_with, phased.improve

    def search(*a, **k):  # the search's own solves (its windows) are not the phased solve's
        events.append("search")
        searching.append(True)
        try:
            return improve(*a, **k)
        finally:
            searching.pop()

    def solved(*a, **k):
        if not searching:
            events.append("solve")
        return solve(*a, **k)

    monkeypatch.setattr(registry, "solve_with", solved)
    monkeypatch.setattr(phased, "improve", search)
    monkeypatch.setattr(phased, "_worth_it", lambda *a: False)
    strengthen = cuts_mod.strengthen  # never "too slow" (that path has its own test)
    monkeypatch.setattr(cuts_mod, "strengthen", lambda *a, **k: strengthen(*a, **{**k, "then": 1e6}))
    G = resnet18  # its smallest budget is not proven in 6 s, so every phase runs
    s = run_scheduler(G.g, G.lv, TARGET, G.min, time_limit=limit, mip_gap=1e-3, threads=1, lns=lns, cuts=0.15)
    info = s.solver
    assert "search" in events and not info["cuts"]["kept"]
    after = events[events.index("search") + 1:]
    assert (after == []) is skipped and ("last solve skipped" in info["notice"]) is skipped, (events, info["notice"])
    assert info["bound"] <= info["objective"] and s.report.peak_bytes <= G.min


@pytest.mark.parametrize("frac", [0.0, 0.1])
@pytest.mark.parametrize("name", ["mcu_resnet", "small_cnn"])
def test_memory_cuts_hold_for_every_schedule(name, frac, request):
    """Memory cuts need no assumption: every heuristic schedule that fits and the proven optimum satisfy each one
    as they are (no redundant hold removed), and the LP point they were separated at violates them."""
    G = request.getfixturevalue(name)
    b = G.budget(frac)
    pm = build_poet(G.g, G.lv, TARGET, b)
    lp = highs.LpSession(pm.milp, threads=1).solve(60)
    rows = separate_memory(pm, G.lv, lp[1])
    assert rows, "a tight budget where the LP recomputes chains that would not fit"
    cut = pm.milp.with_rows(rows, hi=0.0)
    assert not cut.is_feasible(lp[1], tol=1e-6)
    for x in schedules(G, b, pm):
        assert cut.is_feasible(x, tol=1e-9), "a memory cut removes a schedule"


def test_memory_cuts_lift_the_lp_at_the_smallest_budget(resnet18):
    """ResNet-18/nrf52840 at its smallest budget: the LP recomputes whole chains a fraction at one stage; with
    memory cuts the LP's added energy ends well above window cuts alone (10 rounds each: measured 2.77 J with
    window cuts alone, where they stop lifting, and 2.96 J with both). Rounds, not seconds, bound both runs, so a
    loaded machine does not give one fewer rounds than the other."""
    G = resnet18
    pm = build_poet(G.g, G.lv, TARGET, G.min)
    base = pm.milp.offset
    _, both = strengthen(pm, G.lv, seconds=300, max_rounds=10, threads=1)
    _, window = strengthen(pm, G.lv, seconds=300, max_rounds=10, threads=1, memory_cuts=False)
    assert both.lp_after - base >= window.lp_after - base + 0.15, (both.to_json(), window.to_json())
    assert both.memory > 0 and window.memory == 0


def test_lp_session_re_solves_cold_or_warm_to_the_same_optimum(small_cnn):
    """LpSession re-solves from scratch after added rows (faster on the big models); from the previous basis it
    reaches the same optimum."""
    G = small_cnn
    pm = build_poet(G.g, G.lv, TARGET, G.budget(0.0))
    plain, x = highs.LpSession(pm.milp, threads=1).solve(60)
    rows = separate(pm, G.lv, x)  # as separated: add_rows merges a variable named twice
    assert rows
    optima = []
    for cold in (True, False):
        lp = highs.LpSession(pm.milp, threads=1, cold=cold)
        lp.solve(60)
        lp.add_rows(rows)
        objective, y = lp.solve(60)
        assert max(sum(v * y[j] for j, v in terms) for terms in rows) <= 1e-6  # the re-solve saw the rows
        optima.append(objective)
    assert math.isclose(optima[0], optima[1], rel_tol=1e-9) and optima[0] >= plain * (1 - 1e-12)
