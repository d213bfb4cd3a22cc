"""Models as users write them, trained by their compiled plans exactly as eager autograd trains them.

Each model of tests/user_models.py is compiled (rpi4, batch 4) at store-all and at a budget halfway between
its smallest feasible budget and store-all (so that the plan recomputes or pages), with SGD and with AdamW,
then run for two steps and compared parameter by parameter (and buffer by buffer) with PyTorch autograd and
the matching torch.optim optimizer from the same weights and batches.
"""
from __future__ import annotations

import json

import pytest
import torch

from edgetrain.compiler.graph.ir import OptimizerConfig
from edgetrain.compiler.graph.liveness import analyze
from edgetrain.compiler.pipeline import CompileOptions, build_graph, compile_model
from edgetrain.compiler.scheduling.budget import anchors
from edgetrain.compiler.workbench.run import run_plan
from edgetrain.targets import load_target

MODELS = ["activations", "squeeze_excite", "norms", "segmenter", "recurrent", "encoder", "tied_lm",
          "frozen_backbone", "bias_only"]
# Its peak is its last trained convolution's backward, kernel scratch and all, which every schedule holds at once:
# store-all is its smallest budget.
NO_ROOM = {"frozen_backbone"}
OPTIMIZERS = {"sgd": OptimizerConfig(name="sgd", lr=0.05, momentum=0.9, weight_decay=5e-4),
              "adamw": OptimizerConfig(name="adamw", lr=1e-2, momentum=0.0, weight_decay=1e-2)}


def _options(model: str, out, budget: str, optimizer: str) -> CompileOptions:
    return CompileOptions(model=f"tests/user_models.py:{model}", target="rpi4", budget=budget, out=str(out),
                          batch_size=4, time_limit=5, optimizer=OPTIMIZERS[optimizer])


def _halfway(opts: CompileOptions) -> tuple[int, int, int]:
    """(the smallest feasible budget, store-all's peak, the budget halfway between them), in bytes."""
    target = load_target(opts.target)
    _, _, graph = build_graph(opts, target)
    a = anchors(graph, analyze(graph), target)
    return a.min_feasible_bytes, a.store_all.peak_bytes, (a.min_feasible_bytes + a.store_all.peak_bytes) // 2


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
@pytest.mark.parametrize("model", MODELS)
def test_user_model_trains_exactly(tmp_path, model, optimizer):
    opts = _options(model, tmp_path / "store_all", "100%", optimizer)
    smallest, store_all, half = _halfway(opts)
    plans = (("store_all", "100%"), ("halfway", str(half)))
    if model in NO_ROOM:
        assert smallest == store_all, f"{model}: {smallest} B to {store_all} B: take it out of NO_ROOM"
        plans = plans[:1]
    assert smallest < store_all or model in NO_ROOM, f"{model}: nothing to schedule between {smallest} and {store_all} B"
    for name, budget in plans:
        out = tmp_path / name
        compiled = compile_model(_options(model, out, budget, optimizer))
        assert compiled["peak_bytes"] <= compiled["budget_bytes"]
        if name == "halfway":
            assert compiled["recomputes"] + compiled["page_ins"] > 0, f"{model}: the halfway plan keeps everything"
        result = run_plan(str(out), steps=2, check=True)
        assert result["ok"], f"{model} {optimizer} {name}: {result.get('error')}"
        assert result["max_abs_err"] <= 1e-6, result
        assert result["measured_peak_bytes"] == result["predicted_peak_bytes"]
        assert all(torch.isfinite(torch.tensor(result["losses"])))


def test_frozen_backbone_needs_less_memory_than_the_same_model_unfrozen(tmp_path):
    frozen = _halfway(_options("frozen_backbone", tmp_path / "f", "100%", "sgd"))
    unfrozen = _halfway(_options("backbone", tmp_path / "u", "100%", "sgd"))
    print(f"frozen backbone: smallest {frozen[0]} B, store-all {frozen[1]} B; "
          f"unfrozen: smallest {unfrozen[0]} B, store-all {unfrozen[1]} B")
    assert frozen[0] < unfrozen[0]
    assert frozen[1] < unfrozen[1]


def test_frozen_parameters_get_no_update_and_no_optimizer_state(tmp_path):
    opts = _options("frozen_backbone", tmp_path, "100%", "adamw")
    _, model, graph = build_graph(opts, load_target("rpi4"))
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen and set(graph.trainable).isdisjoint(frozen)
    assert not any(set(n.updates) & frozen for n in graph.nodes)
    # Adam keeps two state tensors per trainable parameter only (plus a 4-byte step count each).
    trainable_bytes = sum(graph.params[p].bytes for p in graph.trainable)
    assert graph.optimizer_bytes == 2 * trainable_bytes + 4 * len(graph.trainable)


def test_a_users_own_loss_function_trains_exactly(tmp_path):
    opts = _options("squeeze_excite", tmp_path, "100%", "adamw")
    opts.loss = "tests/user_models.py:smoothed_cross_entropy"
    compile_model(opts)
    result = run_plan(str(tmp_path), steps=2, check=True)
    assert result["ok"] and result["max_abs_err"] <= 1e-6, result.get("error")
    plain = run_plan(str(_compile_plain(tmp_path / "plain")), steps=1)
    assert result["losses"][0] != plain["losses"][0]  # the user's loss, not cross-entropy, was trained


def _compile_plain(out):
    compile_model(_options("squeeze_excite", out, "100%", "adamw"))
    return out


def test_module_and_functional_dropout_draw_the_reference_masks(tmp_path):
    """nn.Dropout modules and F.dropout calls in one model: every mask is the one eager autograd draws, at
    store-all and in a plan that recomputes the functional dropouts."""
    opts = CompileOptions(model="tests/user_models.py:mixed_dropout", target="jetson-agx-orin", budget="100%",
                          out=str(tmp_path / "store_all"), batch_size=32, time_limit=5,
                          optimizer=OPTIMIZERS["sgd"])
    smallest, store_all, _ = _halfway(opts)
    for name, budget in (("store_all", "100%"), ("tight", str(smallest + 2 * (store_all - smallest) // 5))):
        out = tmp_path / name
        opts.out, opts.budget = str(out), budget
        compiled = compile_model(opts)
        assert compiled["peak_bytes"] <= compiled["budget_bytes"]
        schedule = json.loads((out / "schedule.json").read_text())
        keys = {n["name"]: n["attrs"].get("seed_key") for n in schedule["graph"]["nodes"]
                if "dropout" in n["op"]}
        # the forward's draws in the order they run (a node per output: the value and the mask); no backward draws
        assert [keys[f"native_dropout{s}"] for s in ("", "_1", "_2", "_3")] == ["drop", "F.dropout", "F.dropout#2",
                                                                                "drop#2"], keys
        assert all(keys[n] is None for n in keys if "backward" in n), keys
        if name == "tight":  # a functional dropout's value or mask is drawn again in the backward pass
            recomputed = {s["tensor"] for s in schedule["steps"] if s["action"] == "recompute"}
            assert {n.split(".")[0] for n in recomputed} & {"native_dropout_1", "native_dropout_2"}, recomputed
        result = run_plan(str(out), steps=2, check=True)
        assert result["ok"], f"{name}: {result.get('error')}"
        assert result["max_abs_err"] <= 1e-6, result
        assert result["measured_peak_bytes"] == result["predicted_peak_bytes"]
