"""Hugging Face BERT, GPT-2 (tied LM head), ViT, T5, BART and MobileViT, built from small configs, and a timm-style
EfficientNet block, trained by their plans exactly.

Each Hugging Face model returns its own loss (`--loss model`); compiled at store-all and at a smaller budget, two
steps checked against eager autograd: with dropout off (the first test), and with the configs' default dropouts.
"""
from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from edgetrain.compiler.errors import EdgetrainError, UnsupportedModelError  # noqa: E402
from edgetrain.compiler.graph.liveness import analyze  # noqa: E402
from edgetrain.compiler.pipeline import CompileOptions, build_graph, compile_model  # noqa: E402
from edgetrain.compiler.scheduling.budget import anchors  # noqa: E402
from edgetrain.compiler.workbench.reference import check_draws  # noqa: E402
from edgetrain.compiler.workbench.run import run_plan  # noqa: E402
from edgetrain.targets import load_target  # noqa: E402

from test_user_models import OPTIMIZERS  # noqa: E402


# ViT's small config at batch 2 on the Raspberry Pi's four threads: its patch convolution's backward, scratch and
# all, is the step's peak, so no budget below store-all exists there; a one-thread profile leaves the schedule room.
TARGETS = {"bert": "rpi4", "gpt2": "rpi4", "vit": "jetson-nano"}


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
@pytest.mark.parametrize("model", list(TARGETS))
def test_hugging_face_model_trains_exactly(tmp_path, model, optimizer):
    def options(out, budget):
        return CompileOptions(model=f"tests/hf_models.py:{model}", target=TARGETS[model], budget=budget,
                              out=str(out), batch_size=2, time_limit=5, loss="model", optimizer=OPTIMIZERS[optimizer])

    target = load_target(TARGETS[model])
    _, _, graph = build_graph(options(tmp_path / "g", "100%"), target)
    a = anchors(graph, analyze(graph), target)
    assert a.min_feasible_bytes < a.store_all.peak_bytes
    half = (a.min_feasible_bytes + a.store_all.peak_bytes) // 2
    for name, budget in (("store_all", "100%"), ("halfway", str(half))):
        compile_model(options(tmp_path / name, budget))
        result = run_plan(str(tmp_path / name), steps=2, check=True)
        assert result["ok"], f"{model} {optimizer} {name}: {result.get('error')}"
        assert result["max_abs_err"] <= 1e-6
        assert result["measured_peak_bytes"] == result["predicted_peak_bytes"]


def _check(tmp_path, model: str, budget: str, optimizer: str = "adamw", target: str = "jetson-nano",
           loss: str = "model", batch: int = 2) -> dict:
    out = tmp_path / f"{model}_{budget.rstrip('%')}"
    compiled = compile_model(CompileOptions(model=f"tests/hf_models.py:{model}", target=target, budget=budget,
                                            out=str(out), batch_size=batch, time_limit=5, loss=loss,
                                            optimizer=OPTIMIZERS[optimizer]))
    assert compiled["peak_bytes"] <= compiled["budget_bytes"]
    result = run_plan(str(out), steps=2, check=True)
    assert result["ok"], f"{model} at {budget}: {result.get('error')}"
    assert result["max_abs_err"] == 0, result
    assert result["measured_peak_bytes"] == result["predicted_peak_bytes"]
    return json.loads((out / "schedule.json").read_text())


def _keys(schedule: dict) -> set[str]:
    return {n["attrs"]["seed_key"] for n in schedule["graph"]["nodes"] if "seed_key" in n["attrs"]}


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gpt2_default", "bert_default"])
def test_default_dropout_checks_exactly(tmp_path, model):
    """Default configs (dropout 0.1, inside attention too: SDPA's dropout_p): every mask is the one eager autograd
    draws, at store-all and halfway to the smallest feasible budget, where dropped activations are recomputed and
    draw the same masks again."""
    schedule = _check(tmp_path, model, "100%")
    assert any(k.endswith("attn:native_dropout") or k.endswith("attention.self:native_dropout")
               for k in _keys(schedule)), _keys(schedule)
    half = _check(tmp_path, model, f"{(schedule['budget']['min_feasible_bytes'] + schedule['budget']['bytes']) // 2}B")
    assert any(s["action"] == "recompute" for s in half["steps"])


@pytest.mark.parametrize("model", ["t5", "bart"])
def test_tied_shared_embedding_trains_exactly(tmp_path, model):
    """T5's and BART's `shared` embedding, read by forward only under its tied names: one parameter, one gradient
    (autograd's sum over the uses), one update. BART's decoder mask helper asks whether an all-ones mask is all ones:
    traced as torch.export traces it, and the reference runs it so too."""
    schedule = _check(tmp_path, model, "100%")
    assert "model.model.shared.weight" in schedule["graph"]["params"] or \
        "model.shared.weight" in schedule["graph"]["params"]
    assert not any(p.endswith("embed_tokens.weight") or p == "model.lm_head.weight" for p in schedule["graph"]["params"])
    assert schedule["graph"].get("exported", False) == (model == "bart")
    # Halfway between the smallest feasible budget and plain backprop's peak: dropped activations recomputed.
    half = (schedule["budget"]["min_feasible_bytes"] + schedule["budget"]["bytes"]) // 2
    halfway = _check(tmp_path, model, f"{half}B")
    assert halfway["predicted"]["peak_bytes"] < schedule["budget"]["bytes"]


@pytest.mark.slow
def test_mobilevit_default_checks_exactly(tmp_path):
    """SiLU's backward and bilinear upsampling's are eager's kernels in the plan (the trace wrote other forms that
    round apart, 3e-3 off after two AdamW steps), and the in-place classifier dropout draws eager's mask."""
    schedule = _check(tmp_path, "mobilevit_default", "100%")
    ops = {n["op"] for n in schedule["graph"]["nodes"]}
    assert {"aten.silu_backward.default", "aten.upsample_bilinear2d_backward.default"} <= ops, ops


def test_efficientnet_style_drop_path_checks_exactly(tmp_path):
    """Depthwise convolution, batch norm, SiLU, squeeze-excitation and drop path (a bernoulli_ outside any dropout
    op): the per-sample masks, SiLU's backward and the functional dropout all match eager autograd, recomputed too."""
    schedule = _check(tmp_path, "efficientnet_style", "100%", loss="cross_entropy")
    assert _keys(schedule) == {"blocks.0:bernoulli_", "blocks.1:bernoulli_", "F.dropout"}
    half = _check(tmp_path, "efficientnet_style", "50%", loss="cross_entropy")
    assert any(s["action"] == "recompute" for s in half["steps"])


def test_unpaired_random_op_is_refused_by_check(tmp_path):
    """A random node the capture could not pair with a draw of the eager forward keeps its own name as its key:
    `run --check` refuses it before any step, naming the op and the fix, instead of reporting a mismatch."""
    schedule = _check(tmp_path, "efficientnet_style", "100%", loss="cross_entropy")
    node = next(n for n in schedule["graph"]["nodes"] if n["attrs"].get("seed_key") == "blocks.0:bernoulli_")
    node["attrs"]["seed_key"] = node["name"]
    with pytest.raises(EdgetrainError, match=r"random op `aten\.bernoulli\.p` \(node bernoulli.*model\.eval\(\)"):
        check_draws(schedule)


MASK_LIBRARY = '''import torch


def padding_mask(ids):
    if (ids == 0).any():  # a branch on the batch's values, traced or not
        return ids != 0
    return None
'''

MASK_MODEL = '''import sys
import os

import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "site-packages"))
from padmask import padding_mask  # noqa: E402


class Masked(nn.Module):
    input_shape, input_dtype, input_high, num_classes = (8,), "int64", 16, 4

    def __init__(self):
        super().__init__()
        self.emb, self.head = nn.Embedding(16, 8), nn.Linear(8, 4)

    def forward(self, x):
        mask = padding_mask(x)
        h = self.emb(x)
        return self.head((h if mask is None else h * mask.unsqueeze(-1)).mean(1))
'''


def test_data_dependent_library_helper_is_refused_naming_its_line(tmp_path):
    """A library's mask helper that branches on the batch's values even traced as torch.export traces: the error
    names the library's file and line, and the user's line that called it."""
    lib = tmp_path / "site-packages" / "padmask"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text(MASK_LIBRARY)
    (tmp_path / "masked.py").write_text(MASK_MODEL)
    with pytest.raises(UnsupportedModelError) as e:
        compile_model(CompileOptions(model=f"{tmp_path / 'masked.py'}:Masked", target="rpi4", budget="100%",
                                     out=str(tmp_path / "out"), batch_size=2, time_limit=5))
    text = str(e.value)
    assert "padmask/__init__.py:5: `if (ids == 0).any():" in text, text
    assert "masked.py:18: `mask = padding_mask(x)`" in text, text
