"""Measure each node of a training graph on the machine that compiles it: the costs of the `host` target.

The graph is walked once in execution order with the runtime's own op call, so every operand is a real
tensor of the right shape and dtype: max-pool indices come from a real argmax, a batch-norm backward gets
the aux (saved mean and inverse std) of a real forward, labels are in range. Each op then runs `repeats`
more times on the same operands, and the median wall time is the node's cost. A node that completes a
parameter's gradient includes its optimizer update, as it runs on the device. Tensors are dropped after their
last reader, so profiling holds about what a store-all step holds.
"""
from __future__ import annotations

import statistics
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


def _profile_aten(graph: TrainingGraph, repeats: int, seed: int) -> dict[str, float]:
    """Each node of a graph captured from torch, run by the runtime's own op call and optimizer."""
    from edgetrain.runtime.python import aten_call
    from edgetrain.runtime.python.optim import Optimizer

    gen = torch.Generator().manual_seed(seed)
    params, buffers = _state(graph, gen)
    optim = Optimizer({"name": graph.optimizer.name, "lr": graph.optimizer.lr,
                       "momentum": graph.optimizer.momentum, "weight_decay": graph.optimizer.weight_decay,
                       "nesterov": graph.optimizer.nesterov, "betas": graph.optimizer.betas,
                       "eps": graph.optimizer.eps}, params, graph.trainable_params)
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
                for u in n.attrs.get("updates", ()):
                    if "param" in u:
                        optim.update(u["param"], params[u["param"]], aten_call.update_value(outs, u))
                return outs

            outs = once()  # warm-up; its result feeds the nodes that read this one
            samples = []
            for _ in range(repeats):
                start = time.perf_counter()
                once()
                samples.append(time.perf_counter() - start)
            times[n.name] = max(statistics.median(samples), _MIN_S)
            kept = aten_call.held(outs, n.attrs.get("keep"))
            if kept is not None:
                values[n.name] = kept
            if n.attrs.get("aux"):
                values[f"{n.name}.aux"] = tuple(outs[k] for k in n.attrs["aux"])
            for r in {r.name for r in n.inputs} | ({f"{n.aux_of}.aux"} if n.aux_of else set()):
                if last_use.get(r) == t:
                    values.pop(r, None)
    return times


def profile_nodes(graph: TrainingGraph, repeats: int = 5, seed: int = 0) -> dict[str, float]:
    """Median seconds of each compute node of `graph` (input and labels are not computed, so not listed)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if not any(n.op.startswith("aten.") for n in graph.nodes):
        raise EdgetrainError("a measured target times the Python runtime's ops; this graph is for the C runtime "
                             "(--emit c): compile it for a device target, whose costs come from its profile")
    return _profile_aten(graph, repeats, seed)
