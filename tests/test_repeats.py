"""The repeated-block solve (scheduling/repeats.py) on a stack of four identical residual blocks: the blocks are
found from the graph, the restricted MILP's schedules are schedules of the flat MILP, the validator replays them
within the budget, and the restricted optimum equals the flat one above the smallest budget (15.4% more energy at
the smallest, where the flat optimum frees a tensor before its block's backward and brings it back later)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from edgetrain.compiler.graph.liveness import analyze
from edgetrain.compiler.pipeline import CompileOptions, build_graph
from edgetrain.compiler.scheduling.budget import anchors
from edgetrain.compiler.scheduling.milp.registry import solve_with
from edgetrain.compiler.scheduling.poet import build as build_poet
from edgetrain.compiler.scheduling.block_solve import block_solve, tied_columns
from edgetrain.compiler.scheduling.heuristics import dtr
from edgetrain.compiler.scheduling.repeats import find_blocks, groups, restriction
from edgetrain.compiler.scheduling.schedulers import run_scheduler
from edgetrain.compiler.scheduling.steps import build_steps
from edgetrain.compiler.scheduling.validator import validate
from edgetrain.compiler.scheduling.warmstart import best_start
from edgetrain.targets import load_target

TARGET = load_target("nrf52840")  # paging and recompute energies of one order: the optima do both
MIN_GAP = 0.16  # the restriction's energy over the flat optimum at the smallest budget (measured 15.4%)


@pytest.fixture(scope="module")
def stack():
    _, _, g = build_graph(CompileOptions(model="tests/repeated_models.py:stack", target="nrf52840", budget="min",
                                         out="", batch_size=2), TARGET)
    lv = analyze(g)
    a = anchors(g, lv, TARGET)
    return g, lv, a.min_feasible_bytes, a.store_all.peak_bytes


def test_the_four_blocks_are_found(stack):
    g, lv, _, _ = stack
    blocks = find_blocks(g, lv)
    assert blocks is not None and blocks.count == 4
    ops = [tuple(n.op for n in g.nodes[blocks.start + k * blocks.period:][:blocks.period]) for k in range(4)]
    assert len(set(ops)) == 1 and "addmm" in " ".join(ops[0])
    shape = restriction(g, lv, blocks)
    assert shape.tie, "the middle blocks share their variables"
    assert all(lv.B0 < t for t in shape.opens.values()), "a block's tensors are decided about from its backward on"


@pytest.mark.parametrize("frac", [0.0, 0.3, 0.6])
def test_restricted_solve_is_a_flat_schedule_within_its_gap(stack, frac):
    g, lv, low, high = stack
    budget = int(low + frac * (high - low))
    flat = build_poet(g, lv, TARGET, budget)
    best = solve_with("highs", flat.milp, time_limit=60, mip_gap=1e-6)
    assert best.status == "optimal"
    pm = build_poet(g, lv, TARGET, budget, repeats=restriction(g, lv, find_blocks(g, lv)))
    assert pm.milp.n_vars < flat.milp.n_vars / 3
    res = solve_with("highs", pm.milp, time_limit=60, mip_gap=1e-6)
    assert res.status == "optimal"
    d = pm.decisions(res.values, lv)
    # The restricted schedule is a point of the flat model, at the same energy.
    x = flat.vector(d)
    assert flat.milp.is_feasible(x)
    assert flat.milp.objective(x) == pytest.approx(res.objective, rel=1e-9)
    report = validate(g, build_steps(g, lv, d), TARGET, budget, strict=True)
    assert report.peak_bytes <= budget
    assert report.energy_j == pytest.approx(res.objective, rel=1e-9)
    assert res.objective >= best.objective * (1 - 1e-9)
    assert res.objective <= best.objective * (1 + (MIN_GAP if frac == 0.0 else 1e-9))


def test_scheduler_reports_the_restriction(stack):
    g, lv, low, high = stack
    budget = int(low + 0.3 * (high - low))
    reused = run_scheduler(g, lv, TARGET, budget, repeats="reuse", time_limit=30)
    assert reused.solver["repeats"]["count"] == 4 and reused.solver["repeats"]["tied_tensors"] > 0
    assert reused.report.peak_bytes <= budget
    flat = run_scheduler(g, lv, TARGET, budget, repeats="auto", time_limit=30)  # small: auto solves it flat
    assert "repeats" not in flat.solver
    assert reused.report.energy_j == pytest.approx(flat.report.energy_j, rel=1e-6)


@pytest.mark.parametrize("frac", [0.3, 0.6])
def test_tied_start_is_a_point_of_the_restricted_model(stack, frac):
    """The greedy start by groups of tied tensors: within the budget, and a feasible point of the restricted model
    at the validator's energy (so HiGHS takes it as its start); the same solve started from it ends no worse."""
    g, lv, low, high = stack
    budget = int(low + frac * (high - low))
    shape = restriction(g, lv, find_blocks(g, lv))
    start, info = best_start(g, lv, TARGET, budget, groups=groups(lv, shape))
    assert start is not None and info["order"]
    report = validate(g, build_steps(g, lv, start.decisions), TARGET, budget, strict=True)
    assert report.peak_bytes <= budget
    pm = build_poet(g, lv, TARGET, budget, repeats=shape)
    x = pm.vector(start.decisions)
    assert pm.milp.is_feasible(x)
    assert pm.milp.objective(x) == pytest.approx(report.energy_j, rel=1e-9)
    res = solve_with("highs", pm.milp, time_limit=30, mip_gap=1e-6, warm_start=x)
    assert res.objective <= report.energy_j * (1 + 1e-9)
    # The tied blocks' sub-problem alone, the rest fixed at the start: a point of the model, no dearer.
    free = tied_columns(pm, shape)
    assert 0 < free.sum() < pm.milp.n_vars
    sub = block_solve("highs", pm, shape, x, 30, mip_gap=1e-6)
    assert sub.values is not None and pm.milp.is_feasible(sub.values)
    assert pm.milp.objective(sub.values) <= report.energy_j * (1 + 1e-9)
    assert np.array_equal(np.round(sub.values)[~free], np.round(x)[~free])


def test_groups_tie_blocks_and_hold_block_outputs(stack):
    g, lv, _, _ = stack
    shape = restriction(g, lv, find_blocks(g, lv))
    gr = groups(lv, shape)
    tied = [ms for ms in {gr.members(i) for i in shape.tie}]
    assert tied and all(len(ms) >= 2 for ms in tied), "tied tensors come in groups of identical blocks"
    # A block's output feeds the next block's forward: a recompute there would need it before its own block's
    # backward opens it, so it is held, never dropped.
    assert gr.pinned and all(i in shape.opens for i in gr.pinned)
    assert not gr.pinned & gr.dropped


def test_scheduler_starts_the_restricted_model_from_the_tied_start(stack):
    """Where DTR's schedule (per tensor, freeing before a block's backward) is no point of the restricted model,
    the restricted solve starts from the tied start and its plan is at least as good."""
    g, lv, low, high = stack
    budget = int(low + 0.3 * (high - low))
    shape = restriction(g, lv, find_blocks(g, lv))
    pm = build_poet(g, lv, TARGET, budget, repeats=shape)
    d = dtr(g, lv, budget)
    assert d is None or not pm.milp.is_feasible(pm.vector(d))
    s = run_scheduler(g, lv, TARGET, budget, repeats="reuse", time_limit=20)
    assert s.solver["warm_start"] is not None
    assert s.solver["tied_starts"]["energy_j"] >= s.report.energy_j * (1 - 1e-9)
    assert s.report.peak_bytes <= budget


def test_reused_plan_compiles_and_trains_as_autograd(tmp_path, capsys):
    """Through the CLI at the smallest budget: the restricted solve's plan runs within its budget and trains as
    eager autograd."""
    from edgetrain.compiler.workbench.cli import main

    out = tmp_path / "o"
    assert main(["compile", "tests/repeated_models.py:stack", "--target", "nrf52840", "--budget", "min",
                 "--batch-size", "2", "--time-limit", "10", "--repeats", "reuse", "--out", str(out), "--json"]) == 0
    c = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert c["schedule"] == "milp" and c["solver"]["status"] == "optimal" and c["solver"]["repeats"]["count"] == 4
    assert c["peak_bytes"] <= c["budget_bytes"] and c["recomputes"] + c["page_ins"] > 0
    assert set(c["phases"]) >= {"trace", "solve_and_render", "write_schedule"}
    assert main(["run", str(out), "--steps", "2", "--check", "--json"]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["ok"] and not r.get("mismatched") and r["max_abs_err"] == 0
