"""Property tests on random DAGs: the schedulers, the POET MILP and the validator agree on one memory model.

Models come from `tests/model_gen.py` in three families (chains, residual blocks, branches joined by torch.cat),
with random channels, kernels, strides, padding, groups, biases, pools, dropout and batch-norm, on small inputs.
Each is traced, lowered and costed on a device profile (rpi4, mkr1000, jetson-nano); budgets are drawn between
the smallest feasible budget (`min_budget`) and store-all's peak. The properties:

1. every schedule `run_scheduler` emits (every scheduler: poet, checkmate, and the heuristics when they fit)
   replays in the validator within the budget, with the report it was returned with; DTR's own ledger is the
   validator's;
2. where store-all or checkpoint fits, POET's energy is never above theirs; when the solver reports optimal,
   neither is Checkmate's, paging-only's or DTR's (beyond the MIP gap), and the solver's objective is the kept
   schedule's energy;
3. the MILP and the validator share one memory model: a heuristic's (or DTR's) decisions are MILP-feasible
   (POET's and Checkmate's rows) exactly when the validator accepts them within the budget, at the budget drawn
   and at one byte either side of each heuristic's peak, and the MILP objective is the validator's energy; the
   smallest feasible budget is attained by paging everything. Every graph has the outputs its backend's kernels
   write over dying operands marked (graph/inplace.py: the C runtime's on the microcontroller, torch's
   elsewhere), so these hold with in-place execution counted;
4. below `min_budget`, every scheduler raises BudgetError naming `min_budget`;
5. with a deadline of store-all's time x [1.0, 1.5] (or exactly a fitting heuristic's time), POET's schedule
   meets it, or BudgetError says it cannot (only when no heuristic meets budget and deadline); the MILP's own
   answer meets it as the validator counts time;
6. no schedule pages out a tensor it never pages in (heuristics, every scheduler, the MILP at a loose gap); a
   MILP solution that does loses those page-outs when it becomes decisions;
7. overlapping paging with compute (Python plans: page-ins read ahead, paged-out tensors freed later) keeps
   each tensor's steps in order, the peak, energy and time; page-ins move only earlier, frees only later.

Regressions: the smallest examples the properties found (each failed before its fix in compiler/).

Then end-to-end runs: fixed random models of each family compiled at a budget that forces recomputes or paging
(and by checkpointing, which recomputes batch-norm, dropout and max-pool for sure), executed for 2 steps by the
Python runtime and checked against autograd (parameters and buffers), with the runtime's measured peak equal to
the predicted one.

Hypothesis runs derandomized (the same examples on every run, no example database). To hunt for bugs, set
EDGETRAIN_PROP_EXAMPLES=500 to draw more, and EDGETRAIN_PROP_RANDOM=1 for fresh examples on each run.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from functools import lru_cache

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgetrain.compiler.pipeline import CompileOptions, build_graph, compile_model
from edgetrain.compiler.scheduling.steps import Decisions, build_steps
from edgetrain.compiler.errors import BudgetError, ValidationError
from edgetrain.compiler.frontend.capture import capture
from edgetrain.compiler.graph.costs import apply_costs
from edgetrain.compiler.graph.joint import build_graph as joint_graph
from edgetrain.compiler.scheduling.heuristics import candidates, checkpoint, dtr, page_all, paging_only, store_all
from edgetrain.compiler.graph.inplace import mark_in_place
from edgetrain.compiler.graph.ir import OptimizerConfig, TrainingGraph
from edgetrain.codegen.c.ops import IN_PLACE_ARGS as C_IN_PLACE
from edgetrain.runtime.python.inplace import IN_PLACE_ARGS as PY_IN_PLACE
from edgetrain.compiler.graph.liveness import Liveness, analyze
from edgetrain.compiler.scheduling.milp.registry import solve_with
from edgetrain.compiler.scheduling.poet import build as build_poet
from edgetrain.compiler.scheduling.poet import without_redundant_holds
from edgetrain.compiler.workbench.run import run_plan
from edgetrain.compiler.scheduling.budget import min_budget
from edgetrain.compiler.scheduling.overlap import overlap_paging
from edgetrain.compiler.scheduling.schedulers import SCHEDULERS, run_scheduler
from edgetrain.compiler.scheduling.validator import Report, validate
from model_gen import FAMILIES, build, gen_spec, spec_from_seed
from edgetrain.targets import load_target

# POET's trade-offs differ by device: on the Pi, paging costs less energy than recomputing but more time; on the
# Cortex-M0+ compute is so slow that paging is cheap in both; on a Jetson recomputing costs ~1e-9 J, far below
# paging (and below a solver's default absolute tolerances).
TARGETS = {name: load_target(name) for name in ("rpi4", "mkr1000", "jetson-nano")}
targets = st.sampled_from(sorted(TARGETS))
REL = 1e-9
TIME_LIMIT = 10.0  # a time-limited solve still returns a valid schedule; the properties must hold for it too
MIP_GAP = 1e-4  # run_scheduler's default relative gap: an optimal POET may be this far above another MILP
MODEL_GEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "model_gen.py")

PROPS = settings(
    max_examples=int(os.environ.get("EDGETRAIN_PROP_EXAMPLES", "25")),
    deadline=None,
    derandomize=not os.environ.get("EDGETRAIN_PROP_RANDOM"),  # CI: the same examples on every run
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


@st.composite
def specs(draw, family: str | None = None) -> dict:
    """A random model spec; Hypothesis draws (and shrinks) every choice the generator makes."""
    fam = family or draw(st.sampled_from(FAMILIES))
    return gen_spec(lambda lo, hi: draw(st.integers(lo, hi)), fam)


fractions = st.integers(0, 100)  # where the budget lies between min_budget (0) and store-all's peak (100)


@dataclass
class Case:
    target: object
    g: TrainingGraph
    lv: Liveness
    smallest: int
    store_all: Report  # store-all replayed without a budget: its peak and energy

    def budget(self, percent: int) -> int:
        return self.smallest + (self.store_all.peak_bytes - self.smallest) * percent // 100


@lru_cache(maxsize=256)
def _case(spec_json: str, target: str) -> Case:
    spec = json.loads(spec_json)
    torch.manual_seed(0)
    model = build(spec).train()
    x = torch.randn(spec["batch"], *spec["input"], generator=torch.Generator().manual_seed(0))
    classes = spec["head"]["classes"]
    y = torch.randint(0, classes, (spec["batch"],), generator=torch.Generator().manual_seed(1))
    g = joint_graph(capture(model, x, y), f"random-{spec['family']}", tuple(x.shape), classes, "cross_entropy",
                    OptimizerConfig())
    tg = TARGETS.get(target) or load_target(target)
    # Outputs written over dying operands, as the backend a target's plans are for marks them.
    g = mark_in_place(g, C_IN_PLACE if tg.is_mcu else PY_IN_PLACE)
    apply_costs(g, tg)
    lv = analyze(g)
    sa = validate(g, build_steps(g, lv, store_all(g, lv)), tg, None)
    return Case(target=tg, g=g, lv=lv, smallest=min_budget(lv), store_all=sa)


def case_of(spec: dict, target: str = "rpi4") -> Case:
    return _case(json.dumps(spec, sort_keys=True), target)


def replay(c: Case, d: Decisions, budget: int | None) -> Report:
    return validate(c.g, build_steps(c.g, c.lv, d), c.target, budget)


def fits(c: Case, d: Decisions, budget: int) -> bool:
    return replay(c, d, None).peak_bytes <= budget


def rel_close(a: float, b: float, rel: float = REL) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-300)


# -- 1. every emitted schedule validates within the budget ----------------------------------------------------
def _fixed_options(c: Case, name: str, budget: int) -> list[Decisions] | None:
    """The decisions a heuristic scheduler chooses among (None: the MILPs)."""
    if name == "store-all":
        return [store_all(c.g, c.lv)]
    if name == "checkpoint":
        return [checkpoint(c.g, c.lv)]
    if name == "paging":
        return [paging_only(c.g, c.lv, retain=True), paging_only(c.g, c.lv, retain=False)]
    if name == "dtr":
        d = dtr(c.g, c.lv, budget)
        if d is not None:  # DTR evicts until its own ledger fits the budget: that ledger must be the validator's
            assert fits(c, d, budget), f"DTR's schedule exceeds the budget it was given ({budget} B)"
        return [d] if d is not None else []
    return None


@PROPS
@given(spec=specs(), percent=fractions, target=targets)
def test_every_emitted_schedule_validates_within_budget(spec, percent, target):
    c = case_of(spec, target)
    budget = c.budget(percent)
    for name in SCHEDULERS:
        options = _fixed_options(c, name, budget)
        try:
            s = run_scheduler(c.g, c.lv, c.target, budget, scheduler=name, time_limit=TIME_LIMIT)
        except BudgetError:
            # POET never gives up at or above min_budget; a heuristic only when none of its options fits; the
            # recompute-only MILP (Checkmate) only when no recompute-only heuristic fits either.
            assert name != "poet", f"poet raised BudgetError at {budget} B >= min_budget {c.smallest} B"
            if options is None:
                options = list(candidates(c.g, c.lv, paging=False).values())
            assert not any(fits(c, d, budget) for d in options), name
            continue
        if options:
            assert any(fits(c, d, budget) for d in options), name
        rep = validate(c.g, s.steps, c.target, budget)  # raises ValidationError if anything is off
        assert rep.peak_bytes <= budget
        assert rep.peak_bytes == s.report.peak_bytes
        assert rel_close(rep.energy_j, s.report.energy_j) and rel_close(rep.time_s, s.report.time_s)
        # The steps are exactly what the returned decisions imply.
        assert build_steps(c.g, c.lv, s.decisions) == s.steps
        if name == "checkmate":
            assert rep.page_ins == rep.page_outs == 0


# -- 2. POET is never worse than the baselines that fit -----------------------------------------------------
@PROPS
@given(spec=specs(), percent=fractions, target=targets)
def test_poet_energy_never_above_fitting_baselines(spec, percent, target):
    c = case_of(spec, target)
    budget = c.budget(percent)
    poet = run_scheduler(c.g, c.lv, c.target, budget, scheduler="poet", time_limit=TIME_LIMIT)
    e = poet.report.energy_j
    # Store-all and checkpointing are among POET's candidates: never beaten, whatever the solver does.
    for d in (store_all(c.g, c.lv), checkpoint(c.g, c.lv)):
        rep = replay(c, d, None)
        if rep.peak_bytes <= budget:
            assert e <= rep.energy_j * (1 + REL), (poet.name, e, rep.energy_j)
    # Computing every node once is a lower bound no schedule beats.
    assert e >= c.store_all.energy_j * (1 - REL)
    if poet.name == "milp":  # the kept schedule is the solver's: its objective is the schedule's energy
        assert rel_close(poet.solver["objective"], e, 1e-6), (poet.solver, e)
    # POET's feasible set holds Checkmate's (no paging), paging-only's and DTR's schedules: when the solver
    # proved optimality, none of them may be cheaper by more than the requested gap.
    if poet.solver.get("status") != "optimal":
        return
    for name in ("checkmate", "paging", "dtr"):
        try:
            other = run_scheduler(c.g, c.lv, c.target, budget, scheduler=name, time_limit=TIME_LIMIT)
        except BudgetError:
            continue
        if name == "checkmate" and other.solver.get("status") != "optimal":
            continue
        assert e <= other.report.energy_j * (1 + REL) + MIP_GAP * e, (
            f"POET ({poet.name}, solver {poet.solver}) {e} J > {name} {other.report.energy_j} J")


# -- 3. one memory model for the MILP and the validator -------------------------------------------------------
@PROPS
@given(spec=specs(), percent=fractions, target=targets)
def test_milp_and_validator_share_one_memory_model(spec, percent, target):
    c = case_of(spec, target)
    heuristics = candidates(c.g, c.lv, paging=True)
    greedy = dtr(c.g, c.lv, c.budget(percent))  # DTR's choices depend on the budget it was given
    if greedy is not None:
        heuristics["dtr"] = greedy
    reports = {name: replay(c, d, None) for name, d in heuristics.items()}  # all correct; only budgets differ
    # The drawn budget, and the budgets exactly at and one byte below each heuristic's peak: the memory rows
    # must be exact, not merely close.
    budgets = {c.budget(percent)} | {b for r in reports.values() for b in (r.peak_bytes, r.peak_bytes - 1)
                                     if b >= c.smallest}
    for budget in sorted(budgets):
        poet = build_poet(c.g, c.lv, c.target, budget)
        checkmate = build_poet(c.g, c.lv, c.target, budget, paging=False)  # the same rows, without paging
        for name, d in heuristics.items():
            rep = reports[name]
            within = rep.peak_bytes <= budget
            for model in (poet, checkmate) if not d.page_out else (poet,):
                x = model.vector(d)
                assert set(model.vector(model.decisions(x, c.lv)).nonzero()[0]) == set(x.nonzero()[0]), name
                assert model.milp.is_feasible(x) == within, (
                    f"{name}: validator peak {rep.peak_bytes} B (stage {rep.peak_stage}) vs budget {budget} B, "
                    f"but the MILP says feasible={model.milp.is_feasible(x)}")
                if within:
                    assert rel_close(model.milp.objective(x), rep.energy_j), (name, model.milp.objective(x),
                                                                               rep.energy_j)
            if within:
                replay(c, d, budget)


@PROPS
@given(spec=specs())
def test_min_budget_is_attained_by_paging_everything(spec):
    c = case_of(spec)
    rep = replay(c, page_all(c.g, c.lv, retain=False), c.smallest)
    assert rep.peak_bytes == c.smallest
    assert c.smallest <= c.store_all.peak_bytes
    # The MILP agrees that this schedule meets the smallest budget, at the validator's energy.
    model = build_poet(c.g, c.lv, c.target, c.smallest)
    x = model.vector(page_all(c.g, c.lv, retain=False))
    assert model.milp.is_feasible(x)
    assert rel_close(model.milp.objective(x), rep.energy_j)


def test_the_random_graphs_write_outputs_over_dying_operands():
    """The properties above hold with in-place execution counted only if the graphs have it: every family's
    fixed seeds give marks (activation backwards, gradient sums; on the microcontroller batch norm's backward)."""
    ops: dict[str, set[str]] = {"rpi4": set(), "mkr1000": set()}
    for family in FAMILIES:
        for target, seen in ops.items():
            marked = [n.op for seed in range(4) for n in case_of(spec_from_seed(family, seed), target).g.nodes
                      if n.into]
            assert marked, (family, target)
            seen.update(marked)
    assert {"aten.threshold_backward.default", "aten.hardtanh_backward.default", "aten.add.Tensor"} <= ops["rpi4"]
    assert "aten.native_batch_norm_backward.default" in ops["mkr1000"] - ops["rpi4"]


# -- 4. below the smallest budget: a BudgetError that names it ------------------------------------------------
@PROPS
@given(spec=specs(), permille=st.integers(0, 500))
def test_below_min_budget_raises_naming_it(spec, permille):
    c = case_of(spec)
    budget = c.smallest - 1 - c.smallest * permille // 1000  # from 1 byte to half of min_budget below it
    for name in SCHEDULERS:
        with pytest.raises(BudgetError) as e:
            run_scheduler(c.g, c.lv, c.target, budget, scheduler=name, time_limit=TIME_LIMIT)
        assert re.search(rf"(?<!\d){c.smallest}(?!\d)", str(e.value)), str(e.value)


# -- 5. deadlines -------------------------------------------------------------------------------------------
@PROPS
@given(spec=specs(), percent=fractions, factor=st.floats(1.0, 1.5), target=targets)
def test_poet_meets_deadline(spec, percent, factor, target):
    c = case_of(spec, target)
    # The drawn budget and the smallest one (where paging or recomputing is forced, and time is short).
    for budget in sorted({c.budget(percent), c.smallest}):
        # The drawn deadline, and the deadlines exactly at the fastest and the slowest time of a heuristic that fits
        # the budget (within 1.5x store-all): there, a deadline row that forgets some paging time lets an
        # over-time schedule through.
        heuristic_times = sorted(r.time_s for r in (replay(c, d, None) for d in candidates(c.g, c.lv, True).values())
                                 if r.peak_bytes <= budget and r.time_s <= 1.5 * c.store_all.time_s)
        for deadline in sorted({c.store_all.time_s * factor, *heuristic_times[:1], *heuristic_times[-1:]}):
            try:
                s = run_scheduler(c.g, c.lv, c.target, budget, scheduler="poet", deadline_s=deadline,
                                  time_limit=TIME_LIMIT)
            except BudgetError as e:
                # A heuristic within budget and deadline is a schedule; store-all takes exactly the base time.
                assert not any(t <= deadline for t in heuristic_times), (deadline, heuristic_times)
                assert c.store_all.peak_bytes > budget
                assert "deadline" in str(e), f"not an infeasibility verdict: {e}"
            else:
                rep = validate(c.g, s.steps, c.target, budget)
                assert rep.peak_bytes <= budget
                assert rep.time_s <= deadline * (1 + REL), (rep.time_s, deadline)
                assert s.report.time_s <= deadline * (1 + REL)
            # The MILP's own answer (not only what run_scheduler keeps of it) meets the deadline as the
            # validator counts time: the deadline row must count what the validator counts, within tolerances.
            model = build_poet(c.g, c.lv, c.target, budget, deadline)
            res = solve_with("auto", model.milp, time_limit=TIME_LIMIT, mip_gap=MIP_GAP)
            if res.values is not None:
                rep = replay(c, model.decisions(res.values, c.lv), budget)
                assert rep.time_s <= deadline * (1 + REL), (
                    f"the MILP's schedule takes {rep.time_s} s, over the deadline {deadline} s")


# -- 6. no useless page-outs ----------------------------------------------------------------------------------
def _paged_out_never_in(steps) -> set[str]:
    return {s.tensor for s in steps if s.action == "page_out"} - {s.tensor for s in steps if s.action == "page_in"}


@PROPS
@given(spec=specs(), percent=fractions, target=targets)
def test_no_schedule_pages_out_a_tensor_it_never_pages_in(spec, percent, target):
    """A page-out costs time and energy; one whose tensor never comes back buys nothing. No scheduler emits one:
    not the heuristics (every candidate, built without the validator), not run_scheduler's kept schedule, and
    not the MILP's own answer at a loose gap (an early incumbent, where the objective alone let them through)."""
    c = case_of(spec, target)
    budget = c.budget(percent)
    for name, d in candidates(c.g, c.lv, paging=True).items():
        assert not _paged_out_never_in(build_steps(c.g, c.lv, d)), name
        assert d.page_out == {i for pins in d.page_in.values() for i in pins}, name
    for name in SCHEDULERS:
        try:
            s = run_scheduler(c.g, c.lv, c.target, budget, scheduler=name, time_limit=TIME_LIMIT)
        except BudgetError:
            continue
        assert not _paged_out_never_in(s.steps), (name, s.name)
    model = build_poet(c.g, c.lv, c.target, budget)
    res = solve_with("auto", model.milp, time_limit=TIME_LIMIT, mip_gap=0.5)
    if res.values is not None:
        assert not _paged_out_never_in(build_steps(c.g, c.lv, model.decisions(res.values, c.lv)))


@PROPS
@given(spec=specs(), target=targets)
def test_a_solution_with_a_useless_page_out_loses_it(spec, target):
    """A MILP solution may carry a page-out of a tensor it never pages in (the objective charges it, but only
    up to the solver's gap): it is feasible, and the decisions drawn from it drop it, at lower energy."""
    c = case_of(spec, target)
    model = build_poet(c.g, c.lv, c.target, c.store_all.peak_bytes)
    x = model.vector(store_all(c.g, c.lv))
    for j in model.PO.values():
        x[j] = 1.0  # everything paged out, nothing paged in
    assert model.milp.is_feasible(x)
    assert model.useless_page_outs(x, c.lv) == set(model.PO)
    d = model.decisions(x, c.lv)
    assert not d.page_out and not _paged_out_never_in(build_steps(c.g, c.lv, d))
    assert replay(c, d, None).energy_j < model.milp.objective(x) or not model.PO
    assert not model.useless_page_outs(without_redundant_holds(model, c.lv, x), c.lv)


# -- 7. overlapped paging keeps the memory model ------------------------------------------------------------
def _stages_of(steps, action: str) -> dict[tuple[str, int], int]:
    """(tensor, its n-th step of `action`) -> stage."""
    seen: dict[str, int] = {}
    out = {}
    for s in steps:
        if s.action == action:
            seen[s.tensor] = seen.get(s.tensor, 0) + 1
            out[s.tensor, seen[s.tensor]] = s.stage
    return out


@PROPS
@given(spec=specs(), percent=fractions, target=targets)
def test_overlapped_paging_keeps_peak_energy_and_time(spec, percent, target):
    """Reading page-ins ahead and writing paged-out tensors behind (the Python plans' schedules) changes only
    where page-ins start and frees happen: each tensor's steps in the same order, page-ins only earlier, frees
    only later, and the strict validator gives the same peak, energy and time, within the budget; a tighter
    limit is never exceeded by a stage that was within it."""
    c = case_of(spec, target)
    budget = c.budget(percent)
    options = dict(candidates(c.g, c.lv, paging=True))
    try:
        options["kept"] = run_scheduler(c.g, c.lv, c.target, budget, time_limit=TIME_LIMIT).decisions
    except BudgetError:
        pass
    for name, d in options.items():
        steps = build_steps(c.g, c.lv, d)
        before = validate(c.g, steps, c.target, None)
        for limit in (None, before.peak_bytes - 1):
            out = overlap_paging(c.g, steps, c.target, limit)
            after = validate(c.g, out, c.target, None, strict=True)
            assert after.peak_bytes == before.peak_bytes, name
            assert rel_close(after.energy_j, before.energy_j) and rel_close(after.time_s, before.time_s), name
            cap = before.peak_bytes if limit is None else limit
            assert all(a <= max(b, cap) for a, b in zip(after.stage_peaks, before.stage_peaks)), name
            order = lambda ss: {t: [x.action for x in ss if x.tensor == t]  # noqa: E731
                                for t in {x.tensor for x in ss}}
            assert order(out) == order(steps), name
            assert sorted((x.action, x.tensor) for x in out) == sorted((x.action, x.tensor) for x in steps), name
            for action, sign in (("page_in", -1), ("free", 1)):
                was, now = _stages_of(steps, action), _stages_of(out, action)
                assert was.keys() == now.keys() and all(sign * (now[k] - was[k]) >= 0 for k in was), name
            assert [x for x in out if x.action not in ("page_in", "free")] == \
                [x for x in steps if x.action not in ("page_in", "free")], name
        if before.peak_bytes <= budget:
            validate(c.g, overlap_paging(c.g, steps, c.target), c.target, budget, strict=True)


# -- regressions: the smallest examples the properties above found ---------------------------------------------
# conv -> max-pool -> max-pool -> conv -> dropout -> linear, batch 1, 4x4 (found by the deadline property).
MAXPOOL_CHAIN = {"family": "chain", "batch": 1, "input": [1, 4, 4],
                 "blocks": [{"kind": "chain", "layers": [
                     {"op": "conv", "cout": 6, "k": 1, "s": 1, "p": 0, "groups": 1, "bias": False},
                     {"op": "maxpool", "k": 1, "s": 1, "p": 0}, {"op": "maxpool", "k": 1, "s": 1, "p": 0},
                     {"op": "conv", "cout": 3, "k": 1, "s": 1, "p": 0, "groups": 1, "bias": False}]}],
                 "head": {"dropout": 0.2, "hidden": 0, "classes": 3, "features": 48}}


def test_recomputed_maxpool_workspace_is_budgeted():
    """A recompute of maxpool_argmax holds its scratch (the pooled values) while it runs; the validator counts it,
    so POET's memory rows must too, or the MILP picks schedules the validator rejects (ValidationError)."""
    c = case_of(MAXPOOL_CHAIN)
    assert c.smallest < c.store_all.peak_bytes
    failures = []
    for budget in range(c.smallest, c.store_all.peak_bytes + 1, 24):
        try:
            s = run_scheduler(c.g, c.lv, c.target, budget, time_limit=TIME_LIMIT)
        except ValidationError as e:
            failures.append((budget, str(e)))
            continue
        assert validate(c.g, s.steps, c.target, budget).peak_bytes <= budget
    assert not failures, f"{len(failures)} budgets fail, e.g. {failures[0]}"


# relu -> conv -> conv -> max-pool -> linear -> relu -> linear, batch 4, 8x12 (found by property 1).
DTR_CHAIN = {"family": "chain", "batch": 4, "input": [4, 8, 12], "blocks": [{"kind": "chain", "layers": [
    {"op": "relu", "inplace": False},
    {"op": "conv", "cout": 1, "k": 2, "s": 1, "p": 1, "groups": 1, "bias": True},
    {"op": "conv", "cout": 1, "k": 2, "s": 1, "p": 1, "groups": 1, "bias": False},
    {"op": "maxpool", "k": 2, "s": 1, "p": 1}]}],
    "head": {"dropout": 0.0, "hidden": 8, "classes": 7, "features": 165, "flatcat": []}}


def test_dtr_counts_recompute_workspace():
    """DTR's eviction ledger must count the max-pool scratch of a recompute too: without it, the schedule DTR
    returns as fitting exceeds the budget in the validator, and `--scheduler dtr` fails with BudgetError."""
    c = case_of(DTR_CHAIN)
    budget = c.budget(70)
    d = dtr(c.g, c.lv, budget)
    assert d is None or fits(c, d, budget), replay(c, d, None).peak_bytes


# A cat block of two strided convs and a pool after a batch-norm stem, on a Jetson (found by property 2).
WARM_START_CAT = {"family": "cat", "batch": 4, "input": [1, 7, 6], "blocks": [
    {"kind": "chain", "layers": [{"op": "bn"}]},
    {"kind": "cat", "branches": [
        [{"op": "conv", "cout": 7, "k": 3, "s": 2, "p": 1, "groups": 1, "bias": True}],
        [{"op": "avgpool", "k": 3, "s": 2, "p": 1}],
        [{"op": "conv", "cout": 6, "k": 3, "s": 2, "p": 1, "groups": 1, "bias": True},
         {"op": "relu", "inplace": True}]],
     "post": [{"op": "relu", "inplace": True}]}],
    "head": {"dropout": 0.0, "hidden": 0, "classes": 9, "features": 168, "flatcat": []}}


def test_optimal_poet_schedule_is_the_solvers_optimum():
    """Warm-started, highspy 1.16 can report the optimum's status and bound but hand back the warm start's values;
    taken as they come, the kept "milp" schedule is the heuristic's, worse than Checkmate's although POET's
    feasible set holds Checkmate's."""
    c = case_of(WARM_START_CAT, "jetson-nano")
    budget = c.budget(60)
    poet = run_scheduler(c.g, c.lv, c.target, budget, time_limit=TIME_LIMIT)
    checkmate = run_scheduler(c.g, c.lv, c.target, budget, scheduler="checkmate", time_limit=TIME_LIMIT)
    assert checkmate.solver["status"] == "optimal"
    if poet.solver.get("status") == "optimal":
        assert poet.solver["gap"] is None or poet.solver["gap"] <= MIP_GAP, poet.solver
    assert poet.report.energy_j <= checkmate.report.energy_j * (1 + MIP_GAP), (
        poet.name, poet.solver, poet.report.energy_j, checkmate.report.energy_j)


# max-pool(1, stride 2) -> residual(conv | conv + BN) -> linear, batch 1, 4x4, on a Jetson (found by property 5 with
# 1 channel; 4 since batch norm's backward reads the running statistics from the buffers, and 8 classes since the
# convolutions' kernel scratch peaks with 2: with either, store-all is then the smallest budget and the deadline
# has nothing to exclude).
DEADLINE_RES = {"family": "residual", "batch": 1, "input": [1, 4, 4], "blocks": [
    {"kind": "chain", "layers": [{"op": "maxpool", "k": 1, "s": 2, "p": 0}]},
    {"kind": "residual",
     "main": [{"op": "conv", "cout": 4, "k": 1, "s": 1, "p": 0, "groups": 1, "bias": False}],
     "short": [{"op": "conv", "cout": 4, "k": 1, "s": 1, "p": 0, "groups": 1, "bias": False}, {"op": "bn"}],
     "post": []}],
    "head": {"dropout": 0.0, "hidden": 0, "classes": 8, "features": 16, "flatcat": []}}


def test_deadline_row_survives_solver_tolerances():
    """On a Jetson a recompute takes ~1e-11 s: a deadline row in seconds is below HiGHS's feasibility tolerance
    (1e-7), so unscaled the MILP answers with a schedule over the deadline (run_scheduler raised ValidationError,
    or, dropping it, "the solver found no schedule" instead of the infeasibility)."""
    c = case_of(DEADLINE_RES, "jetson-nano")
    deadline = c.store_all.time_s  # only store-all meets it, and store-all needs more than min_budget
    assert c.store_all.peak_bytes > c.smallest
    model = build_poet(c.g, c.lv, c.target, c.smallest, deadline)
    res = solve_with("auto", model.milp, time_limit=TIME_LIMIT, mip_gap=MIP_GAP)
    assert res.values is None or replay(c, model.decisions(res.values, c.lv), None).time_s <= deadline * (1 + REL)
    with pytest.raises(BudgetError, match="deadline"):
        run_scheduler(c.g, c.lv, c.target, c.smallest, deadline_s=deadline, time_limit=TIME_LIMIT)


# -- end to end: compile, run 2 steps, check against autograd --------------------------------------------------
# Each model is compiled twice and run: by POET at min_budget + 10% of the gap to store-all (which must recompute
# or page: only store-all holds everything, and it does not fit), and by Chen's checkpointing at its own peak,
# which recomputes whole segments whatever the cost model says, so the ops named here are recomputed for sure
# (batch-norm: running statistics must not update twice; dropout: the same mask; max-pool: the same argmax).
# chain-14: conv, BN, pools. residual-43: BN'd conv branches, dropout, max-pool, residual adds (seed 36's
#   store-all became its smallest budget once convolutions' kernel scratch was counted).
# cat-23: branches with convs, BN, dropout and pools joined by torch.cat, three cat levels.
# cat-1: conv/BN branches beside identities, and a head that flattens branches of different strides and joins them
#   with torch.cat (each branch's gradient is a narrow view of the 2-d gradient, reshaped to 4-d).
BN, DROPOUT, MAXPOOL = ("aten._native_batch_norm_legit_functional.default", "aten.native_dropout.default",
                        "aten.max_pool2d_with_indices.default")
ADD, CAT = "aten.add.Tensor", "aten.cat.default"
E2E = [("chain", 14, "rpi4", {BN, MAXPOOL}),
       ("residual", 43, "jetson-nano", {ADD, BN, DROPOUT, MAXPOOL}),
       ("cat", 23, "rpi4", {CAT, BN, DROPOUT, MAXPOOL}),
       ("cat", 1, "jetson-nano", {DROPOUT, MAXPOOL})]


def _compile_and_run(opts: CompileOptions, budget: int) -> tuple[dict, dict, set[str]]:
    opts.budget = str(budget)
    c = compile_model(opts)
    assert c["budget_bytes"] == budget and c["peak_bytes"] <= budget
    body = json.loads(open(os.path.join(opts.out, "schedule.json")).read())
    op_of = {n["name"]: n["op"] for n in body["graph"]["nodes"]}
    recomputed = {op_of[s["tensor"]] for s in body["steps"] if s["action"] == "recompute"}
    r = run_plan(opts.out, steps=2, check=True)
    assert r["ok"], r.get("error")
    assert r["measured_peak_bytes"] == r["predicted_peak_bytes"] == c["peak_bytes"] <= budget
    assert r["losses"] == pytest.approx(r["reference_losses"], rel=1e-5)
    return c, r, recomputed


@pytest.mark.parametrize("family,seed,target,recomputed", E2E, ids=[f"{f}-{s}-{t}" for f, s, t, _ in E2E])
def test_random_model_end_to_end(tmp_path, family, seed, target, recomputed):
    spec = spec_from_seed(family, seed)
    tg = load_target(target)
    opts = CompileOptions(model=f"{MODEL_GEN}:random_model", model_kwargs={"family": family, "seed": seed},
                          target=target, budget="100%", out=str(tmp_path / "poet"), batch_size=spec["batch"],
                          time_limit=TIME_LIMIT)
    _, _, g = build_graph(opts, tg)
    lv = analyze(g)
    smallest = min_budget(lv)
    sa_peak = validate(g, build_steps(g, lv, store_all(g, lv)), tg, None).peak_bytes
    assert family != "cat" or sum(n.op == CAT for n in g.nodes) >= 2
    assert sa_peak > smallest, "the model leaves no room between min_budget and store-all; pick another seed"

    c, _, _ = _compile_and_run(opts, smallest + (sa_peak - smallest) // 10)
    assert c["min_feasible_bytes"] == smallest and c["store_all_peak_bytes"] == sa_peak
    assert c["peak_bytes"] >= smallest
    assert c["recomputes"] + c["page_ins"] > 0, "below store-all's peak a schedule must recompute or page"

    cp_peak = validate(g, build_steps(g, lv, checkpoint(g, lv)), tg, None).peak_bytes
    opts.scheduler, opts.out = "checkpoint", str(tmp_path / "checkpoint")
    c, _, ops = _compile_and_run(opts, cp_peak)
    assert c["peak_bytes"] == cp_peak
    assert recomputed <= ops, f"checkpointing recomputes {sorted(ops)}, expected {sorted(recomputed)}"
