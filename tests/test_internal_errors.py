"""Schedules edgetrain builds itself never break its memory model, and when one does it is reported as an edgetrain
bug (exit 3, kind "internal"), not as the user's error.

The case from the field: a causal LM that shifts its labels as Hugging Face's do (pad with -100, drop the first)
makes the padded labels a forward tensor of the labels. The labels have a fixed life (freed after their last
forward reader), so recomputing the pad in backward read a freed tensor; the warm start and the MILP both did.
"""
from __future__ import annotations

import json

import pytest

from edgetrain.compiler.graph.liveness import analyze
from edgetrain.compiler.pipeline import CompileOptions, build_graph, compile_model
from edgetrain.compiler.scheduling import schedulers
from edgetrain.compiler.scheduling.budget import anchors
from edgetrain.compiler.scheduling.heuristics import store_all
from edgetrain.compiler.scheduling.schedulers import run_scheduler
from edgetrain.compiler.workbench.cli import main
from edgetrain.compiler.workbench.run import run_plan
from edgetrain.targets import load_target

MODEL = "tests.transformer_models:padded_labels_lm"


def _graph(target: str):
    t = load_target(target)
    _, _, g = build_graph(CompileOptions(model=MODEL, target=target, budget="100%", out="", batch_size=4,
                                         loss="model"), t)
    lv = analyze(g)
    return t, g, lv, anchors(g, lv, t)


def test_a_forward_tensor_of_the_labels_is_not_recomputed_after_they_are_freed():
    _, g, lv, _ = _graph("jetson-nano")
    pad = next(n for n in g.nodes if n.name.startswith("constant_pad_nd"))
    assert pad.name in lv.decision and any(r.name == "labels" for r in pad.inputs)
    assert lv.recompute_until[pad.name] <= lv.end["labels"] < lv.B0
    assert not lv.recomputable(pad.name)


@pytest.mark.parametrize("scheduler", ["poet", "checkpoint"])
def test_tight_budgets_give_runnable_schedules(scheduler):
    """Before the fix both refused their own schedule at the smallest budget (operand labels is not resident)."""
    t, g, lv, a = _graph("jetson-nano")
    for frac in (0.0, 0.2, 0.5):
        budget = int(a.min_feasible_bytes + frac * (a.store_all_peak_bytes - a.min_feasible_bytes))
        try:
            r = run_scheduler(g, lv, t, budget, scheduler=scheduler, time_limit=5)
        except schedulers.BudgetError:
            assert scheduler != "poet"  # checkpointing may not fit; it must not break the rules
            continue
        assert r.report.peak_bytes <= budget


def test_padded_labels_plan_at_the_smallest_budget_trains_exactly(tmp_path):
    out = str(tmp_path / "plan")
    c = compile_model(CompileOptions(model=MODEL, target="jetson-nano", budget="min", out=out, batch_size=4,
                                     loss="model", time_limit=5))
    assert c["peak_bytes"] <= c["budget_bytes"] < c["store_all_peak_bytes"]
    r = run_plan(out, steps=2, check=True)
    assert r["ok"], r.get("error")
    assert r["max_abs_err"] <= 1e-6 and r["measured_peak_bytes"] == r["predicted_peak_bytes"]


def test_a_broken_schedule_of_its_own_is_reported_as_an_edgetrain_bug(tmp_path, capsys, monkeypatch):
    def broken_checkpoint(g, lv):  # a heuristic with a bug: keeps nothing backward reads, recomputes nothing
        d = store_all(g, lv)
        d.keep = set()
        for t in d.resident:
            d.resident[t] = set()
        return d

    monkeypatch.setattr(schedulers, "checkpoint", broken_checkpoint)
    rc = main(["compile", "small_cnn", "--target", "rpi4", "--budget", "100%", "--batch-size", "2", "--scheduler",
               "checkpoint", "--out", str(tmp_path / "o"), "--json"])
    out = capsys.readouterr()
    assert rc == 3 and "Traceback" not in out.err
    err = json.loads(out.out)["error"]
    assert err["kind"] == "internal"
    assert err["message"].startswith("an edgetrain bug: the checkpoint schedule it built breaks the memory model")
    assert "not resident" in err["message"] and "Please report it" in err["message"]
    assert not (tmp_path / "o").exists()
