"""C firmware with an int8 frozen prefix (compile --quantize-frozen int8): the lowering, its memory counted to the
byte, its flash figure, the run's check (the prefix bit for bit against the Python integer reference, the head
against autograd), and the errors a model with no int8 prefix gets."""
from __future__ import annotations

import ctypes
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from edgetrain.codegen.c.device_fit import figures_of_firmware, q8_table_bytes
from edgetrain.codegen.c.ops import C_OPS, Q8_OPS
from edgetrain.compiler.errors import UnsupportedModelError
from edgetrain.compiler.pipeline import CompileOptions, compile_model
from edgetrain.compiler.workbench import cli
from edgetrain.compiler.workbench.int8_check import Int8Reference, boundary_mismatches
from edgetrain.codegen.c.runner import run_program, verified_firmware
from edgetrain.compiler.workbench.run import schedule_batches
from edgetrain.compiler.workbench.run_c import run_firmware
from edgetrain.runtime.python.int8_prefix import _quantize

ROOT = Path(__file__).resolve().parents[1]
HAVE_HOST = bool(shutil.which("gcc") and shutil.which("make"))
HAVE_ARM = bool(HAVE_HOST and shutil.which("arm-none-eabi-gcc") and shutil.which("qemu-system-arm"))
needs_host = pytest.mark.skipif(not HAVE_HOST, reason="gcc and make are needed to build the firmware")
needs_arm = pytest.mark.skipif(not HAVE_ARM, reason="arm-none-eabi-gcc / qemu-system-arm missing")


def _compile(out: Path, model: str = "mcu_mbv2_40", **kw) -> dict:
    opts = dict(model=model, target="nrf52840", budget="auto", out=str(out), batch_size=1, emit="c",
                time_limit=20.0, quantize_frozen="int8")
    opts.update(kw)
    return compile_model(CompileOptions(**opts))


@pytest.fixture(scope="module")
def fw(tmp_path_factory):
    out = tmp_path_factory.mktemp("q8fw") / "fw"
    return out, _compile(out)


def test_the_prefix_is_lowered_to_int8_kernel_calls_with_its_constants_in_flash(fw):
    out, summary = fw
    assert summary["int8_prefix"]["nodes"] == 19 and "--calibrate random" in summary["int8_prefix"]["calibration"]
    plan = (out / "plan.c").read_text()
    body = json.loads((out / "schedule.json").read_text())
    convs = [n for n in body["graph"]["nodes"] if n["op"] == "edgetrain.q8_conv2d.default"]
    assert len(convs) == 11 and plan.count("et_q8_conv2d_forward(") >= 11
    assert "et_q8_quantize(4800, ET_F(" in plan and "et_q8_dequantize(" in plan and "et_q8_add(" in plan
    w = convs[0]["attrs"]["q8"]["weight"]
    ident = "p_" + w.replace(".", "_")
    assert f"static const int8_t {ident}[" in plan  # int8 weights, int32 biases: const, in flash
    assert "static const int32_t p_" in plan and "static const et_q8_requant q_convolution =" in plan
    # the flash figure counts the int8/int32 parameters at their sizes and 8 bytes a channel of tables
    params = body["graph"]["params"]
    trained = set(body["graph"]["trainable"])
    bytes_of = {"float32": 4, "int32": 4, "int8": 1}
    frozen = sum(bytes_of[s["dtype"]] * int(np.prod(s["shape"])) for k, s in params.items() if k not in trained)
    tables = q8_table_bytes(n["attrs"] for n in body["graph"]["nodes"])
    assert tables == 8 * sum(n["shape"][1] for n in convs)
    assert summary["frozen_bytes"] == frozen  # the graph's frozen bytes are the int8 sizes
    manifest = json.loads((out / "firmware.json").read_text())
    assert figures_of_firmware(body, manifest).frozen_bytes == frozen + tables
    assert manifest["int8_boundary"] == ["convolution_10_dq"] and manifest["int8_boundary_floats"] == 3200
    # the int8 parameters are not written back (const), the float ones are
    assert all(p["name"] not in {c["attrs"]["q8"]["weight"] for c in convs} for p in manifest["params"])


def test_int8_tensors_count_their_bytes_and_the_live_peak_is_the_prediction(fw):
    out, summary = fw
    manifest = json.loads((out / "firmware.json").read_text())
    body = json.loads((out / "schedule.json").read_text())
    # render refuses a mismatch: the live bytes equal the schedule's activation peak to the byte
    assert manifest["activation_peak_bytes"] == body["predicted"]["peak_bytes"] - manifest["state_bytes"]
    assert manifest["arena_bytes"] >= manifest["activation_peak_bytes"]
    q8 = {n["name"]: n for n in body["graph"]["nodes"] if n["dtype"] == "int8"}
    assert q8 and all(n["op"] in Q8_OPS for n in q8.values())
    conv = next(n for n in q8.values() if n["op"] == "edgetrain.q8_conv2d.default")
    assert conv["workspace_bytes"] > 0  # its int16 scratch, counted while it runs


@needs_host
def test_the_host_firmware_matches_the_integer_reference_bit_for_bit_and_autograd_on_the_head(fw):
    out, _ = fw
    r = run_firmware(str(out), qemu=False, steps=3, check=True)
    assert r["ok"], r.get("error")
    assert r["int8_boundary_mismatches"] == 0 and r["int8_boundary_floats"] == 3200
    assert r["max_rel_err"] < 1e-4 and not r["mismatched"]
    assert len(r["losses"]) == 3


@needs_host
def test_a_reference_one_zero_point_off_is_caught(fw, tmp_path):
    out, _ = fw
    body, manifest = verified_firmware(str(out))
    batches = schedule_batches(body, "random", 1, 1)
    r = run_program(str(out), body, manifest, batches, qemu=False).result
    x = batches[-1][0]
    ref = Int8Reference(body, str(out / "weights.safetensors"))
    assert boundary_mismatches(r["int8_boundary"], ref.flat(x)) == 0
    program = json.loads(ref.program)
    conv = next(s for s in program if s["op"] == "q8_conv2d")
    conv["q8"]["zp"] += 1  # one zero point off: the firmware no longer matches
    ref.program = json.dumps(program)
    assert boundary_mismatches(r["int8_boundary"], ref.flat(x)) > 0


def test_a_model_with_nothing_frozen_gets_one_error(tmp_path):
    with pytest.raises(UnsupportedModelError, match="every parameter of the model trains.*--train"):
        _compile(tmp_path / "a", train="all")


def test_a_first_op_with_no_int8_kernel_gets_one_error(tmp_path):
    model = tmp_path / "pooled.py"
    model.write_text("import torch.nn as nn\n\ndef make():\n    return nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(1, 4, 3), "
                     "nn.Flatten(), nn.Linear(4 * 2 * 2, 3))\n")
    with pytest.raises(UnsupportedModelError, match=r"first op, node `.*` \(aten\.max_pool2d.*has no int8 kernel"):
        _compile(tmp_path / "b", model=f"{model}:make", train="3.*", input_shape=(1, 8, 8))


def test_calibrate_without_quantize_frozen_is_refused(tmp_path):  # Python plans: tests/test_python_int8.py
    code = cli.main(["compile", "mcu_mbv2_40", "--target", "nrf52840", "--emit", "c", "--calibrate", "digits",
                     "--out", str(tmp_path / "d"), "--json"])
    assert code != 0


def test_the_q8_ops_compile_their_sources_into_every_firmware():
    assert {C_OPS[op].kernel for op in Q8_OPS} == {"q8_convert", "q8_conv2d", "q8_relu", "q8_relu6", "q8_qas_sgd"}


@needs_host
def test_quantize_rounds_as_the_python_reference_ties_and_saturation_included(tmp_path):
    so = tmp_path / "libconv.so"
    c_dir = ROOT / "runtime" / "c" / "kernels"
    subprocess.run(["gcc", "-std=c99", "-O2", "-ffp-contract=off", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared",
                    str(c_dir / "q8_convert.c"), "-o", str(so)], check=True)
    lib = ctypes.CDLL(str(so))
    scale, zp = np.float32(0.5), 3
    x = np.array([0.25, 0.75, -0.25, -0.75, 1.25, -1.25, 0.0, 63.0, 64.0, -65.5, -66.0, 1e30, -1e30, 0.2499999,
                  *np.random.default_rng(0).normal(0, 20, 500)], np.float32)
    y = np.zeros(x.size, np.int8)
    lib.et_q8_quantize(ctypes.c_int(x.size), ctypes.c_void_p(x.ctypes.data), ctypes.c_float(scale),
                       ctypes.c_int32(zp), ctypes.c_void_p(y.ctypes.data))
    assert np.array_equal(y, _quantize(x, {"scale": float(scale), "zp": zp}))
    assert y[:4].tolist() == [3, 5, 3, 1]  # 0.5 -> 0, 1.5 -> 2, -0.5 -> 0, -1.5 -> -2 (halves to even), plus zp


@needs_arm
@pytest.mark.slow
def test_under_qemu_the_m4f_kernels_match_the_reference_bit_for_bit(fw):
    """The M4F build runs the fast kernels' real SMLAD/SXTB16 instructions: the same bits as the reference."""
    out, _ = fw
    r = run_firmware(str(out), qemu=True, steps=2, check=True)
    assert r["ok"], r.get("error")
    assert r["int8_boundary_mismatches"] == 0 and not r["mismatched"]
    assert r["flash_bytes"] < 1 << 20 and r["ram_bytes"] < 256 << 10  # it fits the nRF52840


def test_a_measured_target_refuses_an_int8_prefix_in_c_in_one_error(tmp_path):
    """The host target times each node as the Python runtime runs it; an int8 prefix lowered for C firmware has no
    Python call, so the compile says so and what to do (it had crashed in the profiler with a torch error)."""
    from edgetrain.compiler.errors import EdgetrainError

    with pytest.raises(EdgetrainError, match=r"measured target.*node `input_q8`.*device target.*--emit python"):
        compile_model(CompileOptions(model="mcu_mbv2_40", target="host", budget="min", out=str(tmp_path / "c"),
                                     batch_size=1, emit="c", time_limit=10.0, quantize_frozen="int8"))
    assert not (tmp_path / "c").exists()
