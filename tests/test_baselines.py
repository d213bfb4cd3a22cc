"""Baselines (Checkmate, paging-only, DTR-like, Chen) emit validated schedules that run exactly, and the POET
MILP never spends more energy than any of them at the same budget."""
import pytest

from edgetrain.compiler.pipeline import CompileOptions, compile_model
from edgetrain.compiler.errors import BudgetError
from edgetrain.compiler.workbench.run import run_plan

CASES = [("small_cnn", 8, "80%"), ("resnet18", 2, "95%")]
BASELINES = ("checkmate", "paging", "dtr", "checkpoint")


@pytest.fixture(scope="module", params=CASES, ids=[f"{m}-{b}" for m, _, b in CASES])
def compiled(request, tmp_path_factory):
    model, batch, budget = request.param
    out = {}
    for s in ("poet",) + BASELINES:
        d = str(tmp_path_factory.mktemp(f"{model}-{s}"))
        try:
            out[s] = (d, compile_model(CompileOptions(model=model, target="rpi4", budget=budget, out=d,
                                                      batch_size=batch, scheduler=s, time_limit=20)))
        except BudgetError as e:
            out[s] = (d, e)
    return out


def test_poet_never_spends_more_energy_than_a_baseline_that_fits(compiled):
    poet = compiled["poet"][1]
    fitted = 0
    for s in BASELINES:
        r = compiled[s][1]
        if isinstance(r, BudgetError):
            continue
        fitted += 1
        assert r["peak_bytes"] <= r["budget_bytes"]
        assert poet["energy_j"] <= r["energy_j"] * (1 + 1e-9), s
    assert fitted >= 2


@pytest.mark.parametrize("scheduler", ("checkmate", "paging", "dtr"))
def test_baseline_runs_exactly(compiled, scheduler):
    d, r = compiled[scheduler]
    if isinstance(r, BudgetError):
        pytest.skip(f"{scheduler} does not fit this budget: {r}")
    assert r["recomputes"] + r["page_ins"] > 0
    if scheduler == "checkmate" or scheduler == "dtr":
        assert r["page_ins"] == 0
    if scheduler == "paging":
        assert r["recomputes"] == 0
    run = run_plan(d, steps=2, check=True)
    assert run["ok"], run.get("error")
    assert run["measured_peak_bytes"] == run["predicted_peak_bytes"] <= run["budget_bytes"]
