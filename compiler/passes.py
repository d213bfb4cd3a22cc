"""The compile pipeline as an ordered list of passes, each from one stage result to the next (stages.py).

    trace (Request -> Traced) -> measure_paging (-> Measured) -> tile_to_fit (-> Measured)
    -> stream_to_fit (-> Measured)
    -> resolve_budget (-> Budgeted)
    -> place_weights (-> Placed) -> compare_selection (-> Selected) -> solve_and_render (-> Rendered)
    -> write_schedule (-> Compiled)

The backend (codegen/backend.py) answers every question that depends on the runtime the plan is for; no
pass asks which backend it holds.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time

from edgetrain.runtime.python.integrity import weights_table

from .errors import ArenaOverflowError, DeviceFitError, UnsupportedModelError
from .graph.liveness import analyze
from .graph.paging_profile import with_measured_paging
from .graph.costs import costed
from .graph.streaming import restreamed, stream_until
from .graph.input_storage import input_in_storage, input_node, with_input_in_storage
from .graph.tiling import tile_segments
from .model_graph import trace_model
from .schedule_file import format as schedule_format
from .scheduling.bound import bound_text
from .scheduling.budget import anchors, budget_for_device, min_budget, parse_deadline
from .scheduling.interrupt import stoppable
from .scheduling.overlap import overlap_paging
from .scheduling.schedulers import Scheduled, run_scheduler
from .scheduling.validator import validate
from .stages import (Budgeted, Compiled, CompileOptions, Measured, Placed, Rendered, Request, Selected, Traced)

FRAGMENTATION_RETRIES = 3  # solves for less when a backend's arena packing leaves gaps over the budget


def trace(req: Request) -> Traced:
    """The model as the backend's costed training graph."""
    req.say(f"tracing {req.opts.model}")
    t = trace_model(req.opts, req.profile, req.backend)
    if t.head_blocks:
        req.say(t.head_blocks)
    if t.int8:
        biases = t.int8.get("int8_biases")
        what = (f"forward nodes ({t.int8['first']} .. {t.int8['last']}) in int8, {len(biases)} biases trained in "
                "int32 by QAS" if biases else f"frozen forward nodes ({t.int8['first']} .. {t.int8['last']}) in int8")
        req.say(f"{t.int8['nodes']} {what}, ranges from {t.int8['calibration']}")
    return t


def measure_paging(req: Request, t: Traced) -> Measured:
    """The target the plan is solved for: a measured target's page store timed at this plan's sizes."""
    return Measured(t, with_measured_paging(req.profile, t.graph))


def tile_to_fit(req: Request, m: Measured) -> Measured:
    """A frozen forward prefix whose working set keeps the smallest feasible budget above the bytes asked for
    (a size, or `auto`'s device RAM) computed patch by patch (graph/tiling.py), its halos' FLOPs counted; where
    the backend can, its input batch then read from storage by the patches alone (graph/input_storage.py)."""
    graph, target = m.traced.graph, m.target
    stored = with_input_in_storage if req.backend.reads_input_from_storage else (lambda g: g)

    def want_of(g):  # the bytes asked for; `auto`'s depend on the driver's buffers, the input's among them
        if req.budget.nbytes is not None:
            return req.budget.nbytes
        room = req.backend.device_room(g, target) if req.budget.device else None
        return None if room is None else room.bytes

    want, low = want_of(graph), min_budget(analyze(graph))
    if want is None or low <= want:
        return m
    segments = tile_segments(graph, lambda g: min_budget(analyze(stored(g))) <= want_of(stored(g)),
                             lambda g: min_budget(analyze(stored(g))))
    if not segments:
        return m
    for tiling in segments:
        now = min_budget(analyze(stored(tiling.graph)))
        req.say(f"computing {len(tiling.nodes)} frozen forward nodes ({tiling.nodes[0]} .. {tiling.nodes[-1]}) in "
                f"{tiling.grid}x{tiling.grid} patches: smallest budget {low} -> {now} B, "
                f"{tiling.added_flops} FLOPs of halos")
        low = now
    final = stored(segments[-1].graph)
    if input_in_storage(final):
        req.say(f"reading the input batch ({input_node(graph).bytes} B) from storage patch by patch: never whole "
                "in RAM")
    tiled = costed(final, target, m.traced.measured_s)
    return dataclasses.replace(m, traced=dataclasses.replace(m.traced, graph=tiled))


def stream_to_fit(req: Request, m: Measured) -> Measured:
    """A runtime that reads frozen weights from storage (`streams_from_storage`) whose smallest feasible budget is
    above the bytes asked for: frozen weights streamed, largest first, until it is not (graph/streaming.py)."""
    graph, target = m.traced.graph, m.target
    want = req.budget.nbytes
    if not req.backend.streams_from_storage or want is None or target.storage_bytes <= 0:
        return m
    chosen = stream_until(graph, lambda g: min_budget(analyze(g)) <= want, target.storage_bytes)
    if not chosen:
        return m
    streamed = restreamed(graph, chosen, target, m.traced.measured_s)
    req.say(f"streaming {len(chosen)} frozen weights ({sum(graph.params[p].bytes for p in chosen)} B) from storage: "
            f"smallest budget {min_budget(analyze(graph))} -> {min_budget(analyze(streamed))} B")
    return dataclasses.replace(m, traced=dataclasses.replace(m.traced, graph=streamed))


def resolve_budget(req: Request, m: Measured) -> Budgeted:
    """The budget in bytes: from the anchors, or (`auto`) what the device's RAM leaves, refused when training
    cannot fit it."""
    graph, target = m.traced.graph, m.target
    lv = analyze(graph)
    anchor = anchors(graph, lv, target)
    room = req.backend.device_room(graph, target)
    if not req.budget.device:
        budget_bytes = budget_for_device(req.budget, anchor, graph, target)  # before any solve
        if room is not None and room.linked_by is not None and budget_bytes > room.bytes:
            raise DeviceFitError(
                f"budget {req.budget.text} = {budget_bytes} B fits {target.name}'s profile, but not the firmware: "
                f"{room.linked_by}, which leaves {room.bytes} B after {room.reserved_for} ({room.reserved_bytes} B). "
                f"Give --budget {room.bytes} or less (or auto), or the profile of the chip the board is linked for as "
                "--target. Nothing was solved.")
        return Budgeted(m, lv, anchor, budget_bytes)
    if room is not None and room.bytes <= 0:
        raise DeviceFitError(
            f"{room.reserved_for} alone take {room.reserved_bytes} B, as much as {target.name}'s RAM or more "
            f"({room.bytes + room.reserved_bytes} B){f' ({room.linked_by})' if room.linked_by else ''}: nothing is "
            "left for training. Lower --batch-size or give a smaller --input-shape. Nothing was solved.")
    budget_bytes = req.budget.resolve(anchor, None if room is None else room.bytes)
    linked = f" ({room.linked_by})" if room is not None and room.linked_by else ""
    if anchor.min_feasible_bytes > budget_bytes:
        raise DeviceFitError(
            f"{req.opts.model} needs at least {anchor.min_feasible_bytes} B to train (its smallest feasible budget: "
            f"{anchor.fixed_bytes} B of weights, optimizer state and buffers, then what the largest backward step "
            f"reads), but {target.name}'s RAM{linked} leaves {budget_bytes} B after "
            f"{room.reserved_for} ({room.reserved_bytes} B). {bound_text(graph, lv)}")
    return Budgeted(m, lv, anchor, budget_for_device(req.budget, anchor, graph, target, budget_bytes))


def place_weights(req: Request, b: Budgeted) -> Placed:
    """The graph with the frozen weights in storage that the POET MILP chooses (the rule's choice when the MILP
    finds none, is too large for its share of --time-limit, or with another scheduler); what was chosen, by which
    and in how long, for the output."""
    traced, target = b.measured.traced, b.measured.target
    graph = traced.graph
    if not graph.streamed_params or req.opts.scheduler != "poet" or \
            any("stream_rows" in n.attrs for n in graph.nodes):  # weights paged by blocks: the rule's choice
        return Placed(b, graph, b.liveness, b.anchor)
    from .scheduling.stream_choice import choose_streamed

    rule = list(graph.streamed_params)
    plain = restreamed(graph, [], target, traced.measured_s)
    room = req.backend.weight_room(plain, target)
    if room is None:  # frozen weights held in memory (a Python plan): any may stream, the budget says how many
        trained, read = set(plain.trainable_params), {p for n in plain.nodes for p in n.params}
        candidates = {p: s.bytes for p, s in plain.params.items() if p not in trained and p in read and s.bytes}
        need = 0
    else:
        candidates = {p: n for p, n in room.frozen.items() if n <= room.ram_bytes}
        need = sum(room.frozen.values()) - room.flash_bytes
    req.say(f"choosing which of {len(candidates)} frozen weights to stream from storage")
    with stoppable():  # Ctrl-C stops the solves, and the compile goes on with what they found
        chosen, solver = choose_streamed(plain, target, b.budget_bytes, candidates, need, rule,
                                         time_limit=req.opts.time_limit, solver=req.opts.solver)
    kept = "milp" if chosen is not None and set(chosen) != set(rule) else "rule"
    info = {"rule": rule, "milp": chosen, "kept": kept, "solver_status": solver["free"].get("status"),
            "objective_j": solver["free"].get("objective"),
            "rule_objective_j": solver.get("proposed", solver["free"]).get("objective"),
            "seconds": round(solver["seconds"], 3), "share_s": round(solver["share_s"], 3),
            "skipped": solver["skipped"]}
    req.say(f"kept the {'MILP' if kept == 'milp' else 'rule'}'s choice of streamed weights after "
            f"{solver['seconds']:.1f} s"
            + (f" (MILP not tried: {solver['skipped']})" if solver["skipped"] else ""))
    if kept == "milp":
        graph = restreamed(plain, chosen, target, traced.measured_s)
    lv = analyze(graph)
    return Placed(b, graph, lv, anchors(graph, lv, target), info)


def compare_selection(req: Request, p: Placed) -> Selected:
    """What trains; with some parameters frozen (`--train`), the anchors of the same model with every one trained
    (a second capture and the store-all replay; no solve)."""
    selection = {"train": req.opts.train, **selection_summary(p.graph), "all_trainable": None}
    if req.opts.train is not None and selection["trainable_tensors"] < selection["param_tensors"]:
        req.say("capturing the all-trainable graph for comparison")
        try:
            full = trace_model(dataclasses.replace(req.opts, train="all"), p.budgeted.measured.target, req.backend,
                               device_check=False).graph
        except UnsupportedModelError:  # the frozen part's backward needs ops the backend lacks: no comparison
            return Selected(p, selection)
        a = anchors(full, analyze(full), p.budgeted.measured.target)
        selection["all_trainable"] = {"min_feasible_bytes": a.min_feasible_bytes,
                                      "store_all_peak_bytes": a.store_all.peak_bytes, "fixed_bytes": a.fixed_bytes}
    return Selected(p, selection)


def solve_and_render(req: Request, s: Selected) -> Rendered:
    """Solve, and have the backend write the plan; a backend whose arena packs with gaps over the budget gets a
    schedule solved for that much less (at most FRAGMENTATION_RETRIES times)."""
    p = s.placed
    opts, target, graph, budget_bytes = req.opts, p.budgeted.measured.target, p.graph, p.budgeted.budget_bytes
    deadline_s = parse_deadline(opts.deadline, p.anchor.store_all.time_s)
    solve_budget = budget_bytes
    for attempt in range(FRAGMENTATION_RETRIES + 1):
        req.say(f"solving {len(graph.nodes)} stages, {len(p.liveness.decision)} decision tensors"
                + (f" for {solve_budget} B (the arena's fragmentation)" if solve_budget != budget_bytes else ""))
        with stoppable():  # Ctrl-C stops the solve, and the compile goes on with the best schedule it found
            result = run_scheduler(graph, p.liveness, target, solve_budget, scheduler=opts.scheduler,
                                   deadline_s=deadline_s, time_limit=opts.time_limit, solver=opts.solver,
                                   lns=opts.lns, cuts=opts.cuts, repeats=opts.repeats, say=req.say)
        if req.backend.overlaps_paging and opts.overlap_paging:
            result = _overlapped(graph, result, target, solve_budget)
        body = schedule_format.backprop_body(
            spec=s.placed.budgeted.measured.traced.resolved.spec, kwargs=s.placed.budgeted.measured.traced.resolved.kwargs,
            graph=graph, target=target, budget_text=req.budget.text, budget_bytes=budget_bytes, anchor=p.anchor,
            decision_tensors=len(p.liveness.decision), deadline_s=deadline_s, scheduled=result,
            scheduler=opts.scheduler, seed=opts.seed, backend=req.backend.name)
        if opts.train is not None:  # the selection as given; graph.trainable holds what it chose
            body["model"]["train"] = opts.train
        checked = json.loads(schedule_format.dumps(body))  # exactly what schedule.json will hold
        try:
            output = req.backend.render(checked, p.budgeted.measured.traced.model, req.work, target)
        except ArenaOverflowError as e:
            # The arena packs with gaps the schedule does not see: solve again for that much less.
            tighter = min(solve_budget, result.report.peak_bytes) - e.excess_bytes
            if attempt == FRAGMENTATION_RETRIES or tighter < p.anchor.min_feasible_bytes:
                raise
            solve_budget = tighter
            continue
        return Rendered(s, body, result, deadline_s, output)
    raise AssertionError("unreachable: the last attempt returns or raises")


def write_schedule(req: Request, r: Rendered) -> Compiled:
    """The schedule last: it records the sha256 of every file above and the weights' table."""
    req.say("recording the outputs")
    r.body["outputs"] = req.stage.outputs(weights_table(os.path.join(req.work, "weights.safetensors")))
    schedule_format.save(r.body, req.work)
    return Compiled(r)


PASSES = (measure_paging, tile_to_fit, stream_to_fit, resolve_budget, place_weights, compare_selection, solve_and_render, write_schedule)


def run_passes(req: Request) -> Compiled:
    """`trace`, then every pass in order: from the model to the complete staging folder. Each pass's seconds go
    to `req.phases`: --time-limit bounds the whole compile, so what the trace takes the solve does not get."""
    began = time.perf_counter()
    result = trace(req)
    req.phases["trace"] = time.perf_counter() - began
    for step in PASSES:
        began = time.perf_counter()
        result = step(req, result)
        req.phases[step.__name__] = time.perf_counter() - began
    return result


def _overlapped(graph, result: Scheduled, target, budget_bytes: int) -> Scheduled:
    """`result` with its paging overlapped with compute, revalidated (its peak, energy and time stay as they were)."""
    steps = overlap_paging(graph, result.steps, target)
    return dataclasses.replace(result, steps=steps, report=validate(graph, steps, target, budget_bytes, strict=True))


def _numel(spec) -> int:
    n = 1
    for d in spec.shape:
        n *= d
    return n


def selection_summary(graph) -> dict:
    """What trains: parameter counts and bytes of the trainable and the frozen parameters."""
    trainable = set(graph.trainable_params)
    return {"trainable_tensors": len(trainable), "param_tensors": len(graph.params),
            "trainable_params": sum(_numel(s) for k, s in graph.params.items() if k in trainable),
            "total_params": sum(_numel(s) for s in graph.params.values()),
            "trainable_bytes": sum(s.bytes for k, s in graph.params.items() if k in trainable),
            "frozen_bytes": sum(s.bytes for k, s in graph.params.items() if k not in trainable)}
