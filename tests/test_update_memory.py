"""An optimizer update holds no memory the ledger does not count.

Where the gradient cannot take the weight decay in place (the node holds it, two updates read it, a view shows
part of it), and for the optimizers whose step always allocates (Adam's and Adagrad's square roots), the update's
parameter-sized temporaries are counted: the node's update temporaries (a field apart from its workspace) and the
runtime's ledger read one rule (runtime/python/update_memory.py).

The memory model counts a parameter's update as adding nothing: SGD's weight decay is added into the gradient
when the node drops it. A gradient the plan reads through a view (an HF Llama's head: the transpose of a
transpose) took a parameter-sized temporary instead, and the HF Llama's smallest plan's real step passed its
budget by about that head's weight (3.1 MB over 56.7). Measured in a fresh process whose malloc returns every block
of a page or more at once (benchmarks/memory_probe.py); Linux only.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.memory_probe import cpu_probe_available  # noqa: E402
from edgetrain.compiler.graph.inplace import dropped_output_bytes  # noqa: E402
from edgetrain.codegen.c.lower import lower_for_c  # noqa: E402
from edgetrain.compiler.graph.ir import Node, OptimizerConfig, TensorRef, TrainingGraph  # noqa: E402
from edgetrain.compiler.pipeline import CompileOptions, compile_model  # noqa: E402
from edgetrain.compiler.workbench.run import run_plan  # noqa: E402
from edgetrain.runtime.python import prepared  # noqa: E402
from edgetrain.runtime.python.op_runner import OpRunner  # noqa: E402
from edgetrain.runtime.python.optim import Optimizer  # noqa: E402

SGD = {"name": "sgd", "lr": 0.01, "momentum": 0.9, "weight_decay": 5e-4, "nesterov": False}
T_OF_T = [["aten.t.default", []], ["aten.t.default", []]]

# One update through a view, measured: the real growth while it runs, in bytes (JSON on stdout).
_CHILD = """
import json, sys
sys.path.insert(0, {root!r})
from benchmarks.memory_probe import Probe, isolate_malloc
assert isolate_malloc()
import torch
from edgetrain.runtime.python import prepared
from edgetrain.runtime.python.op_runner import OpRunner
from edgetrain.runtime.python.optim import Optimizer
params = {{"w": torch.randn(1024, 1024)}}
optim = Optimizer({sgd!r}, params, ["w"])
updates = prepared._updates([{{"item": 0, "param": "w", "view": {view!r}}}], (), True, params, {{}}, optim)
OpRunner._apply_updates([torch.randn(1024, 1024)], updates)  # the momentum buffer's pages touched, as after a step
outs = [torch.randn(1024, 1024)]
with Probe("cpu").span() as s:
    OpRunner._apply_updates(outs, updates)
print(json.dumps({{"growth": s.growth}}))
"""


@pytest.mark.skipif(not cpu_probe_available(), reason="needs Linux's resettable resident-set high-water mark")
def test_an_update_through_a_view_allocates_no_parameter_sized_temporary():
    code = _CHILD.format(root=ROOT, sgd=SGD, view=T_OF_T)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    growth = json.loads(r.stdout.strip().splitlines()[-1])["growth"]
    assert growth < 1024 * 1024 * 4 // 4, growth  # the weight is 4 MiB: a temporary of it would show whole


def _torch_sgd(p0: torch.Tensor, grads: list[torch.Tensor]) -> torch.Tensor:
    p = torch.nn.Parameter(p0.clone())
    opt = torch.optim.SGD([p], lr=SGD["lr"], momentum=SGD["momentum"], weight_decay=SGD["weight_decay"])
    for g in grads:
        p.grad = g.clone()
        opt.step()
    return p.detach()


def _run(specs, p0s: dict, outs_per_step: list[list[torch.Tensor]]) -> dict:
    params = {k: v.clone() for k, v in p0s.items()}
    optim = Optimizer(SGD, params, list(params))
    updates = prepared._updates(specs, (), True, params, {}, optim)
    for outs in outs_per_step:
        OpRunner._apply_updates([o.clone() for o in outs], updates)
    return params


def test_an_update_added_into_its_viewed_gradient_is_torchs_sgd_bitwise():
    torch.manual_seed(0)
    p0, grads = torch.randn(64, 48), [torch.randn(64, 48) for _ in range(3)]
    got = _run([{"item": 0, "param": "w", "view": T_OF_T}], {"w": p0}, [[g] for g in grads])
    assert torch.equal(got["w"], _torch_sgd(p0, grads))


def test_a_gradient_two_updates_read_is_not_written_into():
    """Two parameters updated from one gradient (through views of all of it): the first update's weight decay
    must not reach the second's gradient."""
    torch.manual_seed(1)
    a0, b0, grads = torch.randn(32, 16), torch.randn(16, 32), [torch.randn(32, 16) for _ in range(2)]
    specs = [{"item": 0, "param": "a", "view": T_OF_T}, {"item": 0, "param": "b", "view": [["aten.t.default", []]]}]
    got = _run(specs, {"a": a0, "b": b0}, [[g] for g in grads])
    assert torch.equal(got["a"], _torch_sgd(a0, grads))
    assert torch.equal(got["b"], _torch_sgd(b0, [g.t() for g in grads]))


def test_a_gradient_seen_through_a_slice_is_not_written_into():
    """A view of part of the gradient's bytes (one parameter's slice of a fused gradient) leaves it as it is."""
    torch.manual_seed(2)
    w0, grads = torch.randn(8, 16), [torch.randn(16, 16) for _ in range(2)]
    specs = [{"item": 0, "param": "w", "view": [["aten.slice.Tensor", [0, 0, 8]]]}]
    outs = [[g] for g in grads]
    got = _run(specs, {"w": w0}, outs)
    assert torch.equal(got["w"], _torch_sgd(w0, [g[:8] for g in grads]))


# One update, measured beside the ledger that holds its temporaries: (real growth, ledger peak) in bytes.
_LEDGER_CHILD = """
import json, sys
sys.path.insert(0, {root!r})
from benchmarks.memory_probe import Probe, isolate_malloc
assert isolate_malloc()
import torch
from edgetrain.runtime.python import prepared
from edgetrain.runtime.python.ledger import Ledger
from edgetrain.runtime.python.op_runner import OpRunner
from edgetrain.runtime.python.optim import Optimizer
params = {{"w": torch.randn(1024, 1024)}}
optim = Optimizer({config!r}, params, ["w"])
updates = prepared._updates([{{"item": 0, "param": "w", "view": {view!r}}}], {kept!r}, True, params, {{}}, optim)
OpRunner._apply_updates([torch.randn({rows}, 1024)], updates)  # the state's pages touched, as after a step
outs, ledger = [torch.randn({rows}, 1024)], Ledger()
with Probe("cpu").span() as s:
    OpRunner._apply_updates(outs, updates, ledger)
print(json.dumps({{"growth": s.growth, "ledger": ledger.peak_bytes}}))
"""

MIB4 = 1024 * 1024 * 4


@pytest.mark.skipif(not cpu_probe_available(), reason="needs Linux's resettable resident-set high-water mark")
@pytest.mark.parametrize("config, kept, view, counted", [
    (SGD, (0,), None, 1),  # the node holds the gradient: g + wd*p
    (SGD, (), [["aten.slice.Tensor", [0, 0, 1024]]], 1),  # half of the gradient: g + wd*p of the half
    (SGD, (), None, 0),  # the decay goes into the gradient
    (dict(SGD, nesterov=True), (), None, 1),  # d + m*buf
    ({"name": "adam", "weight_decay": 1e-2}, (), None, 3),
    ({"name": "adamw"}, (), None, 2),
    ({"name": "adagrad", "weight_decay": 1e-2}, (), None, 2),
])
def test_the_ledger_holds_what_an_update_allocates(config, kept, view, counted):
    """Real growth within the ledger's count of the update (64 KiB of allocator slack), and the count the
    parameters' temporaries measured on a 4 MiB weight."""
    code = _LEDGER_CHILD.format(root=ROOT, config=config, kept=kept, view=view, rows=2048 if view else 1024)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["ledger"] == counted * MIB4, got
    assert got["growth"] <= got["ledger"] + 64 * 1024, got


def test_a_held_gradients_decay_is_counted_and_the_ledger_is_the_prediction(tmp_path):
    """A parameter of a hidden activation's shape: its gradient is the activation's, which the node holds for
    ReLU's backward, so SGD allocates `grad + wd * param` (512 KiB), the node's update temporaries; the plan trains
    exactly with the ledger's peak the validator's to the byte, within budget."""
    out = tmp_path / "plan"
    c = compile_model(CompileOptions(model="tests.user_models:shared_gradient", target="host", budget="min",
                                     out=str(out), batch_size=8, time_limit=15.0))
    body = json.loads((out / "schedule.json").read_text())
    node = next(n for n in body["graph"]["nodes"] if "a" in n.get("updates", ()))
    assert node["attrs"].get("keep") is None and node["update_temporary_bytes"] == 8 * 16384 * 4, node
    r = run_plan(str(out), steps=2, check=True, device="cpu")
    assert r["ok"] and r["max_abs_err"] == 0 and not r["mismatched"], r.get("error")
    assert r["measured_peak_bytes"] == r["predicted_peak_bytes"] <= r["budget_bytes"] == c["budget_bytes"]


def test_update_temporaries_stay_apart_from_the_dropped_output_they_follow():
    """A gradient accumulated into its accumulator (addmm, `keep: none`) whose update allocates: the workspace
    still says the dropped output's bytes (what `into` is matched on), every memory model reads the sum, and the
    field survives the schedule file (left out where it is 0, as graphs without it were written)."""
    n = Node(name="g", kind="backward", op="aten.addmm.default", inputs=(TensorRef("acc"),),
             attrs={"keep": "none", "scratch": 64}, workspace_bytes=4096 + 64, update_temporary_bytes=3 * 4096)
    assert dropped_output_bytes(n) == 4096 and n.transient_bytes == 4 * 4096 + 64
    assert Node.from_json(json.loads(json.dumps(n.to_json()))) == n
    bare = Node(name="h", kind="backward", op="aten.mm.default")
    assert "update_temporary_bytes" not in bare.to_json() and Node.from_json(bare.to_json()) == bare


def test_a_microcontroller_targets_python_plan_counts_torchs_update_temporaries_and_c_counts_none(tmp_path):
    """A Python plan runs torch's optimizers on any target: Adam's square-root temporaries are in the graph of a
    microcontroller profile's Python plan too, so its ledger is the prediction to the byte; C firmware's kernels
    update in place, and its lowering (codegen/c/lower.py) drops every update temporary."""
    out = tmp_path / "plan"
    c = compile_model(CompileOptions(model="mcu_cnn", target="mps2-an386", budget="min", out=str(out),
                                     batch_size=2, optimizer=OptimizerConfig.of("adam"), emit="python",
                                     time_limit=10.0))
    body = json.loads((out / "schedule.json").read_text())
    assert any(n.get("update_temporary_bytes") for n in body["graph"]["nodes"])
    r = run_plan(str(out), steps=1, check=True, device="cpu")
    assert r["ok"] and r["max_abs_err"] == 0, r.get("error")
    assert r["measured_peak_bytes"] == r["predicted_peak_bytes"] <= r["budget_bytes"] == c["budget_bytes"]
    body["graph"]["optimizer"] = OptimizerConfig.of("sgd").to_json()  # the graph as C firmware would train it
    lowered = lower_for_c(TrainingGraph.from_json(body["graph"]))
    assert not any(n.update_temporary_bytes for n in lowered.nodes)
