"""An int8 frozen prefix computed patch by patch (compiler/graph/tiling.py's int8 plan): its patches a byte an
element, a convolution's operand padded with its input's zero point, the q8 kernels per patch; tiling changes no
int8 value (the integer reference tile by tile against the whole tensors, every grid and cut), the workspace counted
to the byte, and the firmware's boundary equal to the reference's bit for bit (host, and the M4F under QEMU)."""
from __future__ import annotations

import ctypes
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from edgetrain.compiler.graph.ir import TrainingGraph
from edgetrain.codegen.c.device_fit import figures_of_firmware, q8_table_bytes
from edgetrain.compiler.graph.quantize import prefix_program, q8_layers
from edgetrain.compiler import passes
from edgetrain.compiler.graph.tiling import TILED_OP, Tiling, _cuts, _prefix, tiled_graph
from edgetrain.compiler.pipeline import CompileOptions, compile_model
from edgetrain.compiler.workbench.int8_check import Int8Reference
from edgetrain.compiler.workbench.run_c import run_firmware
from edgetrain.runtime.python import int8_prefix
from edgetrain.runtime.python.int8_prefix import _quantize, run_prefix, untiled

ROOT = Path(__file__).resolve().parents[1]
HAVE_HOST = bool(shutil.which("gcc") and shutil.which("make"))
HAVE_ARM = bool(HAVE_HOST and shutil.which("arm-none-eabi-gcc") and shutil.which("qemu-system-arm"))
needs_host = pytest.mark.skipif(not HAVE_HOST, reason="gcc and make are needed to build the firmware")
needs_arm = pytest.mark.skipif(not HAVE_ARM, reason="arm-none-eabi-gcc / qemu-system-arm missing")
UNTILED_LEAST = 122_248  # mcu_mbv2_40's smallest budget with its int8 prefix whole (batch 1, nrf52840)
BUDGET = 65_000  # below it: the prefix must be tiled to fit


def _compile(out: Path, budget) -> dict:
    return compile_model(CompileOptions(model="mcu_mbv2_40", target="nrf52840", budget=budget, out=str(out),
                                        batch_size=1, emit="c", time_limit=15.0, quantize_frozen="int8"))


@pytest.fixture(scope="module")
def tiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("q8tile") / "fw"
    summary = _compile(out, str(BUDGET))
    body = json.loads((out / "schedule.json").read_text())
    return out, summary, body


def _node(body: dict) -> dict:
    return next(n for n in body["graph"]["nodes"] if n["op"] == TILED_OP)


def _inputs(body: dict, k: int) -> list[np.ndarray]:
    shape = body["graph"]["input_shape"]
    rng = np.random.default_rng(k)
    # standard normal (the calibration's), wide values that saturate the input's int8 range, and exact ties
    return [rng.normal(0, 1, shape).astype(np.float32), rng.normal(0, 8, shape).astype(np.float32),
            np.round(rng.normal(0, 4, shape)).astype(np.float32) / 2]


def test_a_budget_below_the_untiled_least_tiles_the_int8_prefix(tiled):
    out, summary, body = tiled
    node = _node(body)
    plan = json.loads(node["attrs"]["args"][2])
    assert node["dtype"] == "int8" and plan["dtype"] == "int8"
    assert [op["op"] for op in plan["ops"]][:3] == ["q8_quantize", "q8_conv2d", "q8_relu6"]
    assert len(plan["tiles"]) > 1 and summary["peak_bytes"] <= BUDGET < UNTILED_LEAST
    assert all(v % 4 == 0 for v in plan["buffers"].values()) and plan["workspace_bytes"] % 4 == 0  # whole words
    # the workspace: the patch buffers, then the largest int8 convolution's int16 scratch, on whole words
    windows = [int(np.prod(body["graph"]["params"][op["q8"]["weight"]]["shape"][1:]))
               for op in plan["ops"] if op["op"] == "q8_conv2d"]
    scratch = max(2 * (2 * w + (w + 4) // 2) for w in windows)  # et_q8_conv2d_scratch_size, in bytes
    assert node["workspace_bytes"] == -(-(plan["workspace_bytes"] + scratch) // 4) * 4
    # a patch a byte an element: the largest patch of the expansion's output is its region's element count
    regions = [t["regions"][2] for t in plan["tiles"]]
    c = plan["tensors"][2][1]
    assert max(c * (r[1] - r[0]) * (r[3] - r[2]) for r in regions) <= plan["workspace_bytes"]


def test_the_firmware_pads_with_the_zero_point_and_runs_the_q8_kernels_per_patch(tiled):
    out, _, body = tiled
    plan = json.loads(_node(body)["attrs"]["args"][2])
    text = (out / "plan.c").read_text()
    tiles = len(plan["tiles"])
    convs = [op for op in plan["ops"] if op["op"] == "q8_conv2d"]
    # the float batch read from storage, each tile's crop quantised as it is read (tests/test_input_stream.py)
    assert text.count("et_q8_patch_quantize_read(x,") >= tiles and text.count("et_q8_patch_place(") >= tiles
    assert text.count("et_q8_conv2d_forward(&(const et_conv2d_shape)") >= tiles * len(convs)
    assert "et_patch_gather(" not in text  # no float patch
    padded = [line for line in text.splitlines() if "et_q8_patch_gather(" in line]
    first = convs[0]["q8"]["x_zp"]
    assert first != 0 and any(line.strip().split(",")[-2].strip() == str(first) for line in padded)
    # one requantisation table per convolution, tiled or not, each counted in the flash figure
    layers = [q for n in body["graph"]["nodes"] for q in q8_layers(n["attrs"]) if "weight" in q]
    assert len(layers) == 11 and text.count("static const et_q8_requant q_") == 11
    params = body["graph"]["params"]
    assert q8_table_bytes(n["attrs"] for n in body["graph"]["nodes"]) == 8 * sum(params[q["weight"]]["shape"][0]
                                                                                 for q in layers)
    manifest = json.loads((out / "firmware.json").read_text())
    trained = set(body["graph"]["trainable"])
    frozen = sum({"float32": 4, "int32": 4, "int8": 1}[v["dtype"]] * int(np.prod(v["shape"]))
                 for k, v in params.items() if k not in trained)
    assert figures_of_firmware(body, manifest).frozen_bytes == frozen + 8 * sum(params[q["weight"]]["shape"][0]
                                                                               for q in layers)


def test_the_ledger_is_the_prediction_to_the_byte(tiled):
    out, _, body = tiled
    manifest = json.loads((out / "firmware.json").read_text())
    # render refuses a mismatch; here the figures themselves
    assert manifest["activation_peak_bytes"] == body["predicted"]["peak_bytes"] - manifest["state_bytes"]
    assert manifest["activation_peak_bytes"] + manifest["state_bytes"] <= BUDGET


def test_the_tiled_reference_equals_the_whole_tensors_reference_bit_for_bit(tiled):
    out, _, body = tiled
    ref = Int8Reference(body, str(out / "weights.safetensors"))
    whole = untiled(ref.program)
    assert "q8_patches" in ref.program and "q8_patches" not in whole
    for x in _inputs(body, 0):
        a, b = run_prefix(ref.program, ref.values, x), run_prefix(whole, ref.values, x)
        assert a.keys() == b.keys() and all(np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32)) for k in a)


def test_every_grid_and_cut_gives_the_same_int8_values(tmp_path):
    """Tiling must not change an int8 value: the untiled prefix's graph tiled at each cut and grid."""
    out = tmp_path / "fw"
    _compile(out, "auto")  # fits whole: no tiling
    body = json.loads((out / "schedule.json").read_text())
    g = TrainingGraph.from_json(body["graph"])
    assert not any(n.op == TILED_OP for n in g.nodes)
    ref = Int8Reference(body, str(out / "weights.safetensors"))
    xs = _inputs(body, 1)[:2]
    want = [run_prefix(ref.program, ref.values, x) for x in xs]
    source, stages, ops = _prefix(g)
    assert ops[0]["op"] == "q8_quantize" and len(stages) == 20  # the quantisation and the 19 int8 nodes
    cuts = _cuts(g, stages)
    tried = 0
    for k in (cuts[0], cuts[len(cuts) // 2], cuts[-1]):  # the shortest, a middle and the whole prefix
        for grid in (2, 3, 5, 8):  # even and odd splits, halos overlapping most at 8
            if grid > min(g.nodes[stages[k - 1]].shape[2:]):
                continue
            tg, _ = tiled_graph(g, source, stages[:k], ops[:k], grid)
            program = prefix_program(tg)
            for x, w in zip(xs, want):
                got = run_prefix(program, ref.values, x)
                assert all(np.array_equal(got[n].view(np.uint32), w[n].view(np.uint32)) for n in w), (k, grid)
            tried += 1
    assert tried >= 8
    # a further segment, from the first one's whole int8 output on (its convolution padding that tensor's patches)
    k1 = next(k for k in cuts if k < len(ops) and ops[k]["op"] == "q8_conv2d")
    tg, _ = tiled_graph(g, source, stages[:k1], ops[:k1], 2)
    source2, stages2, ops2 = _prefix(tg)
    assert source2 == g.nodes[stages[k1 - 1]].name and ops2[0]["op"] == "q8_conv2d"
    k2 = _cuts(tg, stages2)[-1]
    tg2, _ = tiled_graph(tg, source2, stages2[:k2], ops2[:k2], 3)
    program = prefix_program(tg2)
    assert json.loads(program)[1]["op"] == "q8_patches" and json.loads(program)[1]["inputs"] == [source2]
    for x, w in zip(xs, want):
        got = run_prefix(program, ref.values, x)
        assert all(np.array_equal(got[n].view(np.uint32), w[n].view(np.uint32)) for n in w)


def test_a_patch_padded_with_0_not_the_zero_point_is_caught(tiled, monkeypatch):
    out, _, body = tiled
    ref = Int8Reference(body, str(out / "weights.safetensors"))
    x = _inputs(body, 2)[0]
    whole = run_prefix(untiled(ref.program), ref.values, x)
    real = int8_prefix._operand
    monkeypatch.setattr(int8_prefix, "_operand", lambda patches, g, pad: real(patches, g, 0))
    wrong = run_prefix(ref.program, ref.values, x)
    assert any(not np.array_equal(wrong[k], whole[k]) for k in whole)


@needs_host
def test_the_q8_patch_kernels_are_the_references_copies_and_quantisation(tmp_path):
    so = tmp_path / "libq8patch.so"
    c_dir = ROOT / "runtime" / "c" / "kernels"
    subprocess.run(["gcc", "-std=c99", "-O2", "-ffp-contract=off", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared",
                    str(c_dir / "q8_patch.c"), str(c_dir / "q8_convert.c"), str(c_dir.parent / "storage_input.c"),
                    "-o", str(so)], check=True)
    lib = ctypes.CDLL(str(so))
    rng = np.random.default_rng(3)
    p = lambda a: ctypes.c_void_p(a.ctypes.data)  # noqa: E731
    src = rng.integers(-128, 128, (2, 3, 9, 11), dtype=np.int8)
    y, h, x, w, top, bottom, left, right, pad = 2, 5, 3, 6, 1, 2, 0, 1, -7
    dst = np.zeros((2, 3, top + h + bottom, left + w + right), np.int8)
    lib.et_q8_patch_gather(2, 3, 9, 11, p(src), y, h, x, w, top, bottom, left, right, ctypes.c_int32(pad), p(dst))
    want = np.pad(src[:, :, y:y + h, x:x + w], ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=pad)
    assert np.array_equal(dst, want)
    whole = np.zeros((2, 3, 9, 11), np.int8)
    patch = src[:, :, :4, :5].copy()
    lib.et_q8_patch_place(2, 3, 4, 5, p(patch), 9, 11, 3, 6, p(whole))
    assert np.array_equal(whole[:, :, 3:7, 6:11], patch) and not whole[:, :, :3].any()
    f = rng.normal(0, 30, (1, 2, 7, 8)).astype(np.float32)
    q = np.zeros((1, 2, 4, 3), np.int8)
    lib.et_q8_patch_quantize(1, 2, 7, 8, p(f), 1, 4, 5, 3, ctypes.c_float(0.25), ctypes.c_int32(-3), p(q))
    assert np.array_equal(q, _quantize(f[:, :, 1:5, 5:8], {"scale": 0.25, "zp": -3}))


@needs_host
def test_the_host_firmware_matches_the_tiled_reference_bit_for_bit(tiled):
    out, _, _ = tiled
    r = run_firmware(str(out), qemu=False, steps=2, check=True)
    assert r["ok"], r.get("error")
    assert r["int8_boundary_mismatches"] == 0 and r["int8_boundary_floats"] == 3200 and not r["mismatched"]


@needs_arm
@pytest.mark.slow
def test_under_qemu_the_tiled_int8_prefix_matches_the_reference_bit_for_bit(tiled):
    out, _, _ = tiled
    r = run_firmware(str(out), qemu=True, steps=2, check=True)
    assert r["ok"], r.get("error")
    assert r["int8_boundary_mismatches"] == 0 and not r["mismatched"]
    assert r["arena_bytes"] + 13_400 <= BUDGET and r["ram_bytes"] < 256 << 10


def _two_segments(g, fits, min_bytes):
    """The frozen prefix tiled in two segments (2x2, then 3x3 from the first's whole int8 output on, through a
    padded convolution), whatever the budget: the firmware's patches of an int8 tensor (not the float input)
    gathered and padded with its zero point."""
    source, stages, ops = _prefix(g)
    k1 = next(k for k in _cuts(g, stages) if k < len(ops) and ops[k]["op"] == "q8_conv2d")
    tg, added = tiled_graph(g, source, stages[:k1], ops[:k1], 2)
    first = Tiling(tuple(g.nodes[s].name for s in stages[:k1]), 2, tg, added)
    source2, stages2, ops2 = _prefix(tg)
    padded = [k for k in _cuts(tg, stages2) if any(op["op"] == "q8_conv2d" and any(op["padding"]) for op in ops2[:k])]
    second = [tiled_graph(tg, source2, stages2[:k], ops2[:k], 3) + (k,) for k in padded]
    tg2, added2, k2 = min(second, key=lambda t: min_bytes(t[0]))  # the one the budget below fits
    return [first, Tiling(tuple(tg.nodes[s].name for s in stages2[:k2]), 3, tg2, added2)]


@needs_host
def test_a_second_int8_segment_runs_bit_for_bit_in_the_firmware(tmp_path, monkeypatch):
    monkeypatch.setattr(passes, "tile_segments", _two_segments)
    out = tmp_path / "fw"
    _compile(out, "100000")
    body = json.loads((out / "schedule.json").read_text())
    tiled_nodes = [n for n in body["graph"]["nodes"] if n["op"] == TILED_OP]
    assert len(tiled_nodes) == 2 and tiled_nodes[1]["inputs"][0]["t"] == tiled_nodes[0]["name"]
    r = run_firmware(str(out), qemu=False, steps=1, check=True)
    assert r["ok"], r.get("error")
    assert r["int8_boundary_mismatches"] == 0 and r["int8_boundary_floats"] == 3200


@pytest.mark.slow
@needs_arm
def test_mbv2_w035_trains_at_128x128_on_the_nrf52840_with_an_int8_tiled_prefix(tmp_path, capsys):
    """tiny-training's setting on its own chip: MbV2-w0.35 at 3x128x128, batch 1, the backbone frozen and int8, the
    head conv's batch norm and the classifier trained in float32 (SGD with momentum), `--budget auto`. The int8
    prefix is tiled from the input quantised as it is read from storage, the head computed in channel blocks (its
    convolutions float32: the blocks share one weight); under QEMU the prefix equals the integer reference bit for
    bit, the head autograd's, within 256 KB of RAM with the stack and 1 MB of flash, the estimate at or above both."""
    from edgetrain.compiler.workbench import cli
    from edgetrain.targets import load_target
    from edgetrain.targets.boards import board_of

    out = tmp_path / "w"
    r = compile_model(CompileOptions(model="mcu_mbv2_w035", target="nrf52840", budget="auto", out=str(out),
                                     batch_size=1, emit="c", time_limit=30.0, quantize_frozen="int8"))
    assert r["tiled"] and r["peak_bytes"] <= r["budget_bytes"] and r["input_read_bytes_per_step"] > 196_608
    rc = cli.main(["run", str(out), "--qemu", "--steps", "2", "--check", "--json"])
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and res["ok"] and res["int8_boundary_mismatches"] == 0 and res["max_abs_err"] < 1e-6, res
    ram = res["ram_bytes"] + board_of(load_target("nrf52840")).stack_bytes
    assert ram <= 262_144 and res["text_bytes"] + res["data_bytes"] <= 1_048_576, res
    fig = figures_of_firmware(json.loads((out / "schedule.json").read_text()),
                              json.loads((out / "firmware.json").read_text()))
    assert fig.flash_bytes >= res["text_bytes"] + res["data_bytes"] and fig.ram_bytes >= ram, (fig, res)


@pytest.mark.slow
@needs_arm
def test_mbv2_w035_trains_its_last_blocks_biases_at_128x128_on_the_nrf52840(tmp_path, capsys):
    """As above with features.17's biases trained too (tiny-training's sparse update of the last blocks' biases):
    the gradient flows through the head conv, so each head block's input-gradient share is summed into one tensor;
    features.17 runs in float32 with its frozen weights in flash (its biases by SGD with momentum); the head
    weight is streamed from storage by the blocks' rows (read forward and backward). Under QEMU the prefix (up to
    features.16's residual add) equals the integer reference bit for bit; the rest autograd's within the check's
    tolerance (the shares summed in another order than torch's one convolution backward: not bitwise)."""
    from edgetrain.compiler.workbench import cli
    from edgetrain.targets import load_target
    from edgetrain.targets.boards import board_of

    out = tmp_path / "w"
    r = compile_model(CompileOptions(model="mcu_mbv2_w035", target="nrf52840", budget="auto", out=str(out),
                                     batch_size=1, emit="c", time_limit=30.0, quantize_frozen="int8",
                                     train="features.17.*bias,head.1.*,classifier.*"))
    assert r["tiled"] and r["peak_bytes"] <= r["budget_bytes"]
    g = TrainingGraph.from_json(json.loads((out / "schedule.json").read_text())["graph"])
    assert g.streamed_params == ("head.0.weight",)
    assert {"features.17.block.0.0.bias", "features.17.block.2.0.bias"} <= set(g.trainable_params)
    # One step: this untrained model's features.17 activations are about 1e-6, and after one update its biases
    # leave their exact zeros, so a second step's ReLU6 masks are decided by float32 rounding (eager with those
    # convolutions summed in float64 moves the same three biases by 2e-5 to 8e-5): no float32 order holds another's
    rc = cli.main(["run", str(out), "--qemu", "--steps", "1", "--check", "--json"])
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and res["ok"] and res["int8_boundary_mismatches"] == 0 and not res["mismatched"], res
    assert res["int8_boundary_floats"] == 56 * 4 * 4
    ram = res["ram_bytes"] + board_of(load_target("nrf52840")).stack_bytes
    assert ram <= 262_144 and res["text_bytes"] + res["data_bytes"] <= 1_048_576, res
