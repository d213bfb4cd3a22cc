"""Measure each node of a training graph on the machine that compiles it: the costs of the `host` target.

The graph runs as a store-all plan would, on the runtime itself (`Runtime.compute` and `free`): every operand
is a real tensor of the right shape and dtype (max-pool indices from a real argmax, a batch-norm backward with
the aux of a real forward, labels in range), and a node's span holds what a plan step spends on it: the
executor's bookkeeping, the op, its optimizer update, and the frees that follow it (what it drops, the operands
it reads last). A walk is a whole step, made `warmup` untimed and `repeats` timed times (more on a small graph,
until the timed walks span `min_walk_s`), so each op runs among the step's live tensors on freshly allocated
outputs (an op repeated at once on the same operands reuses the memory it just freed, and ran 1.5-4x faster
than inside a step). A node's cost is the minimum of its timed runs (the least a busy machine adds; a median
carries other processes' load into the plan), scaled so that the nodes sum to the fastest whole walk (minima
taken from different walks sum below any step that ran), timed as the CPU time of the one thread that runs it when torch
has one thread, as wall time otherwise. The runtime's per-op cost was once measured apart, on a one-element op:
8-27 us, where inside a step it is tens to hundreds (views, ledger, frees of large blocks), so it is timed
where it happens. torch runs with `threads` intra-op threads while profiling (the runtime's `PLAN_THREADS` by
default, the count its Trainer runs a host plan with), then gets its own setting back.
"""
from __future__ import annotations

import os
import tempfile
import time

import torch

from edgetrain.compiler.errors import EdgetrainError
from edgetrain.runtime.python.threads import PLAN_THREADS, pinned_threads
from .costs import RECOMPUTED
from .ir import TrainingGraph

_MIN_S = 1e-9  # a time is never zero: the solver would treat the node as free
MAX_REPEATS = 100  # timed walks of a small graph, however short: enough to span a second on a tiny model


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


def _last_use(graph: TrainingGraph) -> dict[str, int]:
    """The stage after which each tensor is freed: its last reader's, or its own where nothing reads it."""
    last: dict[str, int] = {}
    for t, n in enumerate(graph.nodes):
        last.setdefault(n.name, t)
        if n.attrs.get("aux"):
            last.setdefault(f"{n.name}.aux", t)
        for r in n.inputs:
            last[r.name] = t
        if n.aux_of:
            last[f"{n.aux_of}.aux"] = t
    return last


def _walk(graph: TrainingGraph, rt, frees: list[list[str]], batch, samples: dict[str, list[float]] | None,
          clock) -> float:
    """One store-all step through the graph in order on the runtime, each compute and the frees that follow it
    timed together (appended to `samples`), as a plan's step runs them; returns the whole step's time. A node
    whose recompute runs another kernel (graph/norm_recompute.py) is also freed and recomputed right after its
    computation, that recompute timed apart (RECOMPUTED) and left out of the node's time and the step's."""
    began, aside = clock(), 0.0
    rt.begin_step(*batch)
    for t, n in enumerate(graph.nodes):
        start = clock()
        if n.kind == "input":
            rt.load_input()
        elif n.kind == "labels":
            rt.load_labels()
        else:
            call = (n.name, n.op, [r.to_json() for r in n.inputs], n.params, n.buffers, n.attrs, n.aux_of)
            rt.compute(*call)
            if "recompute" in n.attrs:
                freed = clock()
                rt.free(n.name)
                again = clock()
                rt.recompute(*call)
                done = clock()
                if samples is not None:
                    samples[RECOMPUTED.format(n.name)].append(done - again)
                start += done - freed
                aside += done - freed
        for name in frees[t]:
            if name in rt.ledger:  # an op that keeps nothing holds no tensor to free
                rt.free(name)
        if samples is not None and n.name in samples:
            samples[n.name].append(clock() - start)
    rt.end_step()
    return clock() - began - aside


def _profile_aten(graph: TrainingGraph, repeats: int, seed: int, warmup: int, overhead: float,
                  clock, min_walk_s: float) -> dict[str, float]:
    """Each node of a graph captured from torch, run by the runtime itself (its op call, bookkeeping, optimizer
    and frees): `warmup` untimed steps through the whole graph, then `repeats` timed ones, a node's time the
    minimum of its timed runs."""
    from safetensors.torch import save_file

    from edgetrain.runtime.python.executor import INPUT, LABELS, PlanError, Runtime

    gen = torch.Generator().manual_seed(seed)
    params, buffers = _state(graph, gen)
    ends = {n.kind: n for n in graph.nodes if n.kind in ("input", "labels")}
    if [ends[k].name if k in ends else None for k in ("input", "labels")] != [INPUT, LABELS]:
        raise EdgetrainError(f"profiler: the graph's batch nodes are {sorted(n.name for n in ends.values())}; "
                             f"the runtime loads '{INPUT}' and '{LABELS}'")
    batches = [(_batch(graph, ends["input"], gen), _labels(graph, ends["labels"], gen))
               for _ in range(warmup + repeats)]
    frees: list[list[str]] = [[] for _ in graph.nodes]
    for name, t in _last_use(graph).items():
        frees[t].append(name)
    samples: dict[str, list[float]] = {n.name: [] for n in graph.nodes if n.kind not in ("input", "labels")}
    samples.update({RECOMPUTED.format(n.name): [] for n in graph.nodes if "recompute" in n.attrs})
    with tempfile.TemporaryDirectory(prefix="edgetrain-profile-") as tmp:
        weights = os.path.join(tmp, "weights.safetensors")
        save_file({**{f"param/{k}": v for k, v in params.items()}, **{f"buffer/{k}": v for k, v in buffers.items()}},
                  weights)
        del params, buffers  # the runtime holds its own copies
        rt = Runtime(weights, os.path.join(tmp, "pages"), device="cpu", optimizer=graph.optimizer.to_json(),
                     trainable=graph.trainable_params, seed=seed, memory_format=graph.memory_format)
        walk, timed_from, fastest = 0, None, float("inf")
        while walk < warmup + repeats or (time.perf_counter() - timed_from < min_walk_s
                                          and walk < warmup + MAX_REPEATS):
            if walk == warmup:
                timed_from = time.perf_counter()
            try:
                took = _walk(graph, rt, frees, batches[walk % len(batches)], samples if walk >= warmup else None,
                             clock)
            except PlanError as e:
                raise EdgetrainError(f"profiler: {e}") from None
            if walk >= warmup:
                fastest = min(fastest, took)
            walk += 1
    least = {k: min(v) for k, v in samples.items()}
    # The minima come from different walks: their sum is below any whole step (small_cnn: 7.16 ms against its
    # fastest walk's 8.05 ms), which also holds the step's own begin and end. Scaled to the fastest walk, the
    # nodes keep their minima's proportions and sum to a step that ran.
    nodes = {n.name for n in graph.nodes}
    step = sum(v for k, v in least.items() if k in nodes)  # the recomputes timed apart are no part of a step
    scale = max(fastest / step, 1.0) if least and step > 0 else 1.0
    return {k: max(v * scale + overhead, _MIN_S) for k, v in least.items()}


def profile_nodes(graph: TrainingGraph, repeats: int = 5, seed: int = 0, *, warmup: int = 2,
                  threads: int = PLAN_THREADS, overhead_s: float = 0.0, min_walk_s: float = 1.0) -> dict[str, float]:
    """Seconds of each compute node of `graph` (input and labels are not computed, so not listed): the
    minimum of `repeats` timed runs after `warmup` untimed ones, scaled so the nodes sum to the fastest timed
    walk (more walks, up to MAX_REPEATS, until the timed walks span `min_walk_s`: five walks of a small model take
    milliseconds, all inside one moment of the machine's load), with `threads` intra-op threads, plus
    `overhead_s` (a cost the walk does not see, if one is known)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    c_only = next((n for n in graph.nodes if n.op.startswith("edgetrain.") and "args" not in n.attrs), None)
    if not any(n.op.startswith("aten.") for n in graph.nodes) or c_only is not None:
        what = f" (node `{c_only.name}`, {c_only.op}, has no Python call)" if c_only is not None else ""
        raise EdgetrainError("a measured target times the Python runtime's ops; this graph is for the C runtime "
                             f"(--emit c){what}: compile it for a device target, whose costs come from its profile, "
                             "or with --emit python")
    with pinned_threads(threads):
        # One thread computes everything: its CPU time is the step's time on an idle core, and other processes'
        # load does not enter it (a 10 ms op is preempted on a busy machine in nearly every run).
        clock = time.thread_time if threads == 1 else time.perf_counter
        return _profile_aten(graph, repeats, seed, warmup, overhead_s, clock, min_walk_s)
