"""Real CNNs reach the C firmware: Hugging Face's ResNet (small config) and modules with GhostNet's, RepViT's
and MobileNetV3's patterns (tests/cnn_patterns.py) compile with --emit c for mps2-an386 and train exactly
(two steps against eager autograd); a model with two ops the C runtime lacks gets one error naming both.
"""
from __future__ import annotations

import shutil

import pytest
import torch
from torch import nn

from edgetrain.compiler.errors import UnsupportedModelError
from edgetrain.compiler.pipeline import CompileOptions, compile_model
from edgetrain.compiler.workbench.run_c import run_firmware

HAVE_HOST = bool(shutil.which("gcc") and shutil.which("make"))
HAVE_ARM = bool(HAVE_HOST and shutil.which("arm-none-eabi-gcc") and shutil.which("qemu-system-arm"))


def hf_resnet() -> nn.Module:
    from transformers import ResNetConfig, ResNetForImageClassification

    class Wrapped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            cfg = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], num_labels=10)
            self.model = ResNetForImageClassification(cfg)

        def forward(self, x):  # the logits; the loss is --loss cross_entropy
            return self.model(pixel_values=x).logits

    torch.manual_seed(0)
    m = Wrapped()
    m.input_shape, m.num_classes = (3, 32, 32), 10
    return m


class TwoMissing(nn.Module):
    """tanh and a softplus: two ops without a C kernel."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(12, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(nn.functional.softplus(torch.tanh(self.fc1(torch.flatten(x, 1)))))


def two_missing() -> nn.Module:
    return TwoMissing()


two_missing.input_shape, two_missing.num_classes = (3, 2, 2), 3  # type: ignore[attr-defined]


def _compile(out, model, batch=2, **kw):
    return compile_model(CompileOptions(model=model, target="mps2-an386", budget="100%", out=str(out),
                                        batch_size=batch, emit="c", time_limit=10, **kw))


def test_two_missing_ops_are_one_error_naming_both(tmp_path):
    with pytest.raises(UnsupportedModelError) as e:
        _compile(tmp_path / "o", "tests/test_c_real_cnns.py:two_missing")
    msg = str(e.value)
    assert msg.count("\n  - ") >= 2
    for op in ("aten.tanh.default", "aten.softplus.default"):
        assert f"op `{op}`" in msg
    assert "test_c_real_cnns.py:" in msg  # the user's line


def test_ghost_module_slices_at_batch_above_one_are_refused_naming_the_reads(tmp_path):
    with pytest.raises(UnsupportedModelError, match="strided view") as e:
        _compile(tmp_path / "o", "tests/cnn_patterns.py:ghost_like", batch=2)
    assert "cnn_patterns.py:" in str(e.value) and "--batch-size 1" in str(e.value)


@pytest.mark.skipif(not HAVE_HOST, reason="gcc and make build the host firmware")
@pytest.mark.parametrize("model, batch", [("cnn_patterns.py:ghost_like", 1), ("cnn_patterns.py:repvit_like", 2),
                                          ("cnn_patterns.py:mbv3_like", 2)])
def test_mobile_cnn_patterns_train_exactly_on_the_host_build(tmp_path, model, batch):
    _compile(tmp_path / "o", f"tests/{model}", batch=batch)
    r = run_firmware(str(tmp_path / "o"), qemu=False, steps=2, check=True)
    assert r["ok"] and not r["mismatched"], r.get("error")
    assert r["losses"] == pytest.approx(r["reference_losses"], rel=1e-5)


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_ARM, reason="arm-none-eabi-gcc / qemu-system-arm build and run the firmware")
def test_hugging_face_resnet_trains_exactly_under_qemu(tmp_path):
    pytest.importorskip("transformers")
    _compile(tmp_path / "o", "tests/test_c_real_cnns.py:hf_resnet")
    r = run_firmware(str(tmp_path / "o"), qemu=True, steps=2, check=True)
    assert r["ok"] and not r["mismatched"], r.get("error")
    assert r["losses"] == pytest.approx(r["reference_losses"], rel=1e-5)
