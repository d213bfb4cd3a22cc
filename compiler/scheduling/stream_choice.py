"""Which frozen weights stay in flash and which are streamed from storage, chosen by the POET MILP.

The fixed rule (compiler/graph/streaming.py: largest first) ignores what a streamed weight costs: a page-in
per reader, so a weight read by its forward and its input-gradient backward costs twice one read by its
forward alone, and the RAM it takes while read competes with the activations kept at that stage. Here every
candidate weight gets a binary "in storage" in the same MILP as the recompute and paging decisions (poet.build
with `stream`), which charges each reader's page-in and workspace and asks that the weights left in flash fit
it; the schedule itself is then solved on the graph that streams the chosen weights.

The rule's choice is the default and the MILP only tries to improve on it, within STREAM_SHARE of the time the
compile has left, its build included: on a large graph the build alone takes minutes, so a model whose size
says it cannot be built in that share is not built at all (`skipped`).
"""
from __future__ import annotations

import time

from edgetrain.compiler.graph.ir import TrainingGraph
from edgetrain.compiler.graph.liveness import analyze

from .clock import clamp
from .milp.registry import solve_with
from .poet import build as build_poet
from .repeats import choose as choose_repeats

STREAM_SHARE = 0.25  # of the time the compile has left: the whole choice, the model's build and its solves
BUILD_SHARE = 0.5  # of that share, the most the model's build may be expected to take
MIN_SOLVE_S = 1.0  # a solve given less than this is not started
CELLS_PER_S = 10_000.0  # stages x decision tensors built a second (a 2-core x86-64 VM: 11k-26k on the 7B slices)


def choice_seconds(time_limit: float) -> float:
    """The seconds the whole choice may take: its share of what the compile's --time-limit leaves."""
    return STREAM_SHARE * clamp(time_limit)


def build_seconds(g: TrainingGraph, decision_tensors: int) -> float:
    """The expected seconds to build the MILP with streaming: linear in stages x decision tensors."""
    return len(g.nodes) * decision_tensors / CELLS_PER_S


def choose_streamed(g: TrainingGraph, target, budget_bytes: int, candidates: dict[str, int], need_bytes: int,
                    proposed: list[str], *, deadline_s: float | None = None, time_limit: float = 60.0,
                    solver: str = "auto") -> tuple[list[str] | None, dict]:
    """The candidates (name -> bytes) the MILP keeps in storage on graph `g` (no weight streamed yet), at least
    `need_bytes` of them: `proposed` (the rule's) unless another choice costs less energy; None when the MILP
    finds no solution at all or is not tried. Also the report: the solves' (`free`, `proposed`), `seconds` the
    choice took of its `share`, and `skipped` (why the MILP was not tried) or None."""
    began = time.perf_counter()
    share = choice_seconds(time_limit)
    lv = analyze(g)
    expected = build_seconds(g, len(lv.decision))
    report: dict = {"share_s": share, "expected_build_s": expected, "skipped": None}

    def done(chosen, **solves):
        return chosen, {**report, **solves, "seconds": time.perf_counter() - began}

    if expected > BUILD_SHARE * share:
        report["skipped"] = (f"a model of {len(g.nodes)} stages x {len(lv.decision)} decision tensors takes about "
                             f"{expected:.0f} s to build, more than half of the choice's {share:.1f} s")
        return done(None, free={"status": "not run"})
    shape = choose_repeats(g, lv, "auto")  # repeated decoder layers: the flat model would not fit in memory
    model = build_poet(g, lv, target, budget_bytes, deadline_s, stream=candidates, stream_need=need_bytes,
                       repeats=shape)
    report["build_s"] = time.perf_counter() - began
    rest = share - report["build_s"]
    if rest / 2 < MIN_SOLVE_S:
        report["skipped"] = f"its build took {report['build_s']:.0f} s of the choice's {share:.1f} s"
        return done(None, free={"status": "not run"})
    # The free solve gets half of what is left, the rule's (if needed) the rest; the schedule's solve comes after.
    res = solve_with(solver, model.milp, time_limit=max(rest / 2, 0.0))
    if res.values is None:
        return done(None, free=res.to_json())
    chosen = [w for w, j in model.F.items() if res.values[j] > 0.5]
    if set(chosen) == set(proposed) or not set(proposed) <= set(model.F):
        return done(chosen, free=res.to_json())
    for w, j in model.F.items():  # the same model with the rule's choice fixed, the rest of the schedule optimal
        model.milp.lower[j] = model.milp.upper[j] = float(w in proposed)
    ref = solve_with(solver, model.milp, time_limit=max(share - (time.perf_counter() - began), 0.0))
    if ref.values is not None and res.objective >= ref.objective * (1 - 1e-9):
        return done(list(proposed), free=res.to_json(), proposed=ref.to_json())  # no cheaper: the rule's, on ties too
    return done(chosen, free=res.to_json(), proposed=ref.to_json())
