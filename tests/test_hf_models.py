"""Hugging Face BERT, GPT-2 (tied LM head) and ViT, built from small configs, trained by their plans exactly.

Each model returns its own loss (`--loss model`); compiled at store-all and halfway between its smallest
feasible budget and store-all, with SGD and AdamW, two steps checked against eager autograd.
"""
from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from edgetrain.compiler.graph.liveness import analyze  # noqa: E402
from edgetrain.compiler.pipeline import CompileOptions, build_graph, compile_model  # noqa: E402
from edgetrain.compiler.scheduling.budget import anchors  # noqa: E402
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
