"""Causal LMs with peft LoRA adapters (tests/llm_models.py): the base frozen, the adapters trained by the plan as
eager autograd trains them, in float32 and with a bfloat16 or float16 base; the adapters saved alone.

float32 holds to RTOL/ATOL; a half-precision model to its dtype's epsilon (compiler/workbench/run.py: tolerance),
since torch's joint graph already differs from eager autograd in the last float32 bits before a plan runs.
"""
from __future__ import annotations

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from edgetrain.compiler.schedule_file import format as schedule_format  # noqa: E402
from edgetrain.compiler.pipeline import CompileOptions, compile_model  # noqa: E402
from edgetrain.compiler.workbench.cli import main  # noqa: E402
from edgetrain.compiler.workbench.run import run_plan  # noqa: E402

import llm_models  # noqa: E402
from test_user_models import OPTIMIZERS  # noqa: E402

SPEC = "tests/llm_models.py:{}"


def _compile(out, factory, budget, optimizer="adamw", **kwargs) -> dict:
    compile_model(CompileOptions(model=SPEC.format(factory), target="rpi4", budget=budget, out=str(out), batch_size=1,
                                 time_limit=5, loss="model", optimizer=OPTIMIZERS[optimizer], model_kwargs=kwargs))
    return schedule_format.load(str(out))


def _check(out, what):
    result = run_plan(str(out), steps=2, check=True)
    assert result["ok"], f"{what}: {result.get('error')}"
    assert result["measured_peak_bytes"] == result["predicted_peak_bytes"]
    return result


# About halfway between these tiny models' smallest feasible budgets (66-74% of plain backprop's peak) and 100%.
HALFWAY = "87%"


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
@pytest.mark.parametrize("budget", ["100%", HALFWAY])
def test_llama_lora_trains_the_adapters_alone_exactly(tmp_path, budget, optimizer):
    graph = _compile(tmp_path, "llama", budget, optimizer)["graph"]
    assert graph["trainable"] and all("lora_" in p for p in graph["trainable"])
    # the frozen base has no gradient and no optimizer state
    grads = [n for n in graph["nodes"] if n["kind"] == "backward" and n.get("updates")]
    assert {p for n in grads for p in n["updates"]} == set(graph["trainable"])
    result = _check(tmp_path, f"llama lora {budget} {optimizer}")
    assert result["max_abs_err"] <= 1e-6


@pytest.mark.parametrize("dtype,upcast", [("bfloat16", True), ("bfloat16", False), ("float16", True)])
def test_half_precision_base_with_lora_trains_within_its_epsilon(tmp_path, dtype, upcast):
    # SGD: a gradient's rounding difference moves its weight by lr times that difference. Adam divides by the
    # root of the second moment, so a near-zero gradient that rounds differently moves its weight by ~lr either
    # way; AdamW on a half-precision base is checked in the float32-adapter GPT-2 case below (slow).
    graph = _compile(tmp_path, "llama", "75%", "sgd", dtype=dtype, upcast=upcast)["graph"]
    sizes = {n["dtype"] for n in graph["nodes"] if n["kind"] == "forward"}
    assert dtype in sizes  # costed in the base's own dtype (2 bytes an element)
    result = _check(tmp_path, f"llama {dtype} upcast={upcast}")
    assert result["check_rtol"] == torch.finfo(getattr(torch, dtype)).eps
    assert result["max_abs_err"] <= result["check_atol"]


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
@pytest.mark.parametrize("budget", ["100%", HALFWAY])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpt2_lora_trains_exactly(tmp_path, dtype, budget, optimizer):
    _compile(tmp_path, "gpt2", budget, optimizer, dtype=dtype)
    result = _check(tmp_path, f"gpt2 lora {dtype} {budget} {optimizer}")
    assert result["max_abs_err"] <= (1e-6 if dtype == "float32" else result["check_atol"])


def test_save_trained_writes_the_adapters_alone_under_the_models_keys(tmp_path):
    _compile(tmp_path / "plan", "llama", "100%", "sgd")
    full, adapters = tmp_path / "full.safetensors", tmp_path / "lora.safetensors"
    assert main(["run", str(tmp_path / "plan"), "--steps", "1", "--save", str(full), "--json"]) == 0
    assert main(["run", str(tmp_path / "plan"), "--steps", "1", "--save", str(adapters), "--save-trained",
                 "--json"]) == 0
    everything, trained = load_file(full), load_file(adapters)
    assert set(trained) == {k for k in everything if "lora_" in k} and len(trained) == 8
    for k, t in trained.items():
        assert torch.equal(t, everything[k])
    model = llm_models.llama()
    missing, unexpected = model.load_state_dict(trained, strict=False)
    assert not unexpected and not any("lora_" in k for k in missing)
    for k, p in model.named_parameters():
        if k in trained:
            assert torch.equal(p.detach(), trained[k])
