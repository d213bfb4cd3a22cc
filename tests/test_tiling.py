"""A frozen forward prefix computed patch by patch (compiler/graph/tiling.py): the plan's tiles cover the output
once, the tiled graph's smallest budget falls, and both runtimes train exactly as eager autograd does: the
Python plan (edgetrain.patch_forward) and the C firmware under QEMU on the nRF52840's memory (slow)."""
from __future__ import annotations

import json
import re
import shutil

import pytest

from edgetrain.compiler.graph.liveness import analyze
from edgetrain.compiler.graph.tiling import TILED_OP, build_plan, tile_frozen_prefix, tileable_stages, _prefix
from edgetrain.compiler.pipeline import CompileOptions, build_graph, compile_model
from edgetrain.compiler.scheduling.bound import bound_text
from edgetrain.compiler.scheduling.budget import min_budget
from edgetrain.compiler.workbench import cli
from edgetrain.targets import load_target
from edgetrain.targets.boards import board_of

HAVE_ARM = bool(shutil.which("arm-none-eabi-gcc") and shutil.which("qemu-system-arm") and shutil.which("make"))
RAM, FLASH = 256 * 1024, 1024 * 1024


def _graph(emit: str = "c", batch: int = 1, train: str | None = None):
    opts = CompileOptions(model="mcu_mbv2_40", target="nrf52840", budget="auto", out="unused", batch_size=batch,
                          emit=emit, train=train)
    return build_graph(opts, load_target("nrf52840"))[2]


def _low(g) -> int:
    return min_budget(analyze(g))


@pytest.fixture(scope="module")
def graph():
    return _graph()


@pytest.mark.parametrize("grid", [2, 3, 5])
def test_the_tiles_cover_the_output_once_and_every_read_stays_inside(graph, grid):
    source, stages, ops = _prefix(graph)
    assert len(stages) >= 8  # stem, the 128-channel block with its residual, the next block's expansion...
    plan = build_plan(graph, source, stages[:10], ops[:10], grid)
    n, c, h, w = plan["tensors"][-1]
    seen = [[0] * w for _ in range(h)]
    for tile in plan["tiles"]:
        y0, y1, x0, x1 = tile["regions"][-1]
        for y in range(y0, y1):
            for x in range(x0, x1):
                seen[y][x] += 1
        for step in tile["steps"]:
            for g in step:  # a crop lies within its operand's patch
                r = tile["regions"][g["from"]]
                cy, ch, cx, cw = g["crop"]
                assert 0 <= cy and cy + ch <= r[1] - r[0] and 0 <= cx and cx + cw <= r[3] - r[2]
                assert min(g["pad"]) >= 0
    assert all(v == 1 for row in seen for v in row)
    assert len(plan["tiles"]) == grid * grid
    # the packed patch buffers are far below the full-resolution intermediates they replace
    full = sum(4 * t[0] * t[1] * t[2] * t[3] for t in plan["tensors"][1:-1])
    assert 4 * plan["workspace_floats"] < full / 2


def test_tiling_lowers_the_smallest_budget_below_200_kb(graph):
    before = _low(graph)
    t = tile_frozen_prefix(graph, lambda g: _low(g) <= 200_000, _low)
    assert t is not None and before > 400_000 and _low(t.graph) <= 200_000
    node = t.graph.node(t.nodes[-1])
    assert node.op == TILED_OP and node.workspace_bytes == node.attrs["scratch"] > 0
    assert t.added_flops > 0 and node.flops == t.added_flops + sum(graph.node(n).flops for n in t.nodes)
    assert len(t.graph.nodes) == len(graph.nodes) - len(t.nodes) + 1


def test_a_prefix_that_trains_is_not_tiled():
    g = _graph(train="all")
    assert not tileable_stages(g)
    assert tile_frozen_prefix(g, lambda x: True, _low) is None


def test_the_bound_says_tiling_would_lower_it(graph):
    assert "patch by patch" in bound_text(graph)
    assert "freezing the layers up to this one" not in bound_text(graph)


def test_the_python_plan_of_a_tiled_prefix_trains_exactly(tmp_path, capsys):
    out = tmp_path / "py"
    r = compile_model(CompileOptions(model="mcu_mbv2_40", target="nrf52840", budget="400KB", out=str(out),
                                     batch_size=2, time_limit=10.0))
    assert r["min_feasible_bytes"] <= r["budget_bytes"] == 400_000 and r["tiled"][0]["node"]
    body = json.loads((out / "schedule.json").read_text())
    assert [n["op"] for n in body["graph"]["nodes"]].count(TILED_OP) == 1
    rc = cli.main(["run", str(out), "--steps", "2", "--check", "--json"])
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and res["ok"] and res["max_abs_err"] <= 1e-6, res
    assert res["measured_peak_bytes"] == res["predicted_peak_bytes"] <= 400_000
    assert cli.main(["inspect", str(out), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    (t,) = shown["tiled"]
    assert t["replaces"][0] == "convolution" and t["tiles"] == t["grid"] ** 2 and t["patch_bytes"] > 0
    assert shown["smallest_budget_bound"]["remedies"]


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_ARM, reason="arm-none-eabi-gcc / qemu-system-arm missing")
def test_the_c_firmware_fine_tunes_mobilenetv2_style_in_200_kb_on_the_nrf52840(tmp_path, capsys):
    out = tmp_path / "c"
    r = compile_model(CompileOptions(model="mcu_mbv2_40", target="nrf52840", budget="200KB", out=str(out),
                                     batch_size=1, emit="c", time_limit=20.0))
    assert r["peak_bytes"] <= r["budget_bytes"] == 200_000 < 448_600  # untiled, its smallest budget is 448,600 B
    assert "et_patch_gather" in (out / "plan.c").read_text()
    rc = cli.main(["run", str(out), "--qemu", "--steps", "2", "--check", "--json"])
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and res["ok"] and not res["mismatched"], res
    assert res["ram_bytes"] + board_of(load_target("nrf52840")).stack_bytes <= RAM  # .data + .bss + the stack
    assert res["text_bytes"] + res["data_bytes"] <= FLASH
    assert res["instructions_per_step"] > 0 and res["paged_bytes_per_step"] == 0


@pytest.mark.slow
def test_mbv2_w035_at_128x128_is_bounded_by_its_tiled_prefix_not_its_input_or_head(tmp_path, capsys):
    """tiny-training's setting in float32. Its trained head, whole, would hold 329,860 B with the training state;
    compile computes it in 8 blocks of 160 channels. Its input batch (196,608 B), which the first layer read whole,
    is read from storage by the tiled stem's patches. Neither refuses it before any solve any more: the smallest
    budget is bounded by the tiled frozen prefix's patches, over the RAM, and the refusal says so, none negative."""
    rc = cli.main(["compile", "mcu_mbv2_w035", "--target", "nrf52840", "--emit", "c", "--batch-size", "1",
                   "--out", str(tmp_path / "w"), "--time-limit", "20", "--json"])
    out = capsys.readouterr()
    msg = json.loads(out.out.strip().splitlines()[-1])["error"]["message"]
    assert rc == 2 and not re.search(r"-\d", msg) and "fixed state alone" not in msg, msg
    said = out.out + out.err
    assert "8 blocks of 160 channels" in said and "reading the input batch (196608 B) from storage" in said
    need = int(msg.split("needs at least ")[1].split(" B")[0])
    assert need > 244_692 and "edgetrain.patch_forward" in msg, msg  # the tiled prefix bounds it


def test_the_floor_no_tiling_splits_is_below_every_tiled_graphs_smallest_budget(graph):
    """untiled_bound is a lower bound: whatever prefix and grid the tiling pass picks, the smallest budget of the
    tiled graph is at or above it, and the untiled graph's own smallest budget is far above it."""
    from edgetrain.compiler.graph.tiling import _cuts, tiled_graph
    from edgetrain.compiler.scheduling.bound import untiled_bound

    floor = untiled_bound(graph, analyze(graph)).budget_bytes
    source, stages, ops = _prefix(graph)
    lows = [_low(tiled_graph(graph, source, stages[:cut], ops[:cut], grid)[0])
            for cut in _cuts(graph, stages) for grid in (2, 4, 8)]
    assert floor <= min(lows) and _low(graph) > 2 * floor


def _random_chain(rng) -> list:
    layers = []
    for _ in range(rng.randint(2, 5)):
        layers.append(("conv", rng.choice([4, 6, 8]), rng.choice([1, 3, 5]), rng.choice([1, 1, 2]),
                       rng.choice([1, 1, 2]), rng.random() < 0.4))
        if rng.random() < 0.7:
            layers.append((rng.choice(["relu", "relu6"]),))
    return layers


@pytest.mark.parametrize("seed", range(12))
def test_patch_forward_equals_the_whole_forward_on_random_chains(seed):
    """Random frozen chains (kernels 1/3/5, strides, dilations, depthwise with residuals) on random sizes, every
    grid that the output allows: edgetrain.patch_forward gives what the untiled layers give."""
    import random

    import torch

    from edgetrain.compiler.graph.tiling import _cuts, tiled_graph
    from edgetrain.runtime.python.patch_forward import patch_forward
    from tests.c_models import frozen_chain

    rng = random.Random(seed)
    layers, hw = _random_chain(rng), (rng.randint(9, 19), rng.randint(9, 19))
    opts = CompileOptions(model="tests.c_models:frozen_chain", input_shape=(3, *hw), target="nrf52840",
                          budget="auto", out="unused", batch_size=2, model_kwargs={"layers": [list(v) for v in layers]})
    _, model, g = build_graph(opts, load_target("nrf52840"))
    source, stages, ops = _prefix(g)
    cut = max(_cuts(g, stages), default=None)
    if cut is None:
        pytest.skip("a chain of one op: nothing to tile")
    x = torch.randn(2, 3, *hw, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        want = model.features(x)
    assert cut == len(stages) and g.nodes[stages[-1] + 1].op == "aten.mean.dim"  # the whole chain is the prefix
    assert g.nodes[stages[-1]].shape == tuple(want.shape)
    named = dict(model.named_parameters())
    for grid in range(2, min(want.shape[2:]) + 1):
        tg, _ = tiled_graph(g, source, stages[:cut], ops[:cut], grid)
        node = tg.node(g.nodes[stages[cut - 1]].name)
        got = patch_forward(x, [named[p] for p in node.params], node.attrs["args"][2])
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed", range(8))
def test_a_second_segment_tiled_from_the_first_ones_output_computes_the_whole_forward(seed):
    """A random frozen chain tiled in two segments (the first up to a cut, the rest from its output on, each on
    its own grid): the second's prefix reads the first tiled node, and the two patch_forward calls in turn give
    what the untiled layers give."""
    import random

    import torch

    from edgetrain.compiler.graph.tiling import _cuts, tiled_graph
    from edgetrain.runtime.python.patch_forward import patch_forward

    rng = random.Random(100 + seed)
    layers = _random_chain(rng) + _random_chain(rng)
    hw = (rng.randint(12, 24), rng.randint(12, 24))
    opts = CompileOptions(model="tests.c_models:frozen_chain", input_shape=(3, *hw), target="nrf52840",
                          budget="auto", out="unused", batch_size=2, model_kwargs={"layers": [list(v) for v in layers]})
    _, model, g = build_graph(opts, load_target("nrf52840"))
    source, stages, ops = _prefix(g)
    cuts = [c for c in _cuts(g, stages) if c <= len(stages) - 2 and min(g.nodes[stages[c - 1]].shape[2:]) >= 2]
    if not cuts or min(g.nodes[stages[-1]].shape[2:]) < 2:
        pytest.skip("no cut leaves two nodes after it, or an output too small for a grid")
    cut = rng.choice(cuts)
    first = g.nodes[stages[cut - 1]]
    tg, _ = tiled_graph(g, source, stages[:cut], ops[:cut], rng.randint(2, min(first.shape[2:])))
    source2, stages2, ops2 = _prefix(tg)
    assert source2 == first.name and tg.node(source2).op == TILED_OP and len(stages2) == len(stages) - cut
    assert set(tileable_stages(tg)) <= set(stages2)  # the segment after the tiled one is what may be tiled next
    cut2 = max(_cuts(tg, stages2))
    assert cut2 == len(stages2)  # the rest of the chain, up to the pooling
    last = tg.nodes[stages2[-1]]
    tg2, _ = tiled_graph(tg, source2, stages2, ops2, rng.randint(2, min(last.shape[2:])))
    assert [n.op for n in tg2.nodes].count(TILED_OP) == 2
    named = dict(model.named_parameters())
    x = torch.randn(2, 3, *hw, generator=torch.Generator().manual_seed(seed))
    y = x
    for node in (n for n in tg2.nodes if n.op == TILED_OP):
        y = patch_forward(y, [named[p] for p in node.params], node.attrs["args"][2])
    with torch.no_grad():
        torch.testing.assert_close(y, model.features(x), rtol=1e-5, atol=1e-6)


def test_segments_are_tiled_until_the_graph_fits():
    """MbV2-w0.35 at 3x66x66 for the nRF52840, its input batch read from storage by the patches (as compile's
    tile_to_fit counts it): one segment leaves a forward node after it over the RAM left; a second, from the first
    one's output, brings the smallest budget under it. Each segment lowers it."""
    from edgetrain.codegen.c.backend import CBackend
    from edgetrain.compiler.graph.input_storage import input_in_storage, with_input_in_storage as stored
    from edgetrain.compiler.graph.tiling import tile_segments

    target = load_target("nrf52840")
    g = build_graph(CompileOptions(model="mcu_mbv2_w035", input_shape=(3, 66, 66), target="nrf52840", budget="auto",
                                   out="unused", batch_size=1, emit="c"), target)[2]

    def room(x):
        return CBackend().device_room(stored(x), target).bytes

    segs = tile_segments(g, lambda x: _low(stored(x)) <= room(x), lambda x: _low(stored(x)))
    lows = [_low(g)] + [_low(stored(t.graph)) for t in segs]
    want = room(segs[-1].graph)
    assert len(segs) == 2 and lows[1] > want >= lows[2] and lows == sorted(lows, reverse=True), lows
    assert want == room(g) + 4 * 3 * 66 * 66 and input_in_storage(stored(segs[-1].graph))  # no input buffer then
    assert segs[1].graph.node(segs[1].nodes[-1]).inputs[0].name == segs[0].nodes[-1]  # reads the first one's output
    assert tile_segments(g, lambda x: True, _low)[0].grid == tile_frozen_prefix(g, lambda x: True, _low).grid


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_ARM, reason="arm-none-eabi-gcc / qemu-system-arm missing")
def test_mbv2_w035_trains_in_float32_on_the_nrf52840_at_68x68_with_two_tiled_segments(tmp_path, capsys):
    """tiny-training's MbV2-w0.35 (backbone frozen, the head's batch norm and the classifier trained, SGD with
    momentum) at the largest square input its float32 plan fits the nRF52840 with (70x70: two segments leave
    257,144 B, over the 244,692 B the RAM leaves): the input batch read from storage by the first segment's
    patches, two tiled segments, the 573,440 B head weight streamed by output-channel blocks, exact under QEMU
    within 256 KB of RAM and 1 MB of flash."""
    out = tmp_path / "c"
    r = compile_model(CompileOptions(model="mcu_mbv2_w035", input_shape=(3, 68, 68), target="nrf52840", budget="auto",
                                     out=str(out), batch_size=1, emit="c", time_limit=30.0))
    assert len(r["tiled"]) == 2 and r["peak_bytes"] <= r["budget_bytes"] and r["input_read_bytes_per_step"] > 0
    rc = cli.main(["run", str(out), "--qemu", "--steps", "2", "--check", "--json"])
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and res["ok"] and not res["mismatched"] and res["max_abs_err"] < 1e-6, res
    assert res["ram_bytes"] + board_of(load_target("nrf52840")).stack_bytes <= RAM  # .data + .bss + the stack
    assert res["text_bytes"] + res["data_bytes"] <= FLASH
    assert res["paged_bytes_per_step"] >= 573_440 and res["instructions_per_step"] > 0
    assert res["input_read_bytes"] == [r["input_read_bytes_per_step"]] * 2


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 9, 16, 17])
def test_the_c_firmware_of_a_tiled_random_chain_trains_exactly_on_the_host(seed, tmp_path, capsys):
    """The same random chains through the C firmware (built for the host): compile asks for the smallest budget
    a tiling reaches, and the run matches autograd."""
    import random

    rng = random.Random(seed)
    layers, hw = _random_chain(rng), (rng.randint(9, 19), rng.randint(9, 19))
    kw = dict(model="tests.c_models:frozen_chain", input_shape=(3, *hw), target="nrf52840", batch_size=2,
              emit="c", model_kwargs={"layers": [list(v) for v in layers]}, time_limit=10.0)
    g = build_graph(CompileOptions(budget="auto", out="unused", **kw), load_target("nrf52840"))[2]
    t = tile_frozen_prefix(g, lambda x: False, _low)
    if t is None:
        pytest.skip("no tiling lowers this chain's smallest budget")
    out = tmp_path / "c"
    r = compile_model(CompileOptions(budget=str(_low(t.graph)), out=str(out), **kw))
    assert r["min_feasible_bytes"] < _low(g)
    assert "et_patch_gather" in (out / "plan.c").read_text() or "et_patch_place" in (out / "plan.c").read_text()
    rc = cli.main(["run", str(out), "--steps", "2", "--check", "--json"])
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and res["ok"] and not res["mismatched"], res


def test_a_tiled_python_plan_stays_within_its_budget_in_real_memory():
    """benchmarks/memory.py's row in its own process: the resident-set growth of a steady step, plus the state,
    within the budget that only a tiling reaches (rpi4, its kernel scratch counted: untiled 1,625,080 B)."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, root)
    from benchmarks.memory_probe import cpu_probe_available

    if not cpu_probe_available():
        pytest.skip("needs Linux's resettable resident-set high-water mark")
    r = subprocess.run([sys.executable, os.path.join(root, "benchmarks", "memory.py"), "--child", "mcu_mbv2_40", "1MB",
                        "--target", "rpi4", "--batch-size", "2", "--time-limit", "10"], capture_output=True, text=True,
                       cwd=root, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    row = json.loads(r.stdout.strip().splitlines()[-1])
    assert row["schedule_peak_bytes"] <= row["budget_bytes"] == 1_000_000 and row["ok"], row
