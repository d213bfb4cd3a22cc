"""A ReLU6's backward reads the ReLU6's output (compiler/graph/clamp_backward.py): torch's hardtanh_backward on
y = hardtanh(x) gives bitwise the gradient it gives on x, at every boundary, NaN and infinity; the rewrite applies
to a conv-BN-ReLU6 network's graph, leaves its batch-norm outputs to the forward pass (kept only
where a schedule recomputes a ReLU6 from them), and trains exactly."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from edgetrain.compiler.graph.clamp_backward import BACKWARD, FORWARD, read_clamp_output
from edgetrain.compiler.graph.ir import Node, TensorRef, TrainingGraph
from edgetrain.compiler.graph.liveness import analyze
from edgetrain.compiler.pipeline import CompileOptions, build_graph, compile_model
from edgetrain.compiler.workbench.run import run_plan
from edgetrain.targets import load_target

aten = torch.ops.aten
NET = "tests.test_clamp_backward:relu6_net"


def relu6_net():
    """conv-BN-ReLU6 twice, pooled, a linear head: 3x16x16 in."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU6(inplace=True),
                         nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU6(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))


def _edge_values(lo: float, hi: float) -> torch.Tensor:
    f = torch.tensor
    pts = []
    for b in (lo, hi, 0.0):
        b = f(b, dtype=torch.float32)
        pts += [b, torch.nextafter(b, f(float("inf"))), torch.nextafter(b, f(float("-inf")))]
    special = f([float("nan"), -float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1e-45, -1e-45, 1.17e-38,
                 3.4e38, -3.4e38])
    bits = torch.randint(-2 ** 31, 2 ** 31 - 1, (1 << 18,), dtype=torch.int64, generator=torch.Generator().manual_seed(1))
    random_bits = bits.to(torch.int32).view(torch.float32)  # every exponent, NaN payloads, subnormals
    near = torch.linspace(lo - 1, hi + 1, 4097)
    return torch.cat([torch.stack(pts), special, random_bits, near])


@pytest.mark.parametrize("lo, hi", [(0.0, 6.0), (-1.0, 1.0), (2.0, 2.0)])
def test_the_gradient_on_the_clamps_output_is_bitwise_the_gradient_on_its_input(lo, hi):
    x = _edge_values(lo, hi)
    grads = [torch.randn(x.shape, generator=torch.Generator().manual_seed(2)),
             torch.full(x.shape, float("nan")), torch.full(x.shape, -0.0)]
    y = aten.hardtanh.default(x, lo, hi)
    assert y.isnan().sum() == x.isnan().sum()  # the clamp propagates NaN, so the mask passes it alike
    for g in grads:
        on_x = aten.hardtanh_backward.default(g, x, lo, hi)
        on_y = aten.hardtanh_backward.default(g, y, lo, hi)
        assert torch.equal(on_x.view(torch.int32), on_y.view(torch.int32))
    # and the rule does not hold for a clamp of other bounds: the pass must match them
    if lo < hi:
        other = aten.hardtanh.default(x, lo, (lo + hi) / 2)
        g = grads[0]
        assert not torch.equal(aten.hardtanh_backward.default(g, x, lo, hi).view(torch.int32),
                               aten.hardtanh_backward.default(g, other, lo, hi).view(torch.int32))


def _hand(bounds_fwd=(0.0, 6.0), bounds_bwd=(0.0, 6.0), then_reads_x=False) -> TrainingGraph:
    F = (2, 4)
    bwd_attrs = {"args": [{"$t": 0}, {"$t": 1}, *bounds_bwd]}
    if then_reads_x:
        bwd_attrs["then"] = [{"op": "aten.add.Tensor", "args": [{"$t": 1}, {"$t": 1}]}]
    nodes = [Node("input", "input", "input", shape=F),
             Node("x", "forward", "aten.neg.default", (TensorRef("input"),), attrs={"args": [{"$t": 0}]}, shape=F),
             Node("y", "forward", FORWARD, (TensorRef("x"),), attrs={"args": [{"$t": 0}, *bounds_fwd]}, shape=F),
             Node("loss", "loss", "aten.sum.default", (TensorRef("y"),), attrs={"args": [{"$t": 0}]}, shape=()),
             Node("g", "backward", "aten.ones_like.default", (TensorRef("y"),), attrs={"args": [{"$t": 0}]}, shape=F),
             Node("gx", "backward", BACKWARD, (TensorRef("g"), TensorRef("x")), attrs=bwd_attrs, shape=F)]
    return TrainingGraph(model="hand", nodes=nodes, params={}, buffers={}, input_shape=F, num_classes=None,
                         loss="mse")


def test_the_pass_rewrites_only_a_backward_of_the_same_bounds_whose_operand_nothing_else_reads():
    g, done = read_clamp_output(_hand())
    assert done == ["gx"] and [r.name for r in g.node("gx").inputs] == ["g", "y"]
    needed = lambda graph: {x for v in analyze(graph).needs.values() for x in v}  # noqa: E731
    assert "x" not in needed(g) and "x" in needed(_hand())  # no backward stage reads x now: kept only to recompute y
    for other in (_hand(bounds_bwd=(0.0, 5.0)), _hand(bounds_fwd=(1.0, 6.0)), _hand(then_reads_x=True)):
        g2, done2 = read_clamp_output(other)
        assert done2 == [] and [r.name for r in g2.node("gx").inputs] == ["g", "x"]


def test_a_relu6_networks_backward_reads_the_relu6_outputs_and_trains_exactly(tmp_path):
    g = build_graph(CompileOptions(model=NET, target="host", budget="100%", out=str(tmp_path / "g"),
                                   batch_size=8, input_shape=(3, 16, 16)), load_target("host"))[2]
    backs = [n for n in g.nodes if n.op == BACKWARD]
    assert len(backs) == 2 and all(g.node(n.inputs[1].name).op == FORWARD for n in backs)
    assert not any(n.op == "aten.clone.default" for n in g.nodes)  # the in-place ReLU6's saved clone is dropped
    bn_outs = {n.inputs[0].name for n in g.nodes if n.op == FORWARD}
    readers = {r.name for n in g.nodes if n.kind == "backward" for r in n.inputs}
    assert len(bn_outs) == 2 and not bn_outs & readers  # read once, by their ReLU6
    out = tmp_path / "plan"
    c = compile_model(CompileOptions(model=NET, target="host", budget="min", out=str(out), batch_size=8,
                                     input_shape=(3, 16, 16), time_limit=15.0))
    r = run_plan(str(out), steps=2, check=True, device="cpu")
    assert r["ok"] and r["max_abs_err"] == 0 and not r["mismatched"], r.get("error")
    assert r["measured_peak_bytes"] == r["predicted_peak_bytes"] <= r["budget_bytes"] == c["budget_bytes"]
