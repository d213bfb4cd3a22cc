"""int8 bias training lowered into C firmware (`--int8-biases`: compiler/graph/qas_lower.py, codegen/c/qas_emit.py):
mcu_mbv2_40 with its last block's biases trained in int32 by QAS, the region's float backward replaced by one node
whose workspace the scheduler counts, the host firmware's int32 biases after three steps equal to
runtime/python/int8_qas.py's bit for bit (fed the gradient the firmware's head handed the region), a reference off
by one caught, the ledger equal to the prediction, and the flag's errors."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from edgetrain.codegen.c.device_fit import figures_of_firmware
from edgetrain.compiler.errors import EdgetrainError, UnsupportedModelError
from edgetrain.compiler.graph.ir import OptimizerConfig
from edgetrain.compiler.graph.qas_lower import QAS_BACKWARD
from edgetrain.compiler.pipeline import CompileOptions, compile_model
from edgetrain.compiler.workbench.run_c import run_firmware
from edgetrain.runtime.python import int8_qas

HAVE_HOST = bool(shutil.which("gcc") and shutil.which("make"))
needs_host = pytest.mark.skipif(not HAVE_HOST, reason="gcc and make are needed to build the firmware")
TRAIN = "features.3.*bias,head.1.*,classifier.*"  # the last block's three biases in int8, the head in float32
BIASES = ["features.3.block.0.0.bias", "features.3.block.1.0.bias", "features.3.block.2.0.bias"]


def _opts(out, **kw) -> CompileOptions:
    base = dict(model="mcu_mbv2_40", target="nrf52840", budget="auto", out=str(out), batch_size=1, emit="c",
                time_limit=15.0, train=TRAIN, quantize_frozen="int8", int8_biases=True,
                optimizer=OptimizerConfig("sgd", lr=0.01, momentum=0.9, weight_decay=5e-4))
    base.update(kw)
    return CompileOptions(**base)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("qasfw") / "fw"
    summary = compile_model(_opts(out))
    return out, summary, json.loads((out / "schedule.json").read_text())


def test_the_regions_float_backward_is_one_integer_node_holding_its_int8_masks(compiled):
    _, summary, body = compiled
    nodes = {n["name"]: n for n in body["graph"]["nodes"]}
    qas = [n for n in nodes.values() if n["op"] == QAS_BACKWARD]
    assert len(qas) == 1 and summary["int8_prefix"]["int8_biases"] == BIASES
    node = qas[0]
    # no float backward reads the block's weights any more; the biases are int32 state, trained
    assert not any(n["kind"] == "backward" and n["op"] == "aten.convolution_backward.default" for n in nodes.values())
    assert all(body["graph"]["params"][b]["dtype"] == "int32" for b in BIASES)
    assert set(BIASES) <= set(body["graph"]["trainable"])
    # it reads the head's float gradient at the region's boundary and the ReLU6 outputs it masks with (int8)
    grad, *masks = [r["t"] for r in node["inputs"]]
    assert nodes[grad]["dtype"] == "float32" and nodes[grad]["shape"] == [1, 128, 5, 5]
    assert masks and all(nodes[m]["op"] == "edgetrain.q8_relu6.default" and nodes[m]["dtype"] == "int8" for m in masks)
    # its workspace: two int8 gradients of the largest tail tensor (96x10x10), its int32 input sums, one bias's sums
    assert node["workspace_bytes"] == 2 * 9600 + 4 * 9600 + 4 * 96
    # each mask is live until the node runs
    k = next(i for i, st in enumerate(body["steps"]) if st["tensor"] == node["name"] and st["action"] == "compute")
    for m in masks:
        freed = max(i for i, st in enumerate(body["steps"]) if st["tensor"] == m and st["action"] == "free")
        assert freed > k


def test_the_ledger_is_the_prediction_to_the_byte(compiled):
    out, _, body = compiled
    manifest = json.loads((out / "firmware.json").read_text())
    assert manifest["activation_peak_bytes"] == body["predicted"]["peak_bytes"] - manifest["state_bytes"]
    # int32 biases and their float32 momenta are the trained state beside the float head's
    assert manifest["qas_grad_floats"] == 3200
    assert [p["name"] for p in manifest["params"] if p.get("dtype") == "int32"] == BIASES


@needs_host
def test_the_host_firmware_trains_the_int32_biases_to_the_references_bits(compiled):
    out, _, _ = compiled
    r = run_firmware(str(out), qemu=False, steps=3, check=True)
    assert r["ok"], r.get("error")
    assert r["int8_biases"] == BIASES and r["int8_bias_values"] == 96 + 96 + 32
    assert r["int8_bias_mismatches"] == 0 and r["int8_biases_moved"] > 100  # the biases did move
    assert r["int8_boundary_mismatches"] == 0 and not r["mismatched"]  # the trained region, and the float head
    assert r["losses"] == r["reference_losses"]


@needs_host
def test_a_reference_off_by_one_is_caught(compiled, monkeypatch):
    out, _, _ = compiled
    real = int8_qas.bias_step

    def off_by_one(opt, gb, s_g, b, m, s_b):
        b, m = real(opt, gb, s_g, b, m, s_b)
        b = b.copy()
        b[0] += 1
        return b, m
    monkeypatch.setattr(int8_qas, "bias_step", off_by_one)
    r = run_firmware(str(out), qemu=False, steps=2, check=True)
    assert not r["ok"] and r["error_kind"] == "CheckMismatch" and r["int8_bias_mismatches"] == 3
    assert "int32 biases" in r["error"]


def test_the_flag_without_an_int8_prefix_is_refused(tmp_path):
    with pytest.raises(EdgetrainError, match="--quantize-frozen int8"):
        compile_model(_opts(tmp_path / "a", quantize_frozen=None))


def test_the_flag_with_a_python_plan_is_refused(tmp_path):
    with pytest.raises(EdgetrainError, match="--emit c"):
        compile_model(_opts(tmp_path / "b", emit="python"))


def test_an_optimizer_without_an_integer_update_is_refused(tmp_path):
    with pytest.raises(UnsupportedModelError, match="--int8-biases: .*adam.*--optimizer sgd"):
        compile_model(_opts(tmp_path / "c", optimizer=OptimizerConfig("adam", lr=0.001)))
    assert not (tmp_path / "c").exists()  # refused before anything was written


@pytest.mark.skipif(not (HAVE_HOST and shutil.which("arm-none-eabi-gcc") and shutil.which("qemu-system-arm")),
                    reason="arm-none-eabi-gcc / qemu-system-arm missing")
@pytest.mark.slow
def test_under_qemu_the_m4f_trains_the_same_int32_biases(compiled):
    out, _, _ = compiled
    host = run_firmware(str(out), qemu=False, steps=3, check=False)
    r = run_firmware(str(out), qemu=True, steps=3, check=True)
    assert r["ok"], r.get("error")
    assert r["int8_bias_mismatches"] == 0 and r["int8_boundary_mismatches"] == 0 and not r["mismatched"]
    assert r["params_sha256"] == host["params_sha256"]  # the M4F's state is the host's, bit for bit
    assert r["ram_bytes"] < 256 << 10 and r["flash_bytes"] < 1 << 20
    # the compile's flash estimate, the int8 and bias-training kernels' code included, at or above the build
    fig = figures_of_firmware(json.loads((out / "schedule.json").read_text()),
                              json.loads((out / "firmware.json").read_text()))
    assert r["flash_bytes"] <= fig.flash_bytes <= r["flash_bytes"] + 12 * 1024, (fig, r["flash_bytes"])


@needs_host
def test_a_region_through_a_residual_add_and_strided_convolutions_trains_bit_for_bit(tmp_path):
    """features.1's biases: the gradient goes back through ten convolutions (two depthwise with stride 2) and the
    block's residual add to its first convolution (at 16x16 input, so that the nRF52840's RAM holds the sums)."""
    out = tmp_path / "f1"
    compile_model(_opts(out, train="features.1.*bias,head.1.*,classifier.*", input_shape=(3, 16, 16)))
    body = json.loads((out / "schedule.json").read_text())
    node = next(n for n in body["graph"]["nodes"] if n["op"] == QAS_BACKWARD)
    assert "add" in node["attrs"]["qas"]["tail"]
    assert (out / "plan.c").read_text().count("et_q8_conv2d_backward_input_sums(") == 9
    r = run_firmware(str(out), qemu=False, steps=3, check=True)
    assert r["ok"], r.get("error")
    assert r["int8_bias_values"] == 16 + 128 + 128 and r["int8_bias_mismatches"] == 0 and r["int8_biases_moved"] > 100
    assert r["int8_boundary_mismatches"] == 0 and not r["mismatched"]


@needs_host
def test_a_tiled_prefix_under_the_trained_region_trains_bit_for_bit(tmp_path):
    """A budget below the untiled plan's least (124,040 B): the frozen prefix computed patch by patch, the QAS
    region after it whole; the firmware's biases still the reference's bits."""
    out = tmp_path / "t"
    r = compile_model(_opts(out, budget="100000"))
    assert r["tiled"] and r["peak_bytes"] <= 100_000
    r = run_firmware(str(out), qemu=False, steps=3, check=True)
    assert r["ok"], r.get("error")
    assert r["int8_bias_mismatches"] == 0 and r["int8_boundary_mismatches"] == 0 and not r["mismatched"]


@pytest.mark.skipif(not (HAVE_HOST and shutil.which("arm-none-eabi-gcc") and shutil.which("qemu-system-arm")),
                    reason="arm-none-eabi-gcc / qemu-system-arm missing")
@pytest.mark.slow
def test_mbv2_w035_trains_its_last_blocks_biases_in_int32_on_the_nrf52840(tmp_path):
    """MobileNetV2 at width 0.35 and 128x128, features.17's biases by QAS: fits the nRF52840 (the paging scheduler;
    poet's schedule packs 1,604 B over), and under QEMU its 784 int32 biases are the reference's bits (lr 1e-6: the
    untrained model's activation scales are tiny, and a larger step moves the biases past what int32 sums hold)."""
    from edgetrain.targets import load_target
    from edgetrain.targets.boards import board_of

    out = tmp_path / "w"
    r = compile_model(_opts(out, model="mcu_mbv2_w035", train="features.17.*bias,head.1.*,classifier.*",
                            scheduler="paging", time_limit=30.0, optimizer=OptimizerConfig("sgd", lr=1e-6, momentum=0.9,
                                                                                           weight_decay=5e-4)))
    assert r["tiled"] and r["peak_bytes"] <= r["budget_bytes"]
    res = run_firmware(str(out), qemu=True, steps=2, check=True)
    assert res["ok"], res.get("error")
    assert res["int8_bias_values"] == 784 and res["int8_bias_mismatches"] == 0 and res["int8_biases_moved"] > 300
    assert res["int8_boundary_mismatches"] == 0 and not res["mismatched"]
    assert res["ram_bytes"] + board_of(load_target("nrf52840")).stack_bytes <= 262_144
    assert res["text_bytes"] + res["data_bytes"] <= 1_048_576
