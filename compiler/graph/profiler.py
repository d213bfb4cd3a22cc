"""Measure each node of a training graph on the machine that compiles it: the costs of the `host` target.

The graph is walked once in execution order with the runtime's own kernels, so every operand is a real
tensor of the right shape and dtype: max-pool indices come from a real argmax, a batch-norm backward gets
the aux (saved mean and inverse std) of a real forward, labels are in range. Each kernel then runs
`warmup` untimed and `repeats` timed more times on the same operands, and the node's cost is the minimum
(the least a busy machine adds; a median carries other processes' load into the plan) plus the runtime's
own cost per plan step (`op_overhead_s`: the executor's bookkeeping around a kernel and the free that
follows it, which dominates small models). torch runs with `threads` intra-op threads while profiling (1 by
default: a host plan's times are for a runtime on one thread, as `benchmarks/runtime.py --threads 1` runs
it), then gets its own setting back. A backward node's time includes its fused SGD update, as it runs on the device.
Tensors are dropped after their last reader, so profiling holds about what a store-all step holds.
"""
from __future__ import annotations

import os
import tempfile
import time

import torch

from edgetrain.runtime.python.kernel_api import KernelContext
from edgetrain.runtime.python.kernels import KERNELS
from edgetrain.runtime.python.sgd import sgd_update
from edgetrain.runtime.python.views import ViewError, apply_views

from edgetrain.compiler.errors import EdgetrainError
from .ir import TensorRef, TrainingGraph

_DTYPES = {"float32": torch.float32, "int64": torch.int64}
_MIN_S = 1e-9  # a time is never zero: the solver would treat the node as free


def _view(t, ref: TensorRef) -> torch.Tensor:
    try:
        return apply_views(t, ref.view)[0]
    except ViewError as e:
        raise EdgetrainError(f"profiler: {e} on '{ref.name}'") from None


def _state(graph: TrainingGraph, gen: torch.Generator):
    params = {k: torch.randn(s.shape, generator=gen) * 0.1 for k, s in graph.params.items()}
    buffers = {}
    for k, s in graph.buffers.items():
        if s.dtype == "int64":
            buffers[k] = torch.zeros(s.shape, dtype=torch.int64)
        elif k.endswith("running_var"):
            buffers[k] = torch.ones(s.shape)
        else:
            buffers[k] = torch.zeros(s.shape)
    momentum = {k: torch.zeros_like(p) for k, p in params.items()} if graph.optimizer.momentum else {}
    return params, buffers, momentum


def _batch(graph: TrainingGraph, node, gen: torch.Generator) -> torch.Tensor:
    if node.kind == "labels" and node.dtype == "int64":
        return torch.randint(0, max(1, graph.num_classes), node.shape, generator=gen, dtype=torch.int64)
    if node.dtype == "int64":  # token ids
        return torch.randint(0, max(1, graph.input_high or 1), node.shape, generator=gen, dtype=torch.int64)
    return torch.randn(node.shape, generator=gen, dtype=_DTYPES[node.dtype])


def op_overhead_s(samples: int = 300) -> float:
    """Seconds the runtime spends per plan step around its kernel: a compute of a one-element ReLU and its
    free through `Runtime`, less the kernel called directly; the minimum of `samples` of each."""
    from safetensors.torch import save_file

    from edgetrain.runtime.python.executor import Runtime

    x, kernel = torch.zeros(1), KERNELS["relu"]
    with tempfile.TemporaryDirectory(prefix="edgetrain-overhead-") as tmp:
        weights = os.path.join(tmp, "w.safetensors")
        save_file({"param/w": torch.zeros(1)}, weights)
        rt = Runtime(weights, os.path.join(tmp, "pages"), device="cpu", lr=0.0, momentum=0.0, weight_decay=0.0)
        rt.begin_step(x, torch.zeros(1, dtype=torch.int64))
        rt.load_input()
        ctx = KernelContext(first=True, buffers=[], aux=None, step=0, seed=0, device="cpu")
        through, direct = [], []
        for _ in range(samples):
            start = time.perf_counter()
            rt.compute("r", "relu", ["input"])
            rt.free("r")
            mid = time.perf_counter()
            with torch.no_grad():
                kernel(ctx, [x], [], {})
            direct.append(time.perf_counter() - mid)
            through.append(mid - start)
        rt.free("input")
        rt.end_step()
    return max(min(through) - min(direct), 0.0)


def profile_nodes(graph: TrainingGraph, repeats: int = 5, seed: int = 0, *, warmup: int = 2,
                  threads: int = 1, overhead_s: float | None = None) -> dict[str, float]:
    """Seconds of each compute node of `graph` (input and labels are not computed, so not listed): the
    minimum of `repeats` timed runs after `warmup` untimed ones, with `threads` intra-op threads, plus the
    runtime's per-step overhead (`op_overhead_s()` unless given)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        overhead = op_overhead_s() if overhead_s is None else overhead_s
        return _profile(graph, repeats, seed, warmup, overhead)
    finally:
        torch.set_num_threads(saved)


def _profile(graph: TrainingGraph, repeats: int, seed: int, warmup: int, overhead: float) -> dict[str, float]:
    gen = torch.Generator().manual_seed(seed)
    params, buffers, momentum = _state(graph, gen)
    opt = graph.optimizer
    last_use: dict[str, int] = {}
    for t, n in enumerate(graph.nodes):
        for r in n.inputs:
            last_use[r.name] = t
        if n.aux_of:
            last_use[f"{n.aux_of}.aux"] = t
    values: dict[str, torch.Tensor] = {}
    aux: dict[str, tuple] = {}
    times: dict[str, float] = {}
    with torch.no_grad():
        for t, n in enumerate(graph.nodes):
            if n.kind in ("input", "labels"):
                values[n.name] = _batch(graph, n, gen)
                continue
            kernel = KERNELS.get(n.op)
            if kernel is None:
                raise EdgetrainError(f"profiler: node '{n.name}' uses op '{n.op}', which the runtime has no "
                                     "kernel for")
            try:
                ins = [_view(values[r.name], r) for r in n.inputs]
            except KeyError as e:
                raise EdgetrainError(f"profiler: node '{n.name}' reads '{e.args[0]}' before it is computed") from None
            ps = [params[p] for p in n.params]
            bufs = [buffers[b] for b in n.buffers]

            def once(first: bool):
                ctx = KernelContext(first=first, buffers=bufs, aux=aux.get(n.aux_of) if n.aux_of else None,
                                    step=0, seed=seed, device="cpu")
                res = kernel(ctx, ins, ps, dict(n.attrs))
                for pname, p, g in zip(n.params, ps, res.grads):
                    sgd_update(p, g, momentum.get(pname), opt.lr, opt.momentum, opt.weight_decay)
                return res

            res = once(True)  # its result feeds the nodes that read this one
            for _ in range(warmup):
                once(True)
            samples = []
            for _ in range(repeats):
                start = time.perf_counter()
                once(True)
                samples.append(time.perf_counter() - start)
            times[n.name] = max(min(samples) + overhead, _MIN_S)
            if res.out is not None:
                values[n.name] = res.out
            if res.aux is not None:
                aux[n.name] = tuple(res.aux)
            for r in {r.name for r in n.inputs}:
                if last_use.get(r) == t:
                    values.pop(r, None)
            if n.aux_of and last_use.get(f"{n.aux_of}.aux") == t:
                aux.pop(n.aux_of, None)
    return times
