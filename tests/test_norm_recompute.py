"""Fused plans' batch norms recompute from the statistics they kept (compiler/graph/norm_recompute.py).

A training batch norm (with the ReLU6 that alone reads it) is one node: its first computation is torch's batch
norm and the ReLU6 in place, its recompute one inductor kernel normalising from the held mean and inverse
standard deviation. The kernel allocates its output alone, reads the statistics it is given (not the batch's
again), never updates the running statistics, costs the scheduler less than the first computation, and a plan
that recomputes such a node checks within the fused tolerance with the ledger at its prediction. Inductor
compiles C++ on the CPU: one small model, compiled once for the module.
"""
from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file
from torch.profiler import ProfilerActivity, profile

from edgetrain.compiler.graph.fuse_chains import fuse_pointwise_chains
from edgetrain.compiler.graph.ir import Node, TensorRef
from edgetrain.compiler.graph.liveness import analyze
from edgetrain.compiler.graph.norm_recompute import NORM_FORWARD, hold_norm_statistics
from edgetrain.compiler.pipeline import CompileOptions, build_graph, compile_model
from edgetrain.compiler.schedule_file import format as schedule_format
from edgetrain.compiler.workbench.run import run_plan, schedule_batches
from edgetrain.runtime.python import aten_call, fused_kernels, load_plan, prepared, runtime_for
from edgetrain.runtime.python.checks import checked_step
from edgetrain.runtime.python.fused_kernels import FUSED_OP, FUSED_RTOL
from edgetrain.targets import load_target
from test_fused_kernels import _allocations  # the profiler's allocations, in order

MODEL = "tests/user_models.py:InvertedResidual"  # conv-BN-ReLU6 stem, expand, depthwise, projection BN alone
aten = torch.ops.aten


def _opts(out, **kw) -> CompileOptions:
    return CompileOptions(model=MODEL, target="rpi4", budget=kw.pop("budget", "75%"), out=str(out), batch_size=4,
                          time_limit=10, scheduler="checkmate", **{"fuse": True, **kw})


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    _, _, plain = build_graph(_opts(tmp_path_factory.mktemp("g"), fuse=False), load_target("rpi4"))
    chained, _ = fuse_pointwise_chains(plain)
    held, members = hold_norm_statistics(chained)
    return plain, held, members


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    out = tmp_path_factory.mktemp("norm_recompute") / "plan"
    return out, compile_model(_opts(out))


def test_each_batch_norm_holds_its_statistics_for_its_recompute(graphs):
    """Three batch norms join the ReLU6 that alone reads each, the projection's stays alone; each keeps its
    statistics and running-statistics updates, costs fewer FLOPs to recompute, and its backward reads its
    statistics under the new node's name; no node reads a tensor that is gone."""
    plain, held, members = graphs
    norms = [n for n in held.nodes if n.op == FUSED_OP and "recompute" in n.attrs]
    assert len(norms) == 4 and not any(n.op == NORM_FORWARD for n in held.nodes)
    assert sorted(len(m) for m in members.values()) == [1, 2, 2, 2]
    for n in norms:
        assert n.attrs["aux"] == [1, 2] and n.aux_bytes > 0 and {u["item"] for u in n.attrs["updates"]} == {3, 4}
        assert n.recompute_flops < n.flops
        assert n.attrs["recompute"]["args"] == [{"$t": 0}, {"$aux": 0}, {"$aux": 1}]
    joined = [n for n in norms if len(members[n.name]) == 2]
    assert all(n.attrs["chain"][1]["op"] == "aten.hardtanh_.default" for n in joined)
    assert all(n.attrs["recompute"]["chain"][-1]["op"] == "aten.hardtanh.default" for n in joined)
    names = {n.name for n in held.nodes}
    assert all(r.name in names for n in held.nodes for r in n.inputs)
    backward = [n for n in held.nodes if n.aux_of is not None]
    assert len(backward) == 4 and {n.aux_of for n in backward} == {n.name for n in norms}
    assert len(held.nodes) == len(plain.nodes) - 3


def test_a_batch_norm_recomputes_only_while_its_statistics_are_held(graphs):
    """With no optimizer step at its backward (frozen weight and bias) and a reader of its output after that
    backward, nothing else bounds a batch norm's recompute: its statistics, freed after their reader, still do."""
    _, held, _ = graphs
    stem = next(n for n in held.nodes if "recompute" in n.attrs)
    late = Node(name="late", kind="backward", op="aten.relu.default", inputs=(TensorRef(stem.name),),
                attrs={"args": [{"$t": 0}]}, shape=stem.shape)
    frozen = replace(held, nodes=[replace(n, updates=()) for n in held.nodes] + [late])
    lv = analyze(frozen)
    reader = next(t for t, m in enumerate(frozen.nodes) if m.aux_of == stem.name)
    assert lv.window_end[stem.name] > reader
    assert stem.name in lv.recompute_until and lv.recompute_until[stem.name] <= reader


def _node(graphs, joined: bool):
    _, held, members = graphs
    return next(n for n in held.nodes if n.name in members and (len(members[n.name]) == 2) == joined)


@pytest.mark.parametrize("joined", [True, False], ids=["with ReLU6", "alone"])
def test_a_recompute_normalises_from_the_statistics_it_is_given(graphs, joined):
    """The first computation is torch's batch norm (and ReLU6) bit for bit; the recompute, given the statistics
    the first kept, is within the fused tolerance of it; given other statistics, it follows them (it never
    computes the batch's again). Only the first computation updates the running statistics."""
    n = _node(graphs, joined)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n.shape, generator=gen).contiguous(memory_format=torch.channels_last) * 2 + 0.5
    params = {p: torch.randn(x.shape[1], generator=gen) for p in n.params}
    buffers = {b: torch.zeros(x.shape[1]) if b.endswith("mean") else torch.ones(x.shape[1]) for b in n.buffers}
    cpu = torch.device("cpu")
    first = fused_kernels.Call(n.attrs, params, buffers, cpu, first=True)
    again = fused_kernels.Call(n.attrs, params, buffers, cpu, first=False)
    outs = aten_call.run(first, [x], None, 0, 0)
    w, b = (params[p] for p in n.params)
    y, mean, invstd, _, _ = aten._native_batch_norm_legit_functional(x, w, b, buffers[n.buffers[0]],
                                                                     buffers[n.buffers[1]], True, 0.1, 1e-5)
    want = aten.hardtanh(y, 0.0, 6.0) if joined else y
    assert len(outs) == 5 and torch.equal(outs[0], want) and torch.equal(outs[1], mean)
    (z,) = aten_call.run(again, [x], (outs[1], outs[2]), 0, 0)
    assert z.stride() == want.stride() and torch.allclose(z, want, rtol=FUSED_RTOL, atol=1e-6)
    (shifted,) = aten_call.run(again, [x], (outs[1] + 1.0, outs[2]), 0, 0)
    c = (x.shape[1], 1, 1)
    expect = (x - (mean + 1.0).view(c)) * (invstd * w).view(c) + b.view(c)
    assert torch.allclose(shifted, aten.hardtanh(expect, 0.0, 6.0) if joined else expect, atol=1e-5)
    optim = type("Optim", (), {"settings": None})()
    for is_first, count in ((True, 2), (False, 0)):
        node = prepared.prepare(is_first, n.name, n.op, [r.name for r in n.inputs], n.attrs, n.aux_of, params,
                                buffers, cpu, optim)
        assert sum(u.buffer is not None for u in node.updates) == count
        assert node.aux_name == (None if is_first else f"{n.name}.aux")


def test_a_recompute_kernel_allocates_its_output_alone(graphs):
    """The kernel computes alpha, beta and the ReLU6 inside its one loop: one allocation, its output's bytes
    (the memory model counts the recompute as the node's output alone)."""
    n = _node(graphs, True)
    x = torch.randn(n.shape).contiguous(memory_format=torch.channels_last)
    params = {p: torch.randn(n.shape[1]) for p in n.params}
    again = fused_kernels.Call(n.attrs, params, {}, torch.device("cpu"), first=False)
    aux = (torch.randn(n.shape[1]), torch.rand(n.shape[1]) + 0.5)
    aten_call.run(again, [x], aux, 0, 0)  # compiles
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as p:
        (z,) = aten_call.run(again, [x], aux, 0, 0)
    assert _allocations(p) == [z.nbytes]
    eager = fused_kernels.Call(n.attrs, params, {}, torch.device("cpu"), eager=True, first=False)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as p:
        aten_call.run(eager, [x], aux, 0, 0)
    assert len([a for a in _allocations(p) if a > 0]) >= 4  # the same steps one by one: each output allocated


def test_the_scheduler_pays_the_cheaper_recompute(plan):
    """A recomputed batch norm costs the scheduler its normalise pass: the schedule's time counts its recompute
    time, which is below its first computation's."""
    out, summary = plan
    body = schedule_format.load(str(out))
    nodes = {n["name"]: n for n in body["graph"]["nodes"]}
    again = [s["tensor"] for s in body["steps"] if s["action"] == "recompute"
             and "recompute" in nodes[s["tensor"]]["attrs"]]
    assert again, "the plan recomputes no batch norm: raise the test's pressure"
    for name in again:
        assert 0 < nodes[name]["recompute_time_s"] < nodes[name]["time_s"]
    first = sum(n["time_s"] for n in nodes.values())
    recomputed = sum(nodes[s["tensor"]].get("recompute_time_s", nodes[s["tensor"]]["time_s"])
                     for s in body["steps"] if s["action"] == "recompute")
    assert body["predicted"]["time_s"] == pytest.approx(first + recomputed)


def test_a_plan_recomputing_batch_norms_checks_within_tolerance(plan):
    """Two checked steps against autograd (parameters and running statistics): within the fused tolerance; the
    ledger at the predicted peak to the byte, within the budget."""
    out, summary = plan
    r = run_plan(str(out), steps=2, check=True)
    assert r["ok"], r.get("error")
    assert r["check_rtol"] == FUSED_RTOL
    assert r["measured_peak_bytes"] == summary["peak_bytes"] <= summary["budget_bytes"]


def test_running_statistics_are_updated_once_a_step(plan):
    """After one step the stem's running mean is 0.1 x its batch mean (momentum 0.1, from 0): the batch norm's
    recompute did not update it a second time (that would give 0.19 x)."""
    out, _ = plan
    body = schedule_format.load(str(out))
    assert any(s["action"] == "recompute" and s["tensor"] == "hardtanh" for s in body["steps"])
    p = load_plan(str(out))
    rt = runtime_for(p, os.path.join(out, "pages"), device="cpu")
    (x, y), = schedule_batches(body, "random", 1, seed=3)
    weight = load_file(os.path.join(out, "weights.safetensors"))["param/stem.0.weight"]
    batch_mean = torch.nn.functional.conv2d(x, weight, padding=1).mean((0, 2, 3))
    checked_step(p, rt, x, y)
    assert torch.allclose(rt._buffers["stem.1.running_mean"], 0.1 * batch_mean, atol=1e-6)
