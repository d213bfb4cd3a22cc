"""The compile pipeline: model -> training DAG -> schedule -> validated schedule file -> generated plan."""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field

import torch

from edgetrain.runtime.python.threads import PLAN_THREADS

from .errors import BudgetError, DeviceFitError, OutputDirError, UnsupportedModelError
from .output_dir import StagedOutput
from .frontend.labels import example_labels
from .frontend.modelspec import resolve
from .graph.costs import apply_costs
from .graph.ir import EMITS, OptimizerConfig
from .graph.liveness import analyze
from .graph.paging_profile import with_measured_paging
from .graph.workspace import applies as scratch_applies, scratch_threads
from .schedule_file import format as schedule_format
from .scheduling.budget import anchors, parse_budget, parse_deadline
from .scheduling.overlap import overlap_paging
from .scheduling.schedulers import Scheduled, run_scheduler
from .scheduling.validator import validate


FRAGMENTATION_RETRIES = 3  # solves for less when the C arena's packing leaves gaps over the budget


@dataclass
class CompileOptions:
    model: str
    target: str
    budget: str
    out: str
    scheduler: str = "poet"
    deadline: str | None = None
    batch_size: int = 8
    input_shape: tuple[int, ...] | None = None
    time_limit: float = 60.0
    solver: str = "auto"  # MILP backend: auto (Gurobi with a full license, else HiGHS), highs, gurobi, scipy, cpsat
    loss: str = "cross_entropy"
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    seed: int = 0
    model_kwargs: dict = field(default_factory=dict)
    emit: str = "python"  # the runtime the plan is generated for: "python" (torch) or "c" (runtime/c firmware)
    lns: float = 0.0  # share of time_limit for neighbourhood search when its first 20% does not prove the gap
    cuts: float = 0.0  # most share of time_limit for window and memory cuts before the last solve (with lns)
    overlap_paging: bool = True  # Python plans: read ahead, write behind, within the peak (scheduling/overlap.py)
    train: str | None = None  # `--train`: which parameters train (compiler/frontend/train_select.py); None: the model's flags


def prepare_out_dir(path: str) -> None:
    """Fail before any solving if the output directory cannot be written."""
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, ".edgetrain-write-test")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise OutputDirError(f"cannot write to output directory {path!r}: {e.strerror or e}. "
                             "Choose another --out or fix its permissions.") from None


def build_graph(opts: CompileOptions, target, device_check: bool = True):
    """Resolve, trace and lower the model; annotate costs for the target. Returns (resolved, model, graph)."""
    torch.manual_seed(opts.seed)  # zoo models initialize deterministically from the seed
    resolved = resolve(opts.model, **opts.model_kwargs)
    shape = opts.input_shape or resolved.input_shape
    if not shape:
        raise UnsupportedModelError(f"the input shape of {opts.model!r} is unknown; pass --input-shape C,H,W")
    model = resolved.module.train()
    if opts.train is not None:
        from .frontend.train_select import select_and_apply

        select_and_apply(model, opts.train)
    if opts.emit == "c" and device_check:
        from edgetrain.codegen.c.device_fit import check_model_fits

        check_model_fits(model, target, opts.optimizer, opts.model)  # a model whose weights alone overflow fails before tracing
    check_batch_size(opts.batch_size, shape, resolved.input_dtype, target)
    gen = torch.Generator().manual_seed(opts.seed)
    if resolved.input_dtype == "int64":  # token ids
        example = torch.randint(0, resolved.input_high, (opts.batch_size, *shape), generator=gen)
    else:
        example = torch.randn(opts.batch_size, *shape, generator=gen)
    graph = capture_graph(opts, resolved, model, example,
                          scratch_threads(target) if scratch_applies(target) else 0, gpu=target.gpu)
    if opts.emit == "c":
        from .graph.c_lower import lower_for_c

        graph = lower_for_c(graph)
        if device_check:
            graph = stream_beyond_flash(graph, target)
    measured = None
    if getattr(target, "measured", False):
        from .graph.profiler import profile_nodes

        measured = profile_nodes(graph, threads=scratch_threads(target))
    apply_costs(graph, target, measured)
    return resolved, model, graph


def check_batch_size(batch_size: int, shape, input_dtype: str, target) -> None:
    """A batch whose inputs alone outgrow the target's RAM cannot train there: refused before an example of it
    is made (which would ask the compiling machine for as much)."""
    per_example = (8 if input_dtype == "int64" else 4) * math.prod(shape)
    if batch_size * per_example > target.ram_bytes:
        raise BudgetError(f"--batch-size {batch_size}: one batch of inputs of shape {list(shape)} takes "
                          f"{batch_size * per_example} B, more than {target.name}'s {target.ram_bytes} B of RAM; "
                          f"use at most --batch-size {max(1, target.ram_bytes // per_example)}")


def _stream_figures(graph, target) -> tuple[dict[str, int], int, int]:
    """The frozen weights (name -> bytes), the flash left for them and the RAM left for one paged in."""
    from edgetrain.codegen.c.device_fit import device_budget, flash_room_for_frozen

    trained = set(graph.trainable_params)
    frozen = {p: s.bytes for p, s in graph.params.items() if p not in trained}
    tb = sum(s.bytes for p, s in graph.params.items() if p in trained)
    # Code estimated at 3 steps a node (each computed, freed, sometimes recomputed); the built image is checked.
    return (frozen, flash_room_for_frozen(target, tb, 3 * len(graph.nodes)),
            device_budget(target, io_bytes(graph)) - graph.state_bytes)


def stream_beyond_flash(graph, target):
    """A microcontroller graph whose frozen weights overflow the flash: the largest streamed from storage."""
    from edgetrain.codegen.c.device_fit import applies

    if not applies(target) or target.flash_bytes is None or len(graph.trainable_params) == len(graph.params):
        return graph
    from .graph.streaming import choose_streamed, stream_weights

    frozen, room, ram_room = _stream_figures(graph, target)
    return stream_weights(graph, choose_streamed(frozen, room, ram_room, target.storage_bytes, target.name))


def restream_by_milp(opts: CompileOptions, graph, target, budget_bytes: int, progress=None):
    """The graph with the frozen weights in storage that the POET MILP chooses (the rule's choice when the MILP
    finds none); and what was chosen, by which, for the output."""
    from .graph.streaming import stream_weights, unstream
    from .scheduling.stream_choice import choose_streamed

    rule = list(graph.streamed_params)
    plain = unstream(graph)
    apply_costs(plain, target)
    frozen, room, ram_room = _stream_figures(plain, target)
    candidates = {p: b for p, b in frozen.items() if b <= ram_room}
    if progress:
        progress(f"choosing which of {len(candidates)} frozen weights to stream from storage")
    chosen, solver = choose_streamed(plain, target, budget_bytes, candidates, sum(frozen.values()) - room, rule,
                                     time_limit=opts.time_limit, solver=opts.solver)
    info = {"rule": rule, "milp": chosen, "solver_status": solver["free"].get("status"),
            "objective_j": solver["free"].get("objective"),
            "rule_objective_j": solver.get("proposed", solver["free"]).get("objective")}
    if chosen is None or set(chosen) == set(rule):
        return graph, info
    out = stream_weights(plain, chosen)
    apply_costs(out, target)
    return out, info


def capture_graph(opts: CompileOptions, resolved, model, example: torch.Tensor, threads: int = PLAN_THREADS,
                  gpu: bool = False):
    """The training graph from torch's joint forward-backward graph of one step; kernel scratch counted for
    `threads` intra-op threads (0: none); `gpu`: of kernels a CUDA device runs (a Jetson's plan)."""
    from .frontend.capture import capture, load_loss
    from .graph.joint import build_graph as joint_graph

    builtin = opts.loss in ("cross_entropy", "mse", "model")
    user_fn = None if builtin else load_loss(opts.loss)
    kind = opts.loss if builtin else "cross_entropy"  # a user's loss takes class labels
    labels = example_labels(kind, opts.seed, resolved, model, example)  # the class count from the model's output
    cap = capture(model, example, labels.example, loss=kind, token_ids=resolved.input_dtype == "int64", user_fn=user_fn,
                  gpu=gpu)
    for name, value in cap.constants.items():  # tensors torch lifted out of the code: buffers of the plan
        model.register_buffer(name, value.detach().clone())
    return joint_graph(cap, opts.model, tuple(example.shape), labels.num_classes, opts.loss, opts.optimizer,
                       input_dtype=resolved.input_dtype, input_high=resolved.input_high, seed_keys=cap.seed_keys,
                       widen_fusion=opts.emit != "c",  # microcontroller graphs are small: every byte counts
                       scratch_threads=threads)


def compile_model(opts: CompileOptions, progress=None) -> dict:
    from edgetrain.targets import load_target

    budget = parse_budget(opts.budget)
    if opts.emit not in EMITS:  # an unknown --emit fails before any work
        raise UnsupportedModelError(f"unknown --emit {opts.emit!r}; choose one of {', '.join(EMITS)}")
    target = load_target(opts.target)
    with StagedOutput(opts.out) as stage:  # the previous output stays whole until the new one is complete
        rep, result, graph, lv, anchor, sa, budget_bytes, deadline_s, resolved, firmware, extra = _compile_into(
            opts, target, budget, str(stage.path), progress, stage)
        stage.commit()
    out = {
        "out": opts.out, "model": resolved.spec, "target": target.name, "scheduler": opts.scheduler,
        "schedule": result.name, "nodes": len(graph.nodes), "budget_bytes": budget_bytes,
        "min_feasible_bytes": anchor.min_feasible_bytes, "peak_bytes": rep.peak_bytes, "energy_j": rep.energy_j,
        "time_s": rep.time_s, "deadline_s": deadline_s, "recomputes": rep.recomputes, "page_ins": rep.page_ins,
        "page_outs": rep.page_outs, "store_all_peak_bytes": sa.peak_bytes, "store_all_energy_j": sa.energy_j,
        "store_all_time_s": sa.time_s, "state_bytes": lv.state_bytes, "fixed_bytes": lv.fixed_bytes,
        "activation_peak_bytes": anchor.activation_peak_bytes, "budget": budget.text,
        "solver": {k: result.solver.get(k) for k in ("name", "requested", "notice", "status", "gap", "seconds",
                                                     "objective", "bound", "variables", "constraints")},
        "emit": opts.emit,
        "threads": scratch_threads(target),  # the CPU threads the plan trains with, its kernel scratch counted for
    }
    if firmware is not None:
        out["arena_bytes"] = firmware["arena_bytes"]
        out["paged_bytes_per_step"] = firmware["paged_bytes_per_step"]
        out["pages"] = len(firmware["pages"])
        out["streamed"] = [w["param"] for w in firmware["streamed"]]
        out["streamed_bytes"] = firmware["streamed_bytes"]
    out.update(extra)
    return out


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


def all_trainable_anchors(opts: CompileOptions, target):
    """The anchors of the same model with every parameter trained: what a `--train` selection is held against.
    A second capture and the store-all replay; no solve."""
    import dataclasses

    _, _, full = build_graph(dataclasses.replace(opts, train="all"), target, device_check=False)
    return anchors(full, analyze(full), target)


def io_bytes(graph) -> int:
    """The batch buffers a firmware's driver keeps besides the arena: the input, the labels and the logits."""
    loss = graph.nodes[graph.loss_stage]
    first = loss.inputs[0].name if loss.inputs else None
    return sum(n.bytes for n in graph.nodes if n.kind in ("input", "labels") or n.name == first)


def _device_budget(opts: CompileOptions, budget, graph, target, anchor) -> int:
    """`--budget auto`: the target's RAM less the firmware's own needs; refused when training cannot fit it."""
    from edgetrain.codegen.c.device_fit import device_budget, runtime_reserve_bytes

    io = io_bytes(graph)
    room = device_budget(target, io)
    budget_bytes = budget.resolve(anchor, room)
    if anchor.min_feasible_bytes > budget_bytes:
        raise DeviceFitError(
            f"{opts.model} needs at least {anchor.min_feasible_bytes} B to train (its smallest feasible budget: "
            f"{anchor.fixed_bytes} B of weights, optimizer state and buffers, then what the largest backward step "
            f"reads), but {target.name}'s {target.ram_bytes} B of RAM leave {budget_bytes} B after the stack, the "
            f"runtime and the batch buffers ({runtime_reserve_bytes(io)} B). Freeze more with --train, use a "
            "smaller --batch-size or a smaller model")
    return budget_bytes


def _overlapped(graph, result: Scheduled, target, budget_bytes: int) -> Scheduled:
    """`result` with its paging overlapped with compute, revalidated (its peak, energy and time stay as they were)."""
    import dataclasses

    steps = overlap_paging(graph, result.steps, target)
    return dataclasses.replace(result, steps=steps, report=validate(graph, steps, target, budget_bytes, strict=True))


def _compile_into(opts: CompileOptions, target, budget, work: str, progress, stage):
    """Trace, solve and write every output into the staging folder `work`."""
    from edgetrain.codegen import render_python_plan, write_weights
    from edgetrain.runtime.python.integrity import weights_table

    resolved, model, graph = build_graph(opts, target)
    target = with_measured_paging(target, graph)  # a measured target's page store, timed at this plan's sizes
    lv = analyze(graph)
    anchor = anchors(graph, lv, target)
    sa = anchor.store_all
    budget_bytes = _device_budget(opts, budget, graph, target, anchor) if budget.device else budget.resolve(anchor)
    extra: dict = {"train": opts.train, **selection_summary(graph), "all_trainable": None}
    if graph.streamed_params and opts.scheduler == "poet":  # the MILP decides what the rule proposed
        graph, extra["streaming"] = restream_by_milp(opts, graph, target, budget_bytes, progress)
        lv = analyze(graph)
        anchor = anchors(graph, lv, target)
        sa = anchor.store_all
    if opts.train is not None and extra["trainable_tensors"] < extra["param_tensors"]:
        if progress:
            progress("capturing the all-trainable graph for comparison")
        full = all_trainable_anchors(opts, target)
        extra["all_trainable"] = {"min_feasible_bytes": full.min_feasible_bytes,
                                  "store_all_peak_bytes": full.store_all.peak_bytes, "fixed_bytes": full.fixed_bytes}
    deadline_s = parse_deadline(opts.deadline, sa.time_s)
    solve_budget = budget_bytes
    for attempt in range(FRAGMENTATION_RETRIES + 1):
        if progress:
            progress(f"solving {len(graph.nodes)} stages, {len(lv.decision)} decision tensors"
                     + (f" for {solve_budget} B (the arena's fragmentation)" if solve_budget != budget_bytes else ""))
        result = run_scheduler(graph, lv, target, solve_budget, scheduler=opts.scheduler, deadline_s=deadline_s,
                               time_limit=opts.time_limit, solver=opts.solver, lns=opts.lns, cuts=opts.cuts)
        if opts.emit != "c" and opts.overlap_paging:  # the C runtime pages synchronously: overlap would only hold RAM
            result = _overlapped(graph, result, target, solve_budget)
        rep = result.report
        body = schedule_format.backprop_body(
            spec=resolved.spec, kwargs=resolved.kwargs, graph=graph, target=target, budget_text=budget.text,
            budget_bytes=budget_bytes, anchor=anchor, decision_tensors=len(lv.decision),
            deadline_s=deadline_s, scheduled=result, scheduler=opts.scheduler, seed=opts.seed, backend=opts.emit)
        if opts.train is not None:  # the selection as given; graph.trainable holds what it chose
            body["model"]["train"] = opts.train
        firmware = None
        if opts.emit != "c":
            render_python_plan(json.loads(schedule_format.dumps(body)), work)
            write_weights(dict(model.named_parameters()), dict(model.named_buffers()), work)
            break
        from edgetrain.codegen.c import ArenaOverflowError, render_c_firmware

        # Weights first: the C initializers are read from them.
        write_weights(dict(model.named_parameters()), dict(model.named_buffers()), work)
        checked = json.loads(schedule_format.dumps(body))  # exactly what schedule.json will hold
        try:
            firmware = render_c_firmware(checked, work)
        except ArenaOverflowError as e:
            # The arena packs with gaps the schedule does not see: solve again for that much less.
            tighter = min(solve_budget, rep.peak_bytes) - e.excess_bytes
            if attempt == FRAGMENTATION_RETRIES or tighter < anchor.min_feasible_bytes:
                raise
            solve_budget = tighter
            continue
        from edgetrain.codegen.c.device_fit import applies, check_fit, figures_of_firmware

        if applies(target):  # arena, weights and buffers against the device's RAM and flash
            extra["device_fit"] = check_fit(figures_of_firmware(checked, firmware), target).to_json()
        break
    # The schedule last: it records the sha256 of every file above and the weights' table.
    body["outputs"] = stage.outputs(weights_table(os.path.join(work, "weights.safetensors")))
    schedule_format.save(body, work)
    return rep, result, graph, lv, anchor, sa, budget_bytes, deadline_s, resolved, firmware, extra
