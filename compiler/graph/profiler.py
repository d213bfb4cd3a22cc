"""Measure each node of a training graph on the machine that compiles it: the costs of the `host` target.

The graph is walked once in execution order with the runtime's own op call, so every operand is a real
tensor of the right shape and dtype: max-pool indices come from a real argmax, a batch-norm backward gets
the aux (saved mean and inverse std) of a real forward, labels are in range. Each op then runs `warmup`
untimed and `repeats` timed more times on the same operands, and the node's cost is the minimum (the least a
busy machine adds; a median carries other processes' load into the plan) plus the runtime's own cost per plan
step (`op_overhead_s`: the executor's bookkeeping around an op and the free that follows it, which dominates
small models). torch runs with `threads` intra-op threads while profiling (1 by default: a host plan's times
are for a runtime on one thread, as `benchmarks/runtime.py --threads 1` runs it), then gets its own setting
back. A node that completes a parameter's gradient includes its optimizer update, as it runs on the device.
Tensors are dropped after their last reader, so profiling holds about what a store-all step holds.
"""
from __future__ import annotations

import os
import tempfile
import time

import torch

from edgetrain.compiler.errors import EdgetrainError
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


def _profile_aten(graph: TrainingGraph, repeats: int, seed: int, warmup: int, overhead: float) -> dict[str, float]:
    """Each node of a graph captured from torch, run by the runtime's own op call and optimizer."""
    from edgetrain.runtime.python import aten_call
    from edgetrain.runtime.python.optim import Optimizer

    gen = torch.Generator().manual_seed(seed)
    params, buffers = _state(graph, gen)
    optim = Optimizer(graph.optimizer.to_json(), params, graph.trainable_params)
    last_use: dict[str, int] = {}
    for t, n in enumerate(graph.nodes):
        for r in n.inputs:
            last_use[r.name] = t
        if n.aux_of:
            last_use[f"{n.aux_of}.aux"] = t
    values: dict[str, object] = {}
    times: dict[str, float] = {}
    cpu = torch.device("cpu")
    with torch.no_grad():
        for t, n in enumerate(graph.nodes):
            if n.kind == "input":
                values[n.name] = _batch(graph, n, gen)
                continue
            if n.kind == "labels":
                values[n.name] = _labels(graph, n, gen)
                continue
            try:
                ins = [aten_call.apply_view(values[r.name], r.view) for r in n.inputs]
            except KeyError as e:
                raise EdgetrainError(f"profiler: node '{n.name}' reads '{e.args[0]}' before it is computed") from None
            aux = values.get(f"{n.aux_of}.aux") if n.aux_of else None

            def once():
                outs = aten_call.call(n.op, n.attrs, ins, params, buffers, aux, cpu, seed, 0)
                own = aten_call.held(outs, n.attrs.get("keep"))
                fused = aten_call.fused_calls(n.attrs, ins, params, buffers, aux, cpu, seed, 0, own)
                for res, sub in [(outs, n.attrs), *fused]:
                    for u in sub.get("updates", ()):
                        if "param" in u:
                            optim.update(u["param"], params[u["param"]], aten_call.update_value(res, u))
                return outs

            outs = once()  # its result feeds the nodes that read this one
            for _ in range(warmup):
                once()
            samples = []
            for _ in range(repeats):
                start = time.perf_counter()
                once()
                samples.append(time.perf_counter() - start)
            times[n.name] = max(min(samples) + overhead, _MIN_S)
            kept = aten_call.held(outs, n.attrs.get("keep"))
            if kept is not None:
                values[n.name] = kept
            if n.attrs.get("aux"):
                values[f"{n.name}.aux"] = tuple(outs[k] for k in n.attrs["aux"])
            for r in {r.name for r in n.inputs} | ({f"{n.aux_of}.aux"} if n.aux_of else set()):
                if last_use.get(r) == t:
                    values.pop(r, None)
    return times


def profile_nodes(graph: TrainingGraph, repeats: int = 5, seed: int = 0, *, warmup: int = 2,
                  threads: int = 1, overhead_s: float | None = None) -> dict[str, float]:
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
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        overhead = op_overhead_s() if overhead_s is None else overhead_s
        return _profile_aten(graph, repeats, seed, warmup, overhead)
    finally:
        torch.set_num_threads(saved)
