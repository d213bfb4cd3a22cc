"""A model whose frozen weights are on the meta device, their values in a safetensors file it names
(compiler/frontend/meta_weights.py): traced on fakes, its plan's weights written one tensor at a time from the
source, trained as eager autograd of the same weights; a meta weight with no source is refused by name."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from edgetrain.compiler.errors import UnsupportedModelError  # noqa: E402
from edgetrain.compiler.pipeline import CompileOptions, compile_model  # noqa: E402
from edgetrain.compiler.workbench.run import run_plan  # noqa: E402

from llm_models import llama, llama_meta  # noqa: E402
from test_user_models import OPTIMIZERS  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _source(tmp_path) -> tuple[str, dict[str, torch.Tensor]]:
    """The frozen base of a bf16 Llama built normally, saved under the model's own names."""
    real = llama("bfloat16")
    frozen = {k: p.detach().clone() for k, p in real.named_parameters() if not p.requires_grad}
    frozen.update({k: b.detach().clone() for k, b in real.named_buffers()})
    path = str(tmp_path / "base.safetensors")
    save_file(frozen, path)
    return path, frozen


def _opts(out, source, budget="100%", optimizer="adamw") -> CompileOptions:
    return CompileOptions(model="tests/llm_models.py:llama_meta", target="jetson-orin-nano", budget=budget,
                          out=str(out), batch_size=1, time_limit=5, loss="model", optimizer=OPTIMIZERS[optimizer],
                          model_kwargs={"source": source})


@pytest.mark.parametrize("budget", ["100%", "60%", "67770"])  # bytes: 3/4 of the in-memory least, frozen ones stream
def test_a_meta_base_compiles_from_its_source_and_trains_as_eager_autograd(tmp_path, budget):
    source, frozen = _source(tmp_path)
    out = tmp_path / "plan"
    c = compile_model(_opts(out, source, budget))
    written = load_file(str(out / "weights.safetensors"))
    for k, v in frozen.items():  # the source's bytes, as they were
        key = f"param/{k}" if f"param/{k}" in written else f"buffer/{k}"
        assert torch.equal(written[key], v), k
    adapters = [k for k in written if "lora_" in k]
    assert adapters and all(written[k].abs().sum() > 0 for k in adapters)  # real values, not meta's nothing
    result = run_plan(str(out), steps=2, check=True)
    assert result["ok"], result.get("error")
    assert result["max_abs_err"] == 0.0
    assert result["measured_peak_bytes"] == result["predicted_peak_bytes"] <= c["budget_bytes"]
    assert bool(c.get("streamed")) == budget.isdigit()  # read from the written file, never from the meta model


def test_a_meta_weight_with_no_source_is_refused_naming_the_fix(tmp_path):
    with pytest.raises(UnsupportedModelError, match=r"meta device with no values .*weights_source"):
        compile_model(_opts(tmp_path / "p", None))
    cmd = [sys.executable, "-m", "edgetrain.compiler.workbench.cli", "compile", "tests/llm_models.py:llama_meta", "--target",
           "jetson-orin-nano", "--budget", "100%", "--loss", "model", "--out", str(tmp_path / "q"), "--json"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    err = json.loads(p.stdout)
    assert "weights_source" in json.dumps(err)


def test_a_source_that_does_not_match_the_model_is_refused_before_the_trace(tmp_path):
    source, frozen = _source(tmp_path)
    k = next(k for k in frozen if k.endswith("q_proj.base_layer.weight"))
    frozen[k] = frozen[k][:, :8].contiguous()
    save_file(frozen, source)
    with pytest.raises(UnsupportedModelError, match="holds '.*q_proj.base_layer.weight' as BF16"):
        compile_model(_opts(tmp_path / "p", source))
    missing = str(tmp_path / "none.safetensors")
    with pytest.raises(UnsupportedModelError, match="does not exist"):
        compile_model(_opts(tmp_path / "p", missing))
