"""The validator rejects every way a schedule can break the memory model or exactness."""
import dataclasses

import pytest

from edgetrain.compiler.pipeline import CompileOptions, build_graph
from edgetrain.compiler.scheduling.steps import Step, build_steps
from edgetrain.compiler.errors import ValidationError
from edgetrain.compiler.graph.liveness import analyze
from edgetrain.compiler.scheduling.heuristics import checkpoint, page_all, store_all
from edgetrain.compiler.scheduling.budget import min_budget
from edgetrain.compiler.scheduling.schedulers import run_scheduler
from edgetrain.compiler.scheduling.validator import validate
from edgetrain.targets import load_target

TARGET = load_target("rpi4")


@pytest.fixture(scope="module")
def resnet():
    _, _, g = build_graph(CompileOptions(model="resnet18", target="rpi4", budget="100%", out="", batch_size=2), TARGET)
    return g, analyze(g)


def _steps(g, lv, d):
    return build_steps(g, lv, d)


def test_heuristic_schedules_validate(resnet):
    g, lv = resnet
    for d in (store_all(g, lv), checkpoint(g, lv), page_all(g, lv, retain=True), page_all(g, lv, retain=False)):
        rep = validate(g, _steps(g, lv, d), TARGET, None)
        assert rep.peak_bytes >= min_budget(lv)
    assert validate(g, _steps(g, lv, page_all(g, lv, retain=False)), TARGET, None).peak_bytes == min_budget(lv)


def test_checkpointing_recomputes_and_saves_memory(resnet):
    g, lv = resnet
    sa = validate(g, _steps(g, lv, store_all(g, lv)), TARGET, None)
    ck = validate(g, _steps(g, lv, checkpoint(g, lv)), TARGET, None)
    assert ck.recomputes > 0 and ck.peak_bytes < sa.peak_bytes and ck.energy_j > sa.energy_j


def test_budget_exceeded(resnet):
    g, lv = resnet
    steps = _steps(g, lv, store_all(g, lv))
    peak = validate(g, steps, TARGET, None).peak_bytes
    validate(g, steps, TARGET, peak)
    with pytest.raises(ValidationError, match="exceeds the budget"):
        validate(g, steps, TARGET, peak - 1)


def test_operand_freed_too_early(resnet):
    g, lv = resnet
    steps = _steps(g, lv, store_all(g, lv))
    k = next(k for k, s in enumerate(steps) if s.action == "compute" and g.node(s.tensor).kind == "forward")
    used = g.node(steps[k].tensor).inputs[0].name
    bad = steps[:k] + [Step(steps[k].stage, "free", used)] + steps[k:]
    with pytest.raises(ValidationError, match="not resident"):
        validate(g, bad, TARGET, None)


def test_missing_free_is_caught(resnet):
    g, lv = resnet
    steps = [s for s in _steps(g, lv, store_all(g, lv)) if not (s.action == "free" and s.tensor == "convolution")]
    with pytest.raises(ValidationError, match="still resident"):
        validate(g, steps, TARGET, None)


def test_recompute_after_its_own_update_is_rejected(resnet):
    g, lv = resnet
    steps = _steps(g, lv, store_all(g, lv))
    # Recompute layer1.0's first conv after its weight's update: the values would differ from the forward pass.
    weight = "layer1.0.conv1.weight"
    conv = next(n.name for n in g.nodes if n.kind == "forward" and weight in n.params)
    updater = next(n.name for n in g.nodes if weight in n.updates)
    upd = max(k for k, s in enumerate(steps) if s.tensor == updater)
    bad = steps[: upd + 1] + [Step(steps[upd].stage, "recompute", conv)]
    bad += [Step(steps[upd].stage, "free", conv)] + steps[upd + 1:]
    with pytest.raises(ValidationError, match="parameters were updated"):
        validate(g, bad, TARGET, None)


def test_page_in_needs_a_stored_copy(resnet):
    g, lv = resnet
    steps = _steps(g, lv, page_all(g, lv, retain=False))
    bad = [s for s in steps if not (s.action == "page_out" and s.tensor == "convolution")]
    with pytest.raises(ValidationError, match="never paged out"):
        validate(g, bad, TARGET, None)


def test_page_out_never_paged_in_is_rejected(resnet):
    g, lv = resnet
    steps = _steps(g, lv, store_all(g, lv))
    validate(g, steps, TARGET, None)
    k = next(k for k, s in enumerate(steps) if s.action == "compute" and s.tensor == "convolution")
    bad = steps[: k + 1] + [Step(steps[k].stage, "page_out", "convolution")] + steps[k + 1:]  # kept resident anyway
    with pytest.raises(ValidationError, match=r"paged out but never paged in: \['convolution'\]"):
        validate(g, bad, TARGET, None, strict=True)
    validate(g, bad, TARGET, None)  # wasteful, not wrong: a schedule file from before the rule still runs


def test_backward_node_computed_twice_is_rejected(resnet):
    g, lv = resnet
    steps = _steps(g, lv, store_all(g, lv))
    fc = next(n.name for n in g.nodes if "fc.weight" in n.updates)
    k = next(k for k, s in enumerate(steps) if s.action == "compute" and s.tensor == fc)
    with pytest.raises(ValidationError):
        validate(g, steps[: k + 1] + [dataclasses.replace(steps[k], action="recompute")] + steps[k + 1:], TARGET, None)


def test_milp_peak_equals_validator_peak_and_fits(resnet):
    g, lv = resnet
    sa = validate(g, _steps(g, lv, store_all(g, lv)), TARGET, None)
    budget = (sa.peak_bytes + min_budget(lv)) // 2
    s = run_scheduler(g, lv, TARGET, budget, time_limit=20)
    assert s.report.peak_bytes <= budget
    assert s.report.energy_j <= validate(g, _steps(g, lv, page_all(g, lv, retain=True)), TARGET, None).energy_j + 1e-12


def test_milp_is_infeasible_when_a_forward_stage_alone_exceeds_the_budget(resnet):
    """The forward-stage memory rows exist even without variables (one memory model for direct build() users)."""
    from edgetrain.compiler.scheduling.milp import highs
    from edgetrain.compiler.scheduling.poet import build

    g, lv = resnet
    budget = max(lv.static[: lv.B0]) - 1
    assert highs.solve(build(g, lv, TARGET, budget).milp, time_limit=20).status == "infeasible"
