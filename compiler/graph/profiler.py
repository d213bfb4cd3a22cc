"""Measure each node of a training graph on the machine that compiles it: the costs of the `host` target.

The graph is walked in execution order with the runtime's own op call, so every operand is a real tensor of
the right shape and dtype: max-pool indices come from a real argmax, a batch-norm backward gets the aux (saved
mean and inverse std) of a real forward, labels are in range. A walk is a whole store-all step, made `warmup`
untimed and `repeats` timed times, so each op is timed where a step runs it: among the step's live tensors, its
outputs in freshly allocated memory, and with the frees that follow it (what it drops, the operands it reads
last); an op repeated at once on the same operands reuses the memory it just freed, and ran 1.5-4x faster
than inside a step. A node's cost is the minimum of its timed runs (the least a
busy machine adds; a median carries other processes' load into the plan) plus the runtime's own cost per plan
step (`op_overhead_s`: the executor's bookkeeping around an op and the free that follows it, which dominates
small models). torch runs with `threads` intra-op threads while profiling (the runtime's `PLAN_THREADS` by
default, the count its Trainer runs a host plan with), then gets its own setting back. A node that completes
a parameter's gradient includes its optimizer update, as it runs on the device. Tensors are dropped after
their last reader, so profiling holds about what a store-all step holds.
"""
from __future__ import annotations

import os
import tempfile
import time

import torch

from edgetrain.compiler.errors import EdgetrainError
from edgetrain.runtime.python.threads import PLAN_THREADS, pinned_threads
from .ir import TrainingGraph

_MIN_S = 1e-9  # a time is never zero: the solver would treat the node as free


def _state(graph: TrainingGraph, gen: torch.Generator):
    params = {k: torch.randn(s.shape, generator=gen) * 0.1 for k, s in graph.params.items()}
    buffers = {}
    for k, s in graph.buffers.items():
        make = torch.ones if k.endswith("running_var") else torch.zeros
        buffers[k] = make(s.shape, dtype=getattr(torch, s.dtype))
    return params, buffers


def _batch(graph: TrainingGraph, node, gen: torch.Generator) -> torch.Tensor:
    if node.kind == "labels" and node.dtype == "int64":
        return torch.randint(0, max(1, graph.num_classes), node.shape, generator=gen, dtype=torch.int64)
    if node.dtype == "int64":  # token ids
        return torch.randint(0, max(1, graph.input_high or 1), node.shape, generator=gen, dtype=torch.int64)
    return torch.randn(node.shape, generator=gen, dtype=getattr(torch, node.dtype))


def _labels(graph: TrainingGraph, node, gen: torch.Generator) -> torch.Tensor:
    if node.dtype.startswith("float"):
        return torch.randn(node.shape, generator=gen)
    high = max(1, graph.num_classes or graph.input_high or 1)
    return torch.randint(0, high, node.shape, generator=gen, dtype=getattr(torch, node.dtype))


def op_overhead_s(samples: int = 300) -> float:
    """Seconds the runtime spends per plan step around its op: a compute of a one-element ReLU and its free
    through `Runtime`, less the op called directly; the minimum of `samples` of each."""
    from safetensors.torch import save_file

    from edgetrain.runtime.python import aten_call
    from edgetrain.runtime.python.executor import Runtime

    x, relu = torch.zeros(1), {"args": [{"$t": 0}]}
    with tempfile.TemporaryDirectory(prefix="edgetrain-overhead-") as tmp:
        weights = os.path.join(tmp, "w.safetensors")
        save_file({"param/w": torch.zeros(1)}, weights)
        rt = Runtime(weights, os.path.join(tmp, "pages"), device="cpu", lr=0.0, momentum=0.0, weight_decay=0.0)
        rt.begin_step(x, torch.zeros(1, dtype=torch.int64))
        rt.load_input()
        through, direct = [], []
        for _ in range(samples):
            start = time.perf_counter()
            rt.compute("r", "aten.relu.default", ["input"], attrs=relu)
            rt.free("r")
            mid = time.perf_counter()
            with torch.no_grad():
                aten_call.call("aten.relu.default", relu, [x], {}, {}, None, x.device, 0, 0)
            direct.append(time.perf_counter() - mid)
            through.append(mid - start)
        rt.free("input")
        rt.end_step()
    return max(min(through) - min(direct), 0.0)


def _last_use(graph: TrainingGraph) -> dict[str, int]:
    last: dict[str, int] = {}
    for t, n in enumerate(graph.nodes):
        for r in n.inputs:
            last[r.name] = t
        if n.aux_of:
            last[f"{n.aux_of}.aux"] = t
    return last


def _walk(graph: TrainingGraph, state, last_use: dict[str, int], gen: torch.Generator, seed: int,
          samples: dict[str, list[float]] | None) -> None:
    """One store-all step through the graph in order, each op timed where it runs (appended to `samples`)."""
    from edgetrain.runtime.python import aten_call

    params, buffers, optim = state
    values: dict[str, object] = {}
    cpu = torch.device("cpu")
    for t, n in enumerate(graph.nodes):
        if n.kind in ("input", "labels"):
            values[n.name] = (_batch if n.kind == "input" else _labels)(graph, n, gen)
            continue
        try:
            ins = [aten_call.apply_view(values[r.name], r.view) for r in n.inputs]
        except KeyError as e:
            raise EdgetrainError(f"profiler: node '{n.name}' reads '{e.args[0]}' before it is computed") from None
        aux = values.get(f"{n.aux_of}.aux") if n.aux_of else None
        start = time.perf_counter()
        outs = aten_call.call(n.op, n.attrs, ins, params, buffers, aux, cpu, seed, 0)
        kept = aten_call.held(outs, n.attrs.get("keep"))
        fused = aten_call.fused_calls(n.attrs, ins, params, buffers, aux, cpu, seed, 0, kept)
        for res, sub in [(outs, n.attrs), *fused]:
            for u in sub.get("updates", ()):
                if "param" in u:
                    optim.update(u["param"], params[u["param"]], aten_call.update_value(res, u))
        if kept is not None:
            values[n.name] = kept
        if n.attrs.get("aux"):
            values[f"{n.name}.aux"] = tuple(outs[k] for k in n.attrs["aux"])
        # Returning memory costs time too (large blocks go back to the system): the outputs the step drops and
        # the operands read for the last time are freed inside the timed span, as the runtime frees them.
        del outs, kept, fused, ins, aux
        for r in {r.name for r in n.inputs} | ({f"{n.aux_of}.aux"} if n.aux_of else set()):
            if last_use.get(r) == t:
                values.pop(r, None)
        if samples is not None:
            samples[n.name].append(time.perf_counter() - start)


def _profile_aten(graph: TrainingGraph, repeats: int, seed: int, warmup: int, overhead: float) -> dict[str, float]:
    """Each node of a graph captured from torch, run by the runtime's own op call and optimizer: `warmup` untimed
    walks through the whole graph, then `repeats` timed ones, a node's time the minimum of its timed runs."""
    from edgetrain.runtime.python.optim import Optimizer

    gen = torch.Generator().manual_seed(seed)
    params, buffers = _state(graph, gen)
    state = (params, buffers, Optimizer(graph.optimizer.to_json(), params, graph.trainable_params))
    last_use = _last_use(graph)
    samples: dict[str, list[float]] = {n.name: [] for n in graph.nodes if n.kind not in ("input", "labels")}
    with torch.no_grad():
        for walk in range(warmup + repeats):
            _walk(graph, state, last_use, gen, seed, samples if walk >= warmup else None)
    return {k: max(min(v) + overhead, _MIN_S) for k, v in samples.items()}


def profile_nodes(graph: TrainingGraph, repeats: int = 5, seed: int = 0, *, warmup: int = 2,
                  threads: int = PLAN_THREADS, overhead_s: float | None = None) -> dict[str, float]:
    """Seconds of each compute node of `graph` (input and labels are not computed, so not listed): the
    minimum of `repeats` timed runs after `warmup` untimed ones, with `threads` intra-op threads, plus the
    runtime's per-step overhead (`op_overhead_s()` unless given)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    if not any(n.op.startswith("aten.") for n in graph.nodes):
        raise EdgetrainError("a measured target times the Python runtime's ops; this graph is for the C runtime "
                             "(--emit c): compile it for a device target, whose costs come from its profile")
    with pinned_threads(threads):
        overhead = op_overhead_s() if overhead_s is None else overhead_s
        return _profile_aten(graph, repeats, seed, warmup, overhead)
