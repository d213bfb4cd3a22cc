"""Transformers keep the product's promise: plans that fit the budget and train exactly like autograd.

As tests/test_zoo_exactness.py, for the BERT-style and GPT-style zoo entries (int64 token ids, [CLS]
classification and per-token LM loss) and a model that writes attention out by hand (matmul, scale,
softmax, a permute + .contiguous() copy). rpi4 makes paging cheap, jetson-agx-orin makes recomputing
cheap, so both kinds of schedule run. The runtime's kernels are autograd's aten ops (flash attention
included), so the error must be exactly 0, and no operand view may have needed a copy.
"""
import re

import pytest

from edgetrain.compiler.pipeline import CompileOptions, compile_model
from edgetrain.compiler.workbench.run import run_plan

HAND = "tests.transformer_models:hand_attention"
CASES = [
    ("bert_tiny", "rpi4", "100%"), ("bert_tiny", "rpi4", "80%"), ("bert_tiny", "rpi4", "65%"),
    ("gpt_tiny", "rpi4", "100%"), ("gpt_tiny", "rpi4", "75%"), ("gpt_tiny", "rpi4", "60%"),
    ("bert_tiny", "jetson-agx-orin", "60%"), ("gpt_tiny", "jetson-agx-orin", "60%"),
    (HAND, "rpi4", "100%"), (HAND, "rpi4", "80%"),  # the smallest feasible budget is ~72% of store-all here
]
BATCH = {"bert_tiny": 4, "gpt_tiny": 4, HAND: 16}


@pytest.mark.parametrize("model,target,budget", CASES, ids=[f"{m.split(':')[-1]}-{t}-{b}" for m, t, b in CASES])
def test_transformer_fits_budget_and_matches_autograd(tmp_path, model, target, budget):
    out = str(tmp_path / "plan")
    c = compile_model(CompileOptions(model=model, target=target, budget=budget, out=out, batch_size=BATCH[model],
                                     time_limit=8.0))
    assert c["peak_bytes"] <= c["budget_bytes"]
    if budget != "100%":
        assert c["budget_bytes"] < c["store_all_peak_bytes"]
        assert c["recomputes"] + c["page_ins"] > 0, "a budget below store-all must recompute or page"
    r = run_plan(out, steps=2, check=True)
    assert r["ok"], r.get("error")
    assert r["max_abs_err"] == 0.0 and r["max_rel_err"] == 0.0
    assert r["losses"] == r["reference_losses"]
    assert r["measured_peak_bytes"] == r["predicted_peak_bytes"] == c["peak_bytes"] <= r["budget_bytes"]
    assert r["view_copied_bytes"] == 0, "an operand view had to copy: its bytes were not in the schedule"


def test_recompute_schedule_recomputes_transformer_ops(tmp_path):
    """The recompute-heavy schedule really recomputes (incl. layer norm, whose statistics come from the
    first compute), so exactness above covers recomputed transformer ops."""
    out = str(tmp_path / "plan")
    c = compile_model(CompileOptions(model="gpt_tiny", target="jetson-agx-orin", budget="60%", out=out,
                                     batch_size=4, time_limit=8.0))
    assert c["recomputes"] > 0
    plan = open(f"{out}/plan.py").read()
    assert re.search(r"= rt\.recompute\(\s*\"\w+\", aten\.native_layer_norm\.default,", plan)


def test_dropout_in_a_decoder_is_replayed_exactly(tmp_path):
    """Dropout after each FFN (p=0.1): the runtime draws each mask from its seed, step and module, and the
    reference draws the same masks."""
    out = str(tmp_path / "plan")
    c = compile_model(CompileOptions(model="gpt_tiny", target="jetson-agx-orin", budget="60%", out=out,
                                     batch_size=4, time_limit=8.0, model_kwargs={"dropout": 0.1}))
    plan = open(f"{out}/plan.py").read()
    assert c["recomputes"] > 0 and "aten.native_dropout.default" in plan
    r = run_plan(out, steps=2, check=True)
    assert r["ok"], r.get("error")
    assert r["max_abs_err"] == 0.0 and r["measured_peak_bytes"] == r["predicted_peak_bytes"] == c["peak_bytes"]


def test_a_gpu_plan_has_only_kernels_its_gpu_runs(tmp_path):
    """Traced on the CPU, attention is torch's CPU-only flash kernel, which a Jetson's CUDA device cannot run: a
    GPU target's plan gets attention as torch's math (matrix products and softmax), a CPU target's keeps the flash
    kernel; both train exactly like autograd run the same way."""
    plans = {}
    for target in ("jetson-nano", "rpi4"):
        out = str(tmp_path / target)
        compile_model(CompileOptions(model="gpt_tiny", target=target, budget="100%", out=out, batch_size=4,
                                     time_limit=8.0))
        plans[target] = open(f"{out}/plan.py").read()
        r = run_plan(out, steps=2, check=True)
        assert r["ok"] and r["max_abs_err"] == 0.0, r.get("error")
    assert "_for_cpu" not in plans["jetson-nano"] and "aten.bmm.default" in plans["jetson-nano"]
    assert "aten._scaled_dot_product_flash_attention_for_cpu.default" in plans["rpi4"]
