"""Which frozen weights stay in flash and which are streamed from storage, chosen by the POET MILP.

The fixed rule (compiler/graph/streaming.py: largest first) ignores what a streamed weight costs: a page-in
per reader, so a weight read by its forward and its input-gradient backward costs twice one read by its
forward alone, and the RAM it takes while read competes with the activations kept at that stage. Here every
candidate weight gets a binary "in storage" in the same MILP as the recompute and paging decisions (poet.build
with `stream`), which charges each reader's page-in and workspace and asks that the weights left in flash fit
it; the schedule itself is then solved on the graph that streams the chosen weights.
"""
from __future__ import annotations

from edgetrain.compiler.graph.ir import TrainingGraph
from edgetrain.compiler.graph.liveness import analyze

from .clock import clamp
from .milp.registry import solve_with

STREAM_SHARE = 0.25  # of the time the compile has left, for each of the two streaming solves
from .poet import build as build_poet
from .repeats import choose as choose_repeats


def choose_streamed(g: TrainingGraph, target, budget_bytes: int, candidates: dict[str, int], need_bytes: int,
                    proposed: list[str], *, deadline_s: float | None = None, time_limit: float = 60.0,
                    solver: str = "auto") -> tuple[list[str] | None, dict]:
    """The candidates (name -> bytes) the MILP keeps in storage on graph `g` (no weight streamed yet), at least
    `need_bytes` of them: `proposed` (the rule's) unless another choice costs less energy; None when the MILP
    finds no solution at all. Also the solver's reports."""
    lv = analyze(g)
    time_limit = STREAM_SHARE * clamp(time_limit)  # each of its two solves: the schedule's solve comes after them
    shape = choose_repeats(g, lv, "auto")  # repeated decoder layers: the flat model would not fit in memory
    model = build_poet(g, lv, target, budget_bytes, deadline_s, stream=candidates, stream_need=need_bytes,
                       repeats=shape)
    res = solve_with(solver, model.milp, time_limit=time_limit)
    if res.values is None:
        return None, {"free": res.to_json()}
    chosen = [w for w, j in model.F.items() if res.values[j] > 0.5]
    if set(chosen) == set(proposed) or not set(proposed) <= set(model.F):
        return chosen, {"free": res.to_json()}
    fixed = build_poet(g, lv, target, budget_bytes, deadline_s, stream=candidates, stream_need=need_bytes,
                       repeats=shape)
    for w, j in fixed.F.items():  # the rule's choice, the rest of the schedule optimal for it
        fixed.milp.lower[j] = fixed.milp.upper[j] = float(w in proposed)
    ref = solve_with(solver, fixed.milp, time_limit=time_limit)
    report = {"free": res.to_json(), "proposed": ref.to_json()}
    if ref.values is not None and res.objective >= ref.objective * (1 - 1e-9):
        return list(proposed), report  # no cheaper than the rule's: keep the rule's, deterministic on ties
    return chosen, report
