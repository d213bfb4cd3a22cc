"""Fused plans (`compile --fuse`): pointwise chains run as inductor kernels, and the memory model stays exact.

Each fused kernel allocates its output and nothing else (torch's profiler records every allocation inside the
call), the ledger meets the schedule's predicted peak to the byte, the process's real memory stays within the
budget, and the check against autograd holds within the tolerance the report states. Inductor compiles C++ on
the CPU (seconds per kernel): one small model, compiled once for the module.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

from edgetrain.compiler.errors import EdgetrainError
from edgetrain.compiler.graph.fuse_chains import fuse_pointwise_chains, fusible
from edgetrain.compiler.pipeline import CompileOptions, build_graph, compile_model
from edgetrain.compiler.schedule_file import format as schedule_format
from edgetrain.compiler.workbench.run import schedule_batches
from edgetrain.runtime.python import load_plan, runtime_for
from edgetrain.runtime.python.checks import checked_step
from edgetrain.runtime.python.fused_kernels import FUSED_OP, FUSED_RTOL
from edgetrain.targets import load_target

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.memory_probe import cpu_probe_available  # noqa: E402

MODEL = "tests/user_models.py:gated_mlp"  # RMSNorm by hand, SwiGLU, a residual: chains forward and backward


def _opts(out, **kw) -> CompileOptions:
    return CompileOptions(model=MODEL, target="rpi4", budget=kw.pop("budget", "85%"), out=str(out), batch_size=4,
                          time_limit=10, **{"fuse": True, **kw})


@pytest.fixture(scope="module")
def fused_plan(tmp_path_factory):
    out = tmp_path_factory.mktemp("fused") / "plan"
    summary = compile_model(_opts(out))
    return out, summary


def _allocations(p) -> list[int]:
    """Every allocation (positive) and free (negative) the profiler saw, in order."""
    found = []

    def walk(e):
        if e.tag == _EventType.Allocation:
            found.append((e.start_time_ns, e.extra_fields.alloc_size))
        for c in e.children:
            walk(c)

    for root in p.profiler.kineto_results.experimental_event_tree():
        walk(root)
    return [size for _, size in sorted(found)]


def test_chains_hold_pointwise_ops_read_once(tmp_path):
    """Only pointwise ops join a chain, and only where the chain is their one reader: every tensor the fused
    graph reads is a node of it, and the fused graph keeps the other nodes as they were."""
    _, _, plain = build_graph(_opts(tmp_path, fuse=False), load_target("rpi4"))
    fused, chains = fuse_pointwise_chains(plain)
    assert chains and len(fused.nodes) == len(plain.nodes) - sum(len(m) - 1 for m in chains.values())
    by_name = {n.name: n for n in plain.nodes}
    names = {n.name for n in fused.nodes}
    readers = {}
    for n in plain.nodes:
        for r in n.inputs:
            readers.setdefault(r.name, []).append(n.name)
    for last, members in chains.items():
        assert all(fusible(by_name[m]) for m in members)
        for m in members[:-1]:
            assert m not in names and len(readers[m]) == 1 and readers[m][0] in members
    assert all(r.name in names for n in fused.nodes for r in n.inputs)


def test_a_fused_kernel_allocates_its_output_alone(fused_plan):
    """Every call of every fused kernel (first computations and recomputes) allocates one block, its output's
    bytes, and frees nothing it made: the chain's intermediates never exist. The ledger meets the prediction."""
    out, summary = fused_plan
    body = schedule_format.load(str(out))
    fused_nodes = {n["name"] for n in body["graph"]["nodes"] if n["op"] == FUSED_OP}
    assert len(fused_nodes) >= 3
    plan = load_plan(str(out))
    rt = runtime_for(plan, os.path.join(out, "pages"), device="cpu")
    (x0, y0), (x1, y1) = schedule_batches(body, "random", 2, seed=1)
    checked_step(plan, rt, x0, y0)  # compiles the kernels; the ledger's peak is the schedule's
    calls = []
    for (name, _first), node in rt._prepared.items():
        if node.op == FUSED_OP:
            inner = node.call.fn

            def traced(*ins, inner=inner, name=name):
                with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as p:
                    result = inner(*ins)
                calls.append((name, _allocations(p), result.nbytes))
                return result

            node.call.fn = traced
    checked_step(plan, rt, x1, y1)
    assert {name for name, _, _ in calls} == fused_nodes
    for name, allocations, nbytes in calls:
        assert allocations == [nbytes], (name, allocations, nbytes)
    assert rt.ledger.peak_bytes == summary["peak_bytes"] <= summary["budget_bytes"]


def test_eager_ops_of_a_chain_would_allocate_between(fused_plan):
    """The allocation check can fail: the same chain as aten ops one by one allocates each step's output."""
    from edgetrain.runtime.python import fused_kernels

    out, _ = fused_plan
    body = schedule_format.load(str(out))
    node = max((n for n in body["graph"]["nodes"] if n["op"] == FUSED_OP), key=lambda n: len(n["attrs"]["chain"]))
    shapes = {n["name"]: n["shape"] for n in body["graph"]["nodes"]}
    assert all(not r.get("view") for r in node["inputs"] if isinstance(r, dict))
    ins = [torch.randn(shapes[r if isinstance(r, str) else r["t"]]) for r in node["inputs"]]
    eager = fused_kernels.Call(node["attrs"], {}, {}, torch.device("cpu"), eager=True)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as p:
        eager.fn(*ins)
    assert len([a for a in _allocations(p) if a > 0]) >= len(node["attrs"]["chain"])


def test_a_fused_plan_checks_within_the_stated_tolerance(fused_plan, tmp_path):
    from edgetrain.compiler.workbench.run import run_plan

    out, summary = fused_plan
    r = run_plan(str(out), steps=2, check=True)
    assert r["ok"], r.get("error")
    assert r["fused_kernels"] >= 3 and r["check_rtol"] == FUSED_RTOL
    assert r["measured_peak_bytes"] == summary["peak_bytes"]


def test_many_chains_compile_each_once():
    """A plan holds dozens of chains (the peers Llama: 69): each is a kernel of its own, never a recompile of a
    shared one (torch refuses a ninth recompile of one function under fullgraph)."""
    from edgetrain.runtime.python import aten_call, fused_kernels

    xs = [torch.randn(4, 8), torch.randn(4, 8)]
    for k in range(9):
        chain = [{"op": "aten.mul.Tensor", "args": [{"$t": 0}, {"$t": 1}]},
                 {"op": "aten.add.Tensor", "args": [{"$c": 0}, float(k)]}]
        call = fused_kernels.Call({"args": [{"$t": 0}, {"$t": 1}], "chain": chain}, {}, {}, torch.device("cpu"))
        assert torch.allclose(aten_call.run(call, xs, None, 0, 0)[0], xs[0] * xs[1] + k)


def test_a_chain_reads_its_parameter_as_it_is_now():
    """A parameter a chain reads is an input of its kernel, never a constant compiled into it: an optimizer's
    in-place update shows in the next call."""
    from edgetrain.runtime.python import aten_call, fused_kernels

    w = torch.ones(8)
    chain = [{"op": "aten.mul.Tensor", "args": [{"$t": 0}, {"$p": "w", "view": [["aten.view.default", [[1, 8]]]]}]},
             {"op": "aten.tanh.default", "args": [{"$c": 0}]}]
    call = fused_kernels.Call({"args": [{"$t": 0}], "chain": chain}, {"w": w}, {}, torch.device("cpu"))
    x = torch.randn(4, 8)
    assert torch.allclose(aten_call.run(call, [x], None, 0, 0)[0], torch.tanh(x))
    w.mul_(-2.0)
    assert torch.allclose(aten_call.run(call, [x], None, 0, 0)[0], torch.tanh(-2.0 * x))


@pytest.mark.slow
@pytest.mark.skipif(not cpu_probe_available(), reason="needs Linux's resettable resident-set high-water mark")
def test_a_fused_plans_real_step_stays_within_the_budget():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "memory.py"), "--child", MODEL, "min",
                        "--batch-size", "8", "--time-limit", "10", "--fuse"], capture_output=True, text=True,
                       cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    row = json.loads(r.stdout.strip().splitlines()[-1])
    assert row["malloc_isolated"]
    assert row["ledger_peak_bytes"] == row["schedule_peak_bytes"] <= row["budget_bytes"]
    assert row["real_bytes"] <= row["budget_bytes"], row


def test_fuse_and_exact_are_one_choice(capsys, tmp_path):
    from edgetrain.compiler.workbench.cli import main

    with pytest.raises(SystemExit) as e:
        main(["compile", MODEL, "--target", "rpi4", "--fuse", "--exact", "--out", str(tmp_path / "x")])
    assert e.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_fuse_is_for_the_python_runtime(tmp_path):
    with pytest.raises(EdgetrainError, match="--fuse"):
        compile_model(_opts(tmp_path / "c", emit="c"))
