"""The compile driver: model -> training DAG -> schedule -> validated schedule file -> generated plan.

The work is the passes of compiler/passes.py, in order; this module parses what can fail before any of it
(the budget, the backend, the target), stages the output and reports the result.
"""
from __future__ import annotations

import os

from edgetrain.codegen.backends import backend_for
from edgetrain.runtime.python.fused_kernels import FUSED_OP

from .errors import EdgetrainError, OutputDirError
from .graph.tiling import tiled_prefixes
from .graph.workspace import scratch_threads
from .model_graph import trace_model
from .output_dir import StagedOutput
from .passes import run_passes, selection_summary
from .scheduling.budget import check_budget_size, parse_budget
from .scheduling.clock import deadline
from .stages import Compiled, CompileOptions, Request

SHORT_SOLVE = 0.25  # a solve given less than this share of --time-limit is said to be short

__all__ = ["CompileOptions", "build_graph", "compile_model", "prepare_out_dir", "selection_summary"]


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
    """The model's costed training graph for `opts.emit`'s backend on `target`: (resolved, model, graph)."""
    t = trace_model(opts, target, backend_for(opts.emit), device_check)
    return t.resolved, t.model, t.graph


def compile_model(opts: CompileOptions, progress=None) -> dict:
    from edgetrain.targets import load_target

    budget = parse_budget(opts.budget)
    backend = backend_for(opts.emit)  # an unknown --emit fails before any work
    if opts.fuse and not backend.generates_kernels:
        raise EdgetrainError(f"--fuse generates kernels with torch's inductor, for the Python runtime; --emit "
                             f"{opts.emit} plans run every op as written: drop --fuse")
    if opts.quantize_frozen is not None and not backend.runs_int8_prefix:  # before any tracing
        raise EdgetrainError(f"--quantize-frozen {opts.quantize_frozen}: the {backend.name} "
                             "runtime has no int8 kernels; compile with --emit c or --emit python, or drop the flag")
    check_int8_biases(opts, backend)
    target = load_target(opts.target)
    check_budget_size(budget, target)  # `--budget 100GB` fails before tracing
    with StagedOutput(opts.out) as stage, deadline(opts.time_limit):  # the old output stays whole until the end
        req = Request(opts, budget, target, backend, stage, progress)
        done = run_passes(req)
        stage.commit()
    return summary(req, done)


def check_int8_biases(opts: CompileOptions, backend) -> None:
    """`--int8-biases` needs an int8 prefix and C firmware (the only runtime with its integer backward): said
    before any tracing."""
    if not opts.int8_biases:
        return
    if opts.quantize_frozen is None:
        raise EdgetrainError("--int8-biases trains the biases of an int8 backbone's last blocks: give --quantize-frozen "
                             "int8 too (with --emit c), or drop the flag")
    if not backend.runs_int8_biases:
        raise EdgetrainError(f"--int8-biases: the {backend.name} runtime has no integer backward; compile with "
                             "--emit c, or drop the flag")


def summary(req: Request, done: Compiled) -> dict:
    """compile's result: what was solved, its figures, and the backend's."""
    opts = req.opts
    r = done.rendered
    s = r.selected
    p = s.placed
    m = p.budgeted.measured
    rep, sa, anchor, target = r.result.report, p.anchor.store_all, p.anchor, m.target
    out = {
        "out": opts.out, "model": m.traced.resolved.spec, "target": target.name, "scheduler": opts.scheduler,
        "schedule": r.result.name, "nodes": len(p.graph.nodes), "budget_bytes": p.budgeted.budget_bytes,
        "min_feasible_bytes": anchor.min_feasible_bytes, "peak_bytes": rep.peak_bytes, "energy_j": rep.energy_j,
        "time_s": rep.time_s, "deadline_s": r.deadline_s, "recomputes": rep.recomputes, "page_ins": rep.page_ins,
        "page_outs": rep.page_outs, "store_all_peak_bytes": sa.peak_bytes, "store_all_energy_j": sa.energy_j,
        "store_all_time_s": sa.time_s, "state_bytes": p.liveness.state_bytes, "fixed_bytes": p.liveness.fixed_bytes,
        "activation_peak_bytes": anchor.activation_peak_bytes, "budget": req.budget.text,
        "solver": {k: r.result.solver.get(k) for k in ("name", "requested", "notice", "status", "gap", "seconds",
                                                       "objective", "bound", "variables", "constraints", "repeats")},
        "interrupted": r.result.solver.get("status") == "interrupted",  # Ctrl-C: the best schedule found by then
        "emit": opts.emit,
        "fused_kernels": sum(n.op == FUSED_OP for n in p.graph.nodes),  # --fuse: chains run as generated kernels
        "fused_ops": sum("op" in s for n in p.graph.nodes if n.op == FUSED_OP for s in n.attrs["chain"]),
        # of which batch norms (with their activations) that recompute from their held statistics
        "held_norms": sum(n.op == FUSED_OP and "recompute" in n.attrs for n in p.graph.nodes),
        "memory_format": p.graph.memory_format,  # --fuse on a convolutional model: channels_last
        "threads": scratch_threads(target),  # the CPU threads the plan trains with, its kernel scratch counted for
    }
    if p.graph.input_dtype == "int64" and rep.time_s:  # token ids: a language model's throughput
        tokens = 1
        for d in p.graph.input_shape:
            tokens *= d
        out["tokens_per_step"], out["tokens_per_s"] = tokens, tokens / rep.time_s
    out["phases"] = {k: round(v, 2) for k, v in req.phases.items()}
    solved = r.result.solver.get("seconds") or 0.0
    if r.result.solver.get("status") == "time_limit" and solved < SHORT_SOLVE * opts.time_limit:
        before = sum(v for k, v in req.phases.items() if k != "solve_and_render" and k != "write_schedule")
        out["time_limit_notice"] = (
            f"the solver had {solved:.1f} s of --time-limit {opts.time_limit:g} s: tracing, costing and the budget's "
            f"anchors took {before:.1f} s first (the limit bounds the compile; the solve gets at least half of it); "
            "raise --time-limit for a longer solve")
    out.update(r.output.summary)
    out.update(s.selection)
    if p.streaming is not None:
        out["streaming"] = p.streaming
    if m.traced.int8 is not None:
        out["int8_prefix"] = m.traced.int8
    tiled = tiled_prefixes(p.graph)
    if tiled:
        out["tiled"] = tiled
    if r.output.device_fit is not None:
        out["device_fit"] = r.output.device_fit
    return out
