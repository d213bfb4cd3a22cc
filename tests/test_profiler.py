"""The host profiler: every node of a training graph timed with the runtime's own op call on the host."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

from edgetrain.compiler.pipeline import CompileOptions, build_graph, compile_model
from edgetrain.compiler.frontend.capture import capture
from edgetrain.compiler.graph.ir import OptimizerConfig
from edgetrain.compiler.graph.joint import build_graph as joint_graph
from edgetrain.compiler.graph.profiler import profile_nodes
from edgetrain.compiler.workbench.run import run_plan
from edgetrain.targets import load_target


def _graph(model: nn.Module, shape, loss="cross_entropy"):
    torch.manual_seed(0)
    x = torch.randn(*shape)
    with torch.no_grad():
        out = copy.deepcopy(model).train()(x)  # a copy: a forward in training mode moves batch-norm statistics
    classes = out.shape[1]
    y = torch.randn(out.shape) if loss == "mse" else torch.randint(0, classes, (shape[0],))
    return joint_graph(capture(model, x, y, loss), "test", tuple(shape), classes, loss, OptimizerConfig())


@pytest.fixture(scope="module")
def small_cnn():
    opts = CompileOptions(model="small_cnn", target="rpi4", budget="100%", out="unused", batch_size=8)
    return build_graph(opts, load_target("rpi4"))[2]


def _spin(seconds: float) -> None:
    """Burn `seconds` of this thread's CPU: the profiler times a one-thread walk in thread CPU time."""
    import time

    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def _computed(graph):
    return {n.name for n in graph.nodes if n.kind not in ("input", "labels")}


def test_every_compute_node_gets_a_positive_time(small_cnn):
    times = profile_nodes(small_cnn, repeats=3)
    assert set(times) == _computed(small_cnn)
    assert all(isinstance(v, float) and v > 0 for v in times.values()), times
    assert sum(times.values()) < 5.0  # milliseconds per node for a model this small, not seconds


CONV, RELU = "aten.convolution.default", "aten.relu.default"


def test_a_conv_takes_longer_than_a_relu(small_cnn):
    times = profile_nodes(small_cnn, repeats=7)
    convs = [n for n in small_cnn.nodes if n.op == CONV]
    conv = max(convs, key=lambda n: n.flops)
    # A relu on a tensor of exactly the conv's output shape: same bytes touched, far fewer FLOPs.
    relu = next(n for n in small_cnn.nodes if n.op == RELU and n.shape == conv.shape)
    assert times[conv.name] > times[relu.name], (conv.name, relu.name, times)
    # The conv's backward (input and weight gradients, and the update) is more work than the relu too.
    weight = next(p for p in conv.params if p.endswith("weight"))
    backward = next(n for n in small_cnn.nodes if weight in n.updates)
    assert times[backward.name] > times[relu.name]


def test_it_times_the_runtime_op_call(small_cnn, monkeypatch):
    """An op made 50 ms (of CPU) slower shows up 50 ms slower, and runs once per walk: `warmup` plus `repeats` times."""
    from edgetrain.runtime.python import aten_call

    calls = []
    fast = aten_call.run

    def slow_relu(call, ins, *rest):
        if call.op == RELU:
            calls.append(tuple(ins[0].shape))
            _spin(0.05)
        return fast(call, ins, *rest)

    monkeypatch.setattr(aten_call, "run", slow_relu)
    times = profile_nodes(small_cnn, repeats=3, warmup=2, overhead_s=0.0, min_walk_s=0.0)
    relus = [n for n in small_cnn.nodes if n.op == RELU]
    assert len(calls) == 5 * len(relus)
    # Whole steps in order, real operands of the right shapes: every relu once per walk.
    assert [tuple(n.shape) for _ in range(5) for n in relus] == calls
    assert all(times[n.name] >= 0.05 for n in relus)
    assert all(times[n.name] < 0.05 for n in small_cnn.nodes if n.name in times and n.op != RELU)


def test_profiles_residuals_concats_dropout_pools_and_views():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv2d(3, 4, 3, padding=1)
            self.bn = nn.BatchNorm2d(4)
            self.b = nn.Conv2d(4, 4, 3, padding=1)
            self.c = nn.Conv2d(4, 2, 1)
            self.pool = nn.MaxPool2d(2)
            self.avg = nn.AvgPool2d(2)
            self.drop = nn.Dropout(0.25)
            self.fc = nn.Linear(6 * 2 * 2, 5)

        def forward(self, x):
            y = torch.relu(self.bn(self.a(x)))
            y = y + self.b(y)  # residual: a gradient sum
            y = torch.cat([y, self.c(y)], dim=1)  # narrow views of the gradient
            y = self.avg(self.pool(y))
            return self.fc(self.drop(y).view(y.size(0), -1))

    g = _graph(Net(), (3, 3, 8, 8))
    ops = {n.op.split(".")[1] for n in g.nodes if n.op.startswith("aten.")}
    assert {"add", "max_pool2d_with_indices", "max_pool2d_with_indices_backward", "native_batch_norm_backward",
            "native_dropout_backward", "cat"} <= ops
    times = profile_nodes(g, repeats=2)
    assert set(times) == _computed(g)
    assert all(v > 0 for v in times.values())


def test_mse_graph_with_float_labels():
    g = _graph(nn.Sequential(nn.Flatten(), nn.Linear(12, 4)), (2, 3, 2, 2), loss="mse")
    assert g.node("labels").dtype == "float32"
    times = profile_nodes(g, repeats=1)
    assert set(times) == _computed(g)
    assert {g.node(k).op for k in times} >= {"aten.addmm.default", "aten.mse_loss.default",
                                              "aten.mse_loss_backward.default"}


def test_minimum_of_repeats_pinned_threads_and_per_step_overhead(small_cnn, monkeypatch):
    """A node's time is its fastest timed run (a machine busy during some runs does not inflate it), with torch
    pinned to `threads` while timing (and restored after), plus a given extra cost."""
    from edgetrain.runtime.python import aten_call

    fast, seen, calls = aten_call.run, [], [0]
    per_walk = sum(n.op == RELU for n in small_cnn.nodes)

    def noisy_relu(call, *rest):
        if call.op == RELU:
            walk = calls[0] // per_walk
            calls[0] += 1
            seen.append(torch.get_num_threads())
            _spin(0.05 if walk % 2 == 0 else 0.01)  # every other step as if the machine were loaded
        return fast(call, *rest)

    monkeypatch.setattr(aten_call, "run", noisy_relu)
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # not the pinned count, so a count left behind shows
    try:
        times = profile_nodes(small_cnn, repeats=4, warmup=2, threads=1, overhead_s=0.02, min_walk_s=0.0)
        assert torch.get_num_threads() == 2 and set(seen) == {1}
    finally:
        torch.set_num_threads(before)
    assert calls[0] == 6 * per_walk
    relus = [n.name for n in small_cnn.nodes if n.op == RELU]
    assert all(0.03 <= times[r] < 0.045 for r in relus), {r: times[r] for r in relus}  # 10 ms + 20 ms
    assert all(times[k] >= 0.02 for k in times)  # every node carries the extra cost


def test_a_node_carries_the_runtime_work_around_its_op(small_cnn, monkeypatch):
    """The walk runs on the runtime: what it does after an op (here a free made 30 ms slower) is that node's."""
    from edgetrain.runtime.python.executor import Runtime

    real_free, freed = Runtime.free, []

    def slow_free(self, name):
        if name == "input":
            freed.append(name)
            _spin(0.03)
        real_free(self, name)

    monkeypatch.setattr(Runtime, "free", slow_free)
    times = profile_nodes(small_cnn, repeats=2, warmup=1, min_walk_s=0.0)
    last_reader = max((t for t, n in enumerate(small_cnn.nodes) if "input" in {r.name for r in n.inputs}))
    reader = small_cnn.nodes[last_reader].name
    assert freed == ["input"] * 3  # once per walk, after its last reader
    assert times[reader] >= 0.03
    assert all(v < 0.03 for k, v in times.items() if k != reader)


def test_nodes_sum_to_the_fastest_whole_walk(small_cnn, monkeypatch):
    """What a step spends outside any node (here a begin_step made 50 ms slower) is in the nodes' sum: the minima,
    taken from different walks, are scaled to the fastest whole walk."""
    from edgetrain.runtime.python.executor import Runtime

    real_begin = Runtime.begin_step
    monkeypatch.setattr(Runtime, "begin_step", lambda self, x, y: _spin(0.05) or real_begin(self, x, y))
    slow = profile_nodes(small_cnn, repeats=3, warmup=1, min_walk_s=0.0)
    monkeypatch.setattr(Runtime, "begin_step", real_begin)
    plain = profile_nodes(small_cnn, repeats=3, warmup=1, min_walk_s=0.0)
    assert sum(slow.values()) >= 0.05
    assert sum(slow.values()) - sum(plain.values()) >= 0.04


def test_a_small_graph_is_walked_until_the_timed_walks_span_min_walk_s(small_cnn, monkeypatch):
    """Five walks of a small model take milliseconds, one moment of the machine's load: it walks on, up to a cap."""
    import time

    from edgetrain.compiler.graph import profiler
    from edgetrain.runtime.python.executor import Runtime

    real_begin, begun = Runtime.begin_step, []
    monkeypatch.setattr(Runtime, "begin_step", lambda self, x, y: begun.append(1) or real_begin(self, x, y))
    start = time.perf_counter()
    profile_nodes(small_cnn, repeats=2, warmup=1, min_walk_s=0.3)
    assert time.perf_counter() - start >= 0.3 and 3 < len(begun) <= 1 + profiler.MAX_REPEATS
    begun.clear()
    monkeypatch.setattr(profiler, "MAX_REPEATS", 4)
    profile_nodes(small_cnn, repeats=2, warmup=1, min_walk_s=60.0)
    assert len(begun) == 1 + 4  # the cap stops it long before a minute


def test_repeats_must_be_positive(small_cnn):
    with pytest.raises(ValueError, match="repeats"):
        profile_nodes(small_cnn, repeats=0)


def test_profiling_does_not_touch_the_model_it_came_from():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.ReLU(), nn.Flatten(), nn.Linear(2 * 4 * 4, 3))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    g = _graph(model, (2, 1, 6, 6))
    profile_nodes(g, repeats=2)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_compile_small_cnn_on_host_end_to_end(tmp_path):
    out = str(tmp_path / "host")
    r = compile_model(CompileOptions(model="small_cnn", target="host", budget="100%", out=out, batch_size=4))
    assert r["target"] == "host"
    from edgetrain.compiler.schedule_file import format as schedule

    body = schedule.load(out)
    assert body["target"]["measured"] is True and body["target"]["flops_per_s"] > 0
    nodes = body["graph"]["nodes"]
    computed = [n for n in nodes if n["kind"] not in ("input", "labels")]
    assert all(n["time_s"] > 0 and n["energy_j"] > 0 for n in computed)
    # The times are measured, not FLOPs / FLOP-per-second: no fixed ratio between the two.
    ratios = {round(n["time_s"] * body["target"]["flops_per_s"] / max(n["flops"], 1), 6) for n in computed}
    assert len(ratios) > 1
    res = run_plan(out, steps=1, check=True, device="cpu")
    assert res["ok"], res
    assert res["measured_peak_bytes"] == res["predicted_peak_bytes"] <= res["budget_bytes"]
    # Paging figures measured with the runtime's page store at the plan's sizes, not the profile's nominal ones.
    t, nominal = body["target"], load_target("host")
    for fld in ("page_in_latency_s", "page_in_bandwidth_bytes_per_s", "page_out_latency_s",
                "page_out_bandwidth_bytes_per_s"):
        assert t[fld] != getattr(nominal, fld) and t["sources"][fld].startswith("Measured: the runtime's page store")
    assert t["page_in_bandwidth_bytes_per_s"] > 0 and t["page_out_bandwidth_bytes_per_s"] > 0


def test_paging_fit_and_probe_sizes(small_cnn):
    from edgetrain.compiler.graph.paging_profile import MAX_BYTES, MIN_BYTES, fit, probe_sizes, with_measured_paging

    sizes = [4096, 65536, 1 << 20, 16 << 20]
    lat, bw = fit([(b, 80e-6 + b / 2e9) for b in sizes])  # exact points give the line back
    assert lat == pytest.approx(80e-6) and bw == pytest.approx(2e9)
    lat, bw = fit([(b, b / 3e9) for b in sizes])  # no fixed cost: latency 0, not negative
    assert lat == pytest.approx(0, abs=1e-12) and bw == pytest.approx(3e9)
    probes = probe_sizes(small_cnn)
    biggest = max(n.bytes for n in small_cnn.nodes)
    assert probes[0] >= MIN_BYTES and probes[-1] <= MAX_BYTES and len(probes) >= 2
    assert probes[0] <= max(MIN_BYTES, min(n.bytes for n in small_cnn.nodes if n.bytes)) and probes[-1] >= biggest
    assert all(b * 4 == c for b, c in zip(probes, probes[1:]))
    rpi4 = load_target("rpi4")
    assert with_measured_paging(rpi4, small_cnn) is rpi4  # a device's figures are its datasheet's


def test_page_times_price_what_the_compute_thread_pays_after_the_page(monkeypatch):
    """A page's figure is the compute slice with page ops in it less the slice alone: a page op that makes
    the ops after it slower (here each op spins 0.1 ms of CPU more once the page-out ran) is charged for that,
    not only for its own time; without it, the figure is the page op's own cost."""
    import time

    from edgetrain.compiler.graph import paging_profile
    from edgetrain.runtime.python.storage import FileStore

    def spin(seconds):
        t0 = time.thread_time()
        while time.thread_time() - t0 < seconds:
            pass

    state = {"after_page": False}

    def small_op(a, b):
        spin(0.0002 if state["after_page"] else 0.0001)
        return a

    real_page_out = FileStore.page_out

    def page_out(self, name, tensor):
        state["after_page"] = True
        return real_page_out(self, name, tensor)

    def slice_(a, b, page=None):
        state["after_page"] = False
        return real_slice(a, b, page)

    real_slice = paging_profile._slice
    monkeypatch.setattr(paging_profile, "_small_op", small_op)
    monkeypatch.setattr(paging_profile, "_slice", slice_)
    monkeypatch.setattr(FileStore, "page_out", page_out)
    out_s, in_s = paging_profile.page_times.__wrapped__(4096, repeats=2)
    # the ops after the first page-out, 0.1 ms slower each, shared by the slice's page-outs
    slowed = (paging_profile.SLICE_OPS - 1) * 0.0001 / paging_profile.PAGES_PER_SLICE
    assert out_s >= 0.8 * slowed  # the page-out's own call is far cheaper than that
    assert in_s < 0.5 * slowed  # a page-in leaves the ops as they were


def test_resnet18_profiles_quickly():
    import time

    opts = CompileOptions(model="resnet18", target="rpi4", budget="100%", out="unused", batch_size=2)
    g = build_graph(opts, load_target("rpi4"))[2]
    start = time.perf_counter()
    times = profile_nodes(g)
    elapsed = time.perf_counter() - start
    assert set(times) == _computed(g) and all(v > 0 for v in times.values())
    assert elapsed < 20.0, f"profiling ResNet-18 at batch 2 took {elapsed:.1f} s"


def test_pinned_threads_sets_and_restores_even_on_error():
    from edgetrain.runtime.python.threads import PLAN_THREADS, pinned_threads

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.raises(KeyError), pinned_threads(1):
            assert torch.get_num_threads() == 1
            raise KeyError("inside")
        assert torch.get_num_threads() == 2
        with pinned_threads() as n:
            assert n == PLAN_THREADS == torch.get_num_threads()
        with pytest.raises(ValueError, match="threads"), pinned_threads(0):
            pass
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_host_plan_runs_at_the_thread_count_it_was_profiled_at(tmp_path, monkeypatch):
    """The profiler and `run` pin the same number (the runtime's PLAN_THREADS); both set the caller's back."""
    from edgetrain.runtime.python import aten_call
    from edgetrain.runtime.python.threads import PLAN_THREADS

    fast, seen = aten_call.run, []

    def spy(call, *rest):
        seen.append(torch.get_num_threads())
        return fast(call, *rest)

    before = torch.get_num_threads()
    torch.set_num_threads(PLAN_THREADS + 1)
    try:
        out = str(tmp_path / "host")
        compile_model(CompileOptions(model="small_cnn", target="host", budget="100%", out=out, batch_size=2))
        monkeypatch.setattr(aten_call, "run", spy)
        res = run_plan(out, steps=1, device="cpu")
        assert res["ok"] and seen and set(seen) == {PLAN_THREADS}
        assert torch.get_num_threads() == PLAN_THREADS + 1
    finally:
        torch.set_num_threads(before)
