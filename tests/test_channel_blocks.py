"""A CNN head (frozen conv -> trained batch norm -> activation -> mean over H, W) computed in blocks of output
channels (compiler/frontend/channel_blocks.py): the joint graph rewritten has one conv, batch norm and
backward per block and no whole head activation, computes torch's own values bitwise, leaves graphs without the
pattern as they were, and its plans train as eager autograd in Python and in C under QEMU."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
import torch.nn as nn

from edgetrain.compiler.workbench import cli
from edgetrain.compiler.frontend.capture import capture
from edgetrain.compiler.frontend.channel_blocks import block_heads, block_spans, find_heads
from edgetrain.compiler.graph.costs import stream_in
from edgetrain.compiler.graph.aten_node import read_rows
from edgetrain.compiler.graph.streaming import block_rows, sliceable_weights, stream_weights
from edgetrain.compiler.pipeline import CompileOptions, compile_model
from edgetrain.compiler.stages import CompileOptions as StageOptions
from edgetrain.targets.loader import load_target

aten = torch.ops.aten
HAVE_ARM = bool(shutil.which("arm-none-eabi-gcc") and shutil.which("qemu-system-arm") and shutil.which("make"))


class Head(nn.Module):
    """conv (frozen backbone) -> conv -> BN -> act -> pool -> linear; `pool`: "mean" (x.mean((2, 3))) or
    "adaptive" (adaptive_avg_pool2d(1) then flatten)."""

    def __init__(self, act: str = "relu6", pool: str = "mean", frozen: bool = True, groups: int = 1,
                 bias: bool = False) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.conv = nn.Conv2d(8, 24, 1, bias=bias, groups=groups)
        self.bn = nn.BatchNorm2d(24)
        self.act = {"relu6": nn.ReLU6(), "relu": nn.ReLU(), "none": nn.Identity()}[act]
        self.pool, self.fc = pool, nn.Linear(24, 5)
        for p in [*self.stem.parameters(), *self.conv.parameters()]:
            p.requires_grad_(not frozen)

    def forward(self, x):
        y = self.act(self.bn(self.conv(self.stem(x))))
        y = y.mean((2, 3)) if self.pool == "mean" else torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1)
        return self.fc(y)


def _batch(n=3, hw=10):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 3, hw, hw, generator=g), torch.randint(0, 5, (n,), generator=g)


def _run(model, cap, x, y):
    """The captured joint graph on real tensors: (loss, {parameter: gradient}, {buffer: new value})."""
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    args = [state[cap.params.get(n.name) or cap.buffers.get(n.name)] if n.name in cap.params or n.name in cap.buffers
            else (x if n.name == cap.inputs[0] else y) for n in cap.gm.graph.nodes if n.op == "placeholder"]
    with torch.no_grad():
        outs = dict(zip([o.name for o in cap.gm.graph.output_node().args[0]], cap.gm(*args)))
    return (outs[cap.loss], {p: outs[k] for k, p in cap.grads.items()},
            {b: outs[k] for k, b in cap.buffer_updates.items()})


def _count(cap, target) -> int:
    return sum(1 for n in cap.gm.graph.nodes if n.target is target)


@pytest.mark.parametrize("act,pool", [("relu6", "mean"), ("relu", "mean"), ("none", "mean"), ("relu6", "adaptive")])
def test_blocked_head_computes_what_torchs_joint_graph_does_bitwise(act, pool):
    torch.manual_seed(0)
    model = Head(act, pool).train()
    x, y = _batch()
    plain = capture(model, x, y)
    assert len(find_heads(plain)) == 1
    blocked = block_heads(plain, 3)
    assert _count(plain, aten.native_batch_norm_backward.default) == 1  # the capture given is left as it was
    for op in (aten.convolution.default, aten._native_batch_norm_legit_functional.default,
               aten.native_batch_norm_backward.default):
        assert _count(blocked, op) == _count(plain, op) + 2
    # No tensor of the whole head's (N, 24, H, W) shape is left; every block's is (N, 8, H, W).
    whole = [n for n in blocked.gm.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)
             and n.meta["val"].dim() == 4 and n.meta["val"].shape[1] == 24 and n.meta["val"].shape[2:] != (1, 1)]
    assert not whole
    a, b = _run(model, plain, x, y), _run(model, blocked, x, y)
    assert torch.equal(a[0], b[0])
    assert a[1].keys() == b[1].keys() and all(torch.equal(a[1][k], b[1][k]) for k in a[1])
    assert a[2].keys() == b[2].keys() and all(torch.equal(a[2][k], b[2][k]) for k in a[2])


def test_a_trained_conv_is_no_head_to_split_and_one_block_changes_nothing():
    torch.manual_seed(0)
    x, y = _batch()
    cap = capture(Head(frozen=False).train(), x, y)  # the conv's weight has a gradient
    assert find_heads(cap) == [] and block_heads(cap, 4) is cap
    frozen = capture(Head().train(), x, y)
    assert block_heads(frozen, 1) is frozen


def test_a_grouped_conv_or_a_small_cnn_has_no_head_of_the_pattern():
    torch.manual_seed(0)
    grouped = Head().train()
    grouped.conv = nn.Conv2d(8, 24, 1, groups=8, bias=False).requires_grad_(False)
    x, y = _batch()
    assert find_heads(capture(grouped, x, y)) == []
    cnn = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                        nn.Linear(8 * 4 * 4, 5))
    assert find_heads(capture(cnn.train(), x, y)) == []  # a trained conv, a max-pool: nothing to split


def test_block_spans_cover_the_channels_in_order():
    assert block_spans(1280, 8) == [(k * 160, (k + 1) * 160) for k in range(8)]
    assert block_spans(10, 3) == [(0, 4), (4, 7), (7, 10)] and block_spans(4, 9) == [(k, k + 1) for k in range(4)]


def test_compile_chooses_no_blocks_where_the_head_fits(tmp_path):
    """mcu_mbv2_40's head is no bound on the nRF52840: compile leaves it whole (a rewrite that makes the graph
    larger must not change plans that do not need it)."""
    r = compile_model(CompileOptions(model="mcu_mbv2_40", target="nrf52840", budget="auto", emit="c",
                                     out=str(tmp_path / "c"), batch_size=1, time_limit=10.0))
    nodes = json.loads((tmp_path / "c" / "schedule.json").read_text())["graph"]["nodes"]
    assert r["peak_bytes"] <= r["budget_bytes"]
    assert sum(n["op"] == "aten.native_batch_norm_backward.default" for n in nodes) == 1


def test_python_plan_of_a_blocked_head_is_exact(tmp_path, capsys):
    out = tmp_path / "py"
    compile_model(CompileOptions(model="mcu_mbv2_40", target="rpi4", budget="min", out=str(out), batch_size=2,
                                 time_limit=10.0, head_blocks=4))
    nodes = json.loads((out / "schedule.json").read_text())["graph"]["nodes"]
    assert sum(n["op"] == "aten.native_batch_norm_backward.default" for n in nodes) == 4
    rc = cli.main(["run", str(out), "--steps", "2", "--check", "--json"])
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and res["ok"] and res["max_abs_err"] == 0.0, res
    assert res["measured_peak_bytes"] == res["predicted_peak_bytes"] <= res["budget_bytes"]


def test_a_streamed_weight_read_by_row_blocks_pages_in_each_readers_rows_only():
    """The head weight streamed from storage: blocks that divide each block conv's rows, and each conv pages in
    its own rows (not the whole weight)."""
    from edgetrain.compiler.frontend.modelspec import resolve
    from edgetrain.compiler.model_graph import capture_step

    m = resolve("mcu_mbv2_40")
    opts = StageOptions(model="mcu_mbv2_40", target="nrf52840", budget="auto", out="unused", batch_size=1)
    g = capture_step(opts, m, m.module.train(), torch.randn(1, 3, 40, 40), 0).graph(4)
    w = "head.0.weight"
    row = g.params[w].bytes // 128
    assert sliceable_weights(g)[w] == row
    s = stream_weights(g, [w], ram_room=10**6)  # room for all of it: still by blocks, since read by blocks
    readers = [n for n in s.nodes if w in n.streamed]
    assert len(readers) == 4 and all(32 % n.attrs["stream_rows"][w] == 0 for n in readers)
    assert [read_rows(n.attrs["args"][1], 128) for n in readers] == [(0, 32), (32, 64), (64, 96), (96, 128)]
    target = load_target("nrf52840")
    assert all(stream_in(s, n, target)[0] == 32 * row for n in readers)
    assert block_rows(100, 1280, 10**6, (0, 160, 320)) == 160 and block_rows(100, 1280, 6000, (0, 160)) == 20


@pytest.mark.skipif(not HAVE_ARM, reason="arm-none-eabi-gcc / qemu-system-arm missing")
def test_c_firmware_of_a_blocked_head_trains_exactly_under_qemu(tmp_path, capsys):
    """mcu_mbv2_40 on the nRF52840 with its head in 4 blocks: each block's conv reads its weight's rows, each
    block's batch norm its gamma/beta/running statistics' rows, SGD with momentum block by block: exact."""
    out = tmp_path / "c"
    r = compile_model(CompileOptions(model="mcu_mbv2_40", target="nrf52840", budget="auto", emit="c", out=str(out),
                                     batch_size=1, time_limit=10.0, head_blocks=4))
    plan = (out / "plan.c").read_text()
    assert "(p_head_0_weight + 3072)" in plan and "(b_head_1_running_mean + 96)" in plan
    assert plan.count("et_sgd_step(&et_sgd, 32, p_head_1_weight") == 4
    rc = cli.main(["run", str(out), "--qemu", "--steps", "2", "--check", "--json"])
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and res["ok"] and not res["mismatched"] and res["max_abs_err"] < 1e-6, res
    assert r["peak_bytes"] <= r["budget_bytes"]


def test_c_firmware_of_a_blocked_head_at_batch_two_trains_exactly_on_the_host(tmp_path, capsys):
    """At batch 2 a block's share of the features' gradient is strided (each sample's channels apart): the mean's
    backward runs sample by sample; uneven blocks (43, 43, 42 channels)."""
    out = tmp_path / "c"
    compile_model(CompileOptions(model="mcu_mbv2_40", input_shape=(3, 16, 16), target="nrf52840", budget="auto",
                                 emit="c", out=str(out), batch_size=2, time_limit=10.0, head_blocks=3))
    assert (out / "plan.c").read_text().count("et_global_avgpool_backward(1, 43, 4,") == 4
    rc = cli.main(["run", str(out), "--steps", "2", "--check", "--json"])
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and res["ok"] and not res["mismatched"] and res["max_abs_err"] < 1e-6, res


def test_a_head_whose_weight_is_streamed_by_blocks_trains_exactly_in_blocks(tmp_path, capsys):
    """tests/c_models.py's frozen_wide_head: its 1,310,720 B head weight is over the flash and the RAM and paged in
    from storage by blocks of rows. In 4 blocks of 80 channels each block's conv pages in its own rows (the
    weight is read once a step, as whole), the smallest budget falls, and the firmware matches autograd."""
    kw = dict(model="tests.c_models:frozen_wide_head", input_shape=(16, 2, 2), target="nrf52840", budget="auto",
              batch_size=2, emit="c", time_limit=10.0)
    whole = compile_model(CompileOptions(out=str(tmp_path / "whole"), **kw))
    out = tmp_path / "blocks"
    r = compile_model(CompileOptions(out=str(out), head_blocks=4, **kw))
    assert r["paged_bytes_per_step"] == whole["paged_bytes_per_step"] == 1024 * 320 * 4
    assert r["min_feasible_bytes"] < whole["min_feasible_bytes"]
    rc = cli.main(["run", str(out), "--steps", "2", "--check", "--json"])
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and res["ok"] and not res["mismatched"] and res["max_abs_err"] < 1e-6, res


LAST_BIAS = "features.3.*bias,head.1.*,classifier.*"  # mcu_mbv2_40's last block's biases: the head's input trains


def test_a_head_whose_input_needs_a_gradient_sums_the_blocks_shares_of_it():
    """The stem's bias trained: the gradient flows on through the head conv. Each block's batch norm backward gives
    its input's gradient too, the conv's backward on the block's weight rows its share of the conv input's
    gradient, and an add chain sums the shares: the head's own gradients bitwise torch's, the stem's (a sum over
    the head's channels in another order) within float32 rounding, not bitwise."""
    torch.manual_seed(0)
    model = Head().train()
    model.stem.bias.requires_grad_(True)
    x, y = _batch()
    plain = capture(model, x, y)
    assert len(find_heads(plain)) == 1
    blocked = block_heads(plain, 3)
    conv_back = aten.convolution_backward.default
    assert _count(blocked, conv_back) == _count(plain, conv_back) + 2  # one per block where the head's was
    assert _count(blocked, aten.native_batch_norm_backward.default) == 3
    assert _count(blocked, aten.clone.default) == 6  # gamma's and beta's block gradients, out of each tuple
    whole = [n for n in blocked.gm.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)
             and n.meta["val"].dim() == 4 and n.meta["val"].shape[1] == 24 and n.meta["val"].shape[2:] != (1, 1)]
    assert not whole
    shares = [n for n in blocked.gm.graph.nodes if n.target is conv_back and n.args[1].target is not conv_back
              and list(n.args[10]) == [True, False, False]]
    assert [tuple(n.args[2].args[2:4]) for n in shares] == [(0, 8), (8, 16), (16, 24)]  # each block's weight rows
    a, b = _run(model, plain, x, y), _run(model, blocked, x, y)
    assert torch.equal(a[0], b[0]) and a[1].keys() == b[1].keys() and "stem.bias" in a[1]
    for k in a[1]:
        if k == "stem.bias":
            torch.testing.assert_close(b[1][k], a[1][k], rtol=1e-5, atol=1e-7)
        else:
            assert torch.equal(a[1][k], b[1][k]), k
    assert all(torch.equal(a[2][k], b[2][k]) for k in a[2])


def test_python_plan_of_a_blocked_head_with_its_input_trained_is_exact_within_tolerance(tmp_path, capsys):
    out = tmp_path / "py"
    compile_model(CompileOptions(model="mcu_mbv2_40", target="rpi4", budget="min", out=str(out), batch_size=2,
                                 time_limit=10.0, head_blocks=4, train=LAST_BIAS))
    nodes = json.loads((out / "schedule.json").read_text())["graph"]["nodes"]
    shares = [n for n in nodes if n["op"] == "aten.convolution_backward.default"
              and n["attrs"]["args"][2].get("$p") == "head.0.weight"]
    assert len(shares) == 4 and all(n["attrs"]["args"][10] == [True, False, False] for n in shares)
    rc = cli.main(["run", str(out), "--steps", "2", "--check", "--json"])
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and res["ok"] and not res["mismatched"] and res["max_abs_err"] < 1e-5, res
    assert res["measured_peak_bytes"] == res["predicted_peak_bytes"] <= res["budget_bytes"]


def test_c_firmware_of_a_blocked_head_with_its_input_trained_is_exact_within_tolerance_on_the_host(tmp_path, capsys):
    """Uneven blocks (43, 43, 42 channels) at batch 2: each block's input-gradient share has its own shapes."""
    out = tmp_path / "c"
    compile_model(CompileOptions(model="mcu_mbv2_40", input_shape=(3, 16, 16), target="nrf52840", budget="auto",
                                 emit="c", out=str(out), batch_size=2, time_limit=10.0, head_blocks=3,
                                 train=LAST_BIAS))
    assert (out / "plan.c").read_text().count("et_conv2d_backward_input(") >= 3
    rc = cli.main(["run", str(out), "--steps", "2", "--check", "--json"])
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and res["ok"] and not res["mismatched"] and res["max_abs_err"] < 1e-5, res


def test_a_head_weight_read_for_the_inputs_gradient_too_is_streamed_by_blocks():
    """The head's input trained: its weight is read by each block's conv and by each block's input-gradient
    backward, every one of them its own rows, so it still pages in by blocks (half of them the backward's)."""
    from edgetrain.compiler.frontend.modelspec import resolve
    from edgetrain.compiler.frontend.train_select import select_and_apply
    from edgetrain.compiler.model_graph import capture_step

    m = resolve("mcu_mbv2_40")
    model = m.module.train()
    select_and_apply(model, LAST_BIAS)
    opts = StageOptions(model="mcu_mbv2_40", target="nrf52840", budget="auto", out="unused", batch_size=1,
                        train=LAST_BIAS)
    g = capture_step(opts, m, model, torch.randn(1, 3, 40, 40), 0).graph(4)
    w = "head.0.weight"
    assert w in sliceable_weights(g)
    s = stream_weights(g, [w], ram_room=10**6)
    readers = [n for n in s.nodes if w in n.streamed]
    assert sorted(n.op for n in readers) == ["aten.convolution.default"] * 4 + ["aten.convolution_backward.default"] * 4
    row = g.params[w].bytes // 128
    assert all(n.attrs["stream_rows"][w] == 32 and stream_in(s, n, load_target("nrf52840"))[0] == 32 * row
               for n in readers)
