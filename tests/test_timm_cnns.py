"""Real CNNs from timm and Hugging Face reach the C firmware (tests/timm_models.py: timm's MobileNetV3, GhostNet,
RepViT and EfficientNet as timm builds them, untrained; transformers' ResNet from a small config).

Fast: every model's whole training graph (all parameters trained, so every backward op is there) lowers for the C
runtime, GhostNet's in-place residual's copies included; at a batch of two, GhostNet's channel slices are refused
in one error that gives each op its line in the model's code. Slow: each compiles for mps2-an386 within the RAM the
board links (--budget auto), its last layer trained, and trains under QEMU as eager autograd does: ResNet, RepViT and
EfficientNet within the check's tolerance; MobileNetV3 and GhostNet, whose last stage normalizes 4 values a channel
(2x2, batch 1), to float32's rounding: their running statistics differ from float64 arithmetic no more than eager
float32 torch's do (within 3x), while the check's rtol of 1e-5 is below what eager torch itself reaches there.
"""
from __future__ import annotations

import shutil

import pytest

from edgetrain.codegen.backends import backend_for
from edgetrain.compiler.errors import UnsupportedModelError
from edgetrain.compiler.graph.ir import OptimizerConfig
from edgetrain.compiler.model_graph import trace_model
from edgetrain.compiler.pipeline import CompileOptions, compile_model
from edgetrain.compiler.workbench.run_c import run_firmware
from edgetrain.targets.loader import load_target

pytest.importorskip("timm")
pytest.importorskip("transformers")

HAVE_ARM = bool(shutil.which("make") and shutil.which("arm-none-eabi-gcc") and shutil.which("qemu-system-arm"))
MODELS = "tests/timm_models.py"
TARGET = "mps2-an386"

# model -> (input side, batch, SGD momentum): the largest of 32-64 px whose smallest budget fits the 256 KB the
# board links, with more than one value per channel at the last stage (batch norm needs it); GhostNet's last
# layer without momentum (its 51 KB of momentum would not fit beside the arena).
RUNS = {
    "hf_resnet": (64, 1, 0.9),
    "mobilenetv3_small_050": (48, 1, 0.9),
    "ghostnet_050": (40, 1, 0.0),
    "repvit_tiny": (48, 2, 0.9),
    "efficientnet_test": (48, 1, 0.9),
}


def _opts(model: str, out, train: str, batch: int, side: int, momentum: float = 0.9) -> CompileOptions:
    return CompileOptions(model=f"{MODELS}:{model}", target=TARGET, budget="auto", out=str(out), batch_size=batch,
                          input_shape=(3, side, side), emit="c", time_limit=15, train=train,
                          optimizer=OptimizerConfig.of("sgd", momentum=momentum))


@pytest.mark.parametrize("model", sorted(RUNS))
def test_every_op_of_the_whole_training_graph_lowers_for_c(model):
    side, batch, _ = RUNS[model]
    g = trace_model(_opts(model, "unused", "all", batch, side), load_target(TARGET), backend_for("c"),
                    device_check=False).graph
    ops = {n.op for n in g.nodes}
    assert "aten.convolution_backward.default" in ops and "aten.native_batch_norm_backward.default" in ops
    if model == "ghostnet_050":  # `x += shortcut`: functionalization's copies into a fresh tensor
        assert {"aten.copy.default", "aten.new_empty_strided.default"} <= ops


def test_ghostnet_slices_of_a_batch_are_refused_once_with_every_source_line():
    with pytest.raises(UnsupportedModelError) as e:
        trace_model(_opts("ghostnet_050", "unused", "all", 2, 40), load_target(TARGET), backend_for("c"),
                    device_check=False)
    msg = str(e.value)
    assert msg.startswith("--emit c: 2 op(s)") and msg.count("\n  - ") == 2
    assert "strided view" in msg and "--batch-size 1" in msg
    assert "unknown source" not in msg and "no line of its own; it reads node" in msg  # the copies' residual add
    assert "module `blocks.8.3.ghost1.cheap_operation.2` (ReLU)" in msg


ROUNDING = ("ghostnet_050", "mobilenetv3_small_050")  # batch norm over 4 values a channel at the last stage


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_ARM, reason="arm-none-eabi-gcc / qemu-system-arm build and run the firmware")
@pytest.mark.parametrize("model", sorted(RUNS))
def test_last_layer_trains_exactly_under_qemu(tmp_path, model):
    side, batch, momentum = RUNS[model]
    compile_model(_opts(model, tmp_path / "o", "last:1", batch, side, momentum))
    r = run_firmware(str(tmp_path / "o"), qemu=True, steps=2, check=True)
    assert r["ok"] and not r["mismatched"], r.get("error")
    assert r["losses"] == pytest.approx(r["reference_losses"], rel=1e-5)
    held = r["check_tensors"]  # the tensors beyond rtol/atol, each held to the float64 run
    assert all(c["rule"] == "float64" and c["float64_err"] <= r["check_rounding_factor"] * c["eager_float64_err"]
               for c in held)
    if model in ROUNDING:  # seed 1's batches: a few running statistics, never a trained weight
        assert held and all(".running_" in c["name"] for c in held), held
    else:
        assert not held, held
