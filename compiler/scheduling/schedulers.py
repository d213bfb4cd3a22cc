"""Schedulers: the heuristics of `heuristics.py` and the MILPs (POET; Checkmate = POET without paging).

All return `Scheduled`.

Every schedule goes through the validator before it is returned; a failure is an error, never a warning.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from .steps import Decisions, Step, build_steps
from .budget import min_budget
from .bound import bound_text
from .heuristics import candidates, checkpoint, dtr, paging_only, store_all
from edgetrain.compiler.errors import BudgetError, InternalError, Interrupted, OverBudgetError, ValidationError
from edgetrain.compiler.graph.ir import TrainingGraph
from edgetrain.compiler.graph.liveness import Liveness
from .phased import solve_phased
from .milp.registry import solve_with
from .poet import build as build_poet, without_redundant_holds
from .block_solve import block_solve, tied_columns
from .repeats import choose as choose_repeats, groups as tied_groups
from .clock import clamp, reserve, stopped
from .validator import Report, validate
from .warmstart import best_start

SOLVE_SHARE = 0.5  # the least share of --time-limit the scheduler, then its MILP, gets whatever came before
START_SHARE = 0.15  # the most share of a solve's time limit the greedy starts may take (counted inside it)
BLOCK_SHARE = 0.5  # the share of the solve's time the tied blocks' sub-problem takes first (block_solve.py)
TIED_SHARE = 0.25  # the same for the tied starts of the repeated-block restriction (one validation a group)

# Every scheduler, with what it does in a line (the CLI's help reads it).
SCHEDULERS = {
    "poet": "recompute and paging, the POET MILP",
    "checkmate": "recompute only, the same MILP without paging",
    "paging": "page out everything backward reads, Capuchin-like",
    "dtr": "greedy eviction under the budget, DTR-like",
    "checkpoint": "Chen's sqrt(n) checkpoints",
    "store-all": "plain backprop",
}
_MILPS = {"poet": True, "checkmate": False}  # scheduler -> paging allowed
REPEATS = ("auto", "flat", "reuse")  # how the MILP treats repeated blocks (repeats.choose)


@dataclass
class Scheduled:
    name: str  # the scheduler, or for poet the schedule actually kept ("milp" or a heuristic's name)
    decisions: Decisions
    steps: list[Step]
    report: Report
    solver: dict


def _finish(g, lv, name, d, target, budget, solver) -> Scheduled:
    steps = build_steps(g, lv, d)
    report = validate(g, steps, target, budget, strict=True)
    return Scheduled(name=name, decisions=d, steps=steps, report=report, solver=solver)


def _heuristic(g, lv, scheduler: str, target, budget_bytes: int, deadline_s: float | None) -> Scheduled:
    none = {"name": "none", "status": "not run", "gap": None, "seconds": 0.0}
    if scheduler == "dtr":
        d = dtr(g, lv, budget_bytes)
        if d is None:
            raise BudgetError(f"the DTR-like greedy eviction finds no schedule within {budget_bytes} B (it cannot "
                              "page, and greedy eviction is not optimal); use --scheduler poet or a larger budget.")
        options = [d]
    elif scheduler == "paging":
        options = [paging_only(g, lv, retain=True), paging_only(g, lv, retain=False)]
    else:
        options = [store_all(g, lv) if scheduler == "store-all" else checkpoint(g, lv)]
    err = None
    for d in options:
        try:
            s = _finish(g, lv, scheduler, d, target, budget_bytes, none)
        except OverBudgetError as e:
            err = e
            continue
        except ValidationError as e:
            raise InternalError(f"the {scheduler} schedule it built breaks the memory model", e) from e
        if deadline_s is not None and s.report.time_s > deadline_s * (1 + 1e-9):
            raise BudgetError(f"the {scheduler} schedule takes {s.report.time_s:.6g} s, over the deadline of "
                              f"{deadline_s:.6g} s; use --scheduler poet or relax --deadline.")
        return s
    peak = min(_finish(g, lv, scheduler, d, target, None, none).report.peak_bytes for d in options)
    raise BudgetError(f"the {scheduler} schedule needs {peak} B, above the budget of {budget_bytes} B "
                      f"({err}). Use --scheduler poet, or a budget of at least {peak}B.")


def run_scheduler(g: TrainingGraph, lv: Liveness, target, budget_bytes: int, *, scheduler: str = "poet",
                  deadline_s: float | None = None, time_limit: float = 60.0, mip_gap: float = 1e-4,
                  solver: str = "auto", threads: int | None = None, lns: float = 0.0,
                  cuts: float = 0.0, repeats: str = "auto",
                  say: Callable[[str], None] | None = None) -> Scheduled:
    """`lns`: the share of `time_limit` given to large-neighbourhood search when the first 20% of the time
    does not prove the gap (see phased.solve_phased); 0 solves once, for the whole time limit. `cuts` (with `lns`):
    the most share of it spent adding window and memory cuts before the last solve (see phased.solve_phased).
    `repeats` (REPEATS): `reuse` solves a restriction of the MILP in which identical repeated blocks share their
    decisions (repeats.py); `auto` does where the flat model is large. `say`: progress lines. Stopped by Ctrl-C
    (interrupt.py), the best schedule found so far is kept."""
    if scheduler not in SCHEDULERS:
        raise ValueError(f"unknown scheduler {scheduler!r}; choose one of {', '.join(SCHEDULERS)}")
    paging = _MILPS.get(scheduler, True)
    requested = time_limit
    reserve(SOLVE_SHARE * time_limit)  # a long trace does not leave the solve a second (clock.py)
    time_limit = clamp(time_limit)  # what the compile's --time-limit leaves: the shares below are of it
    smallest = min_budget(lv)
    if budget_bytes < smallest:
        raise BudgetError(
            f"budget {budget_bytes} B is below the smallest feasible budget for this model and batch: "
            f"{smallest} B ({smallest / 1e6:.3f} MB), of which {lv.state_bytes} B is parameters, optimizer "
            f"state and buffers. Raise --budget to at least {smallest}B or lower --batch-size. "
            f"{bound_text(g, lv)}"
        )
    base_time = sum(n.time_s for n in g.nodes)
    if deadline_s is not None and deadline_s < base_time * (1 - 1e-12):
        raise BudgetError(f"deadline {deadline_s:.6g} s is below the time of computing every node once "
                          f"({base_time:.6g} s on this target); no schedule can meet it.")
    if scheduler not in _MILPS:
        return _heuristic(g, lv, scheduler, target, budget_bytes, deadline_s)
    none = {"name": "none", "status": "not run", "gap": None, "seconds": 0.0}

    fitting: list[Scheduled] = []
    options = candidates(g, lv, paging)
    greedy = dtr(g, lv, budget_bytes)  # budget-aware, so often the best start when the others do not fit
    if greedy is not None:
        options["dtr"] = greedy
    # Pages too, where DTR cannot; several drop orders (see warmstart.best_start), inside the time limit.
    kept, starts = best_start(g, lv, target, budget_bytes, paging=paging, retain=True,
                              seconds=START_SHARE * time_limit)
    if kept is not None:
        options["greedy-keep"] = kept.decisions
    broken: dict[str, str] = {}  # heuristics whose schedule the validator refused for anything but the budget
    for name, d in options.items():
        try:
            s = _finish(g, lv, name, d, target, budget_bytes, none)
        except OverBudgetError:
            continue
        except ValidationError as e:
            broken[name] = str(e)  # a bug in that heuristic: the others and the solve go on without it
            continue
        if deadline_s is None or s.report.time_s <= deadline_s * (1 + 1e-9):
            fitting.append(s)
    best = min(fitting, key=lambda s: s.report.energy_j, default=None)
    shape = choose_repeats(g, lv, repeats)
    tied_starts = None
    if shape is not None and (best is None or best.name != "store-all"):
        # The starts above decide per tensor, so none is a point of the restricted model (identical blocks share
        # its variables); this one decides per group of tied tensors.
        tied, tied_starts = best_start(g, lv, target, budget_bytes, paging=paging, retain=True,
                                       seconds=TIED_SHARE * time_limit, groups=tied_groups(lv, shape))
        if tied is not None:
            try:
                s = _finish(g, lv, "tied-greedy", tied.decisions, target, budget_bytes, none)
            except ValidationError as e:  # the greedy validated it within the budget already: a bug in it
                broken["tied-greedy"] = str(e)
            else:
                if deadline_s is None or s.report.time_s <= deadline_s * (1 + 1e-9):
                    fitting.append(s)
                    best = min(fitting, key=lambda s: s.report.energy_j)
    if best is not None and best.name == "store-all":
        # Nothing is recomputed or paged: the energy equals its lower bound, no solve is needed.
        best.solver = {"name": "none", "status": "optimal", "objective": best.report.energy_j,
                       "bound": best.report.energy_j, "gap": 0.0, "seconds": 0.0,
                       "note": "store-all fits the budget; its energy is the lower bound"}
        best.name = "store-all"
        return best
    model = build_poet(g, lv, target, budget_bytes, deadline_s, paging=paging, repeats=shape)
    # The cheapest schedule that is a point of the model starts it: the heuristic and the MILP must share one
    # memory model, so never a bad start. Under the restriction that is the tied start, unless another heuristic's
    # schedule happens to be tied.
    warm, warm_name = None, None
    for s in sorted((s for s in fitting if s is best or s.name == "tied-greedy"), key=lambda s: s.report.energy_j):
        x = model.vector(s.decisions)
        if model.milp.is_feasible(x):
            warm, warm_name = x, s.name
            break
    spent = starts["seconds"] + (tied_starts["seconds"] if tied_starts else 0.0)
    left = max(time_limit - spent, 0.5 * time_limit)  # the starts' time counts in the limit
    # The heuristics' schedules, validated stage by stage, and the MILP's build take minutes on a large graph: the
    # MILP still gets its share.
    reserve(SOLVE_SHARE * requested)
    if say is not None:
        say(f"MILP: {model.milp.n_vars} variables, {model.milp.n_rows} constraints, up to {clamp(left):.0f} s "
            "(Ctrl-C stops it and keeps the best schedule found)")
    block = None
    if shape is not None and shape.tie and warm is not None:
        # The tied blocks' sub-problem first, at the memory the rest of the start leaves: on a large model HiGHS
        # reaches its root where the whole restricted model's is out of reach (block_solve.py).
        block = block_solve(solver, model, shape, warm, BLOCK_SHARE * left, mip_gap=mip_gap, threads=threads)
        left = max(left - block.seconds, 1.0)
        if (block.values is not None and model.milp.is_feasible(block.values)
                and model.milp.objective(block.values) < model.milp.objective(warm)):
            warm = np.round(block.values)
    if lns > 0:
        res = solve_phased(solver, model, lv, time_limit=left, mip_gap=mip_gap, warm_start=warm,
                           threads=threads, lns=lns, cuts=cuts)
    else:
        res = solve_with(solver, model.milp, time_limit=left, warm_start=warm, mip_gap=mip_gap,
                         threads=threads)
    if block is not None and (res.values is None or model.milp.objective(res.values) > model.milp.objective(warm)):
        # The whole solve found no better than the block's: its incumbent, against the whole solve's bound.
        objective = model.milp.objective(warm)
        gap = None if res.bound is None else max(0.0, (objective - res.bound) / max(abs(objective), 1e-12))
        res = replace(res, values=warm, objective=objective, gap=gap,
                      status="feasible" if res.status in ("infeasible", "error") else res.status)
    info = res.to_json()  # the backend that ran, the one requested, and after a fallback a one-line notice
    info["warm_start"] = warm_name
    if block is not None:
        info["block_solve"] = {"status": block.status, "objective": block.objective, "bound": block.bound,
                               "seconds": round(block.seconds, 3), "variables": int(tied_columns(model, shape).sum())}
    if shape is not None:  # what the restriction was: its schedules are the flat model's, its optimum may not be
        info["repeats"] = shape.to_json()
    info["greedy_starts"] = {k: (round(v, 3) if k == "seconds" else v) for k, v in starts.items()}
    if tied_starts is not None:
        info["tied_starts"] = {k: (round(v, 3) if k == "seconds" else v) for k, v in tied_starts.items()}
    chosen = None
    if res.values is not None:
        # A time-limited incumbent may page in or recompute a tensor already held (then its page-out is never
        # used): dropped from the schedule (see poet.without_redundant_holds), and its objective drops too.
        x = without_redundant_holds(model, lv, res.values)
        changed = int(np.sum(x != np.round(res.values)))
        if changed:
            info["objective"] = model.milp.objective(x)
            if info.get("bound") is not None and info["objective"]:
                info["gap"] = max(0.0, (info["objective"] - info["bound"]) / abs(info["objective"]))
            info["note"] = (f"dropped {changed} page-ins, recomputes or page-outs the solution does not need "
                            "(within the solver's gap)")
        try:
            chosen = _finish(g, lv, "milp", model.decisions(x, lv), target, budget_bytes, info)
        except ValidationError as e:  # the MILP and the validator disagree: a bug; a heuristic's schedule may do
            if best is None:
                raise InternalError("the solver's schedule breaks the memory model", e) from e
            info["note"] = f"the solver's schedule was refused by the validator ({e}), an edgetrain bug; not kept"
            chosen = None
        if chosen is not None and deadline_s is not None and chosen.report.time_s > deadline_s * (1 + 1e-9):
            # Within the solver's tolerances but over the deadline as the validator counts it: not kept.
            info["note"] = (f"the solver's schedule takes {chosen.report.time_s:.6g} s, over the deadline "
                            f"{deadline_s:.6g} s by less than its tolerance; not kept")
            chosen = None
    if best is not None and (chosen is None or best.report.energy_j < chosen.report.energy_j - 1e-15):
        best.solver = info
        chosen = best
    if broken and chosen is not None:
        chosen.solver["broken_heuristics"] = broken  # kept in the output: what to report
    if chosen is None and stopped():
        raise Interrupted(f"the solve was stopped (Ctrl-C) after {res.seconds:.1f} s, before it found a schedule "
                          f"within {budget_bytes} B")
    if chosen is None and broken and res.status != "infeasible":
        name, why = next(iter(broken.items()))
        raise InternalError(f"the {name} schedule it built breaks the memory model and the solver found none", why)
    if chosen is None:
        if res.status == "infeasible" and not paging:
            raise BudgetError(f"no recompute-only (Checkmate) schedule fits {budget_bytes} B; the input batch "
                              f"cannot be recomputed. With paging (--scheduler poet) the smallest feasible budget "
                              f"is {smallest} B.")
        if res.status == "infeasible":
            raise BudgetError(
                f"no schedule meets budget {budget_bytes} B with deadline {deadline_s} s "
                f"(the smallest budget without a deadline is {smallest} B; the fastest schedule, store-all, "
                f"takes {base_time:.6g} s). Raise the budget or relax --deadline.")
        raise BudgetError(f"the solver found no schedule within {time_limit} s ({res.status}); "
                          "raise --time-limit or the budget.")
    return chosen
