"""Frozen weights streamed from storage by a Python plan (compiler/passes.py: stream_to_fit, runtime/python/
streamed_weights.py): a bf16 Llama with LoRA whose frozen base does not fit the budget trains as eager autograd,
its ledger equal to the predicted peak, every streamed weight read once per reader per step."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

from edgetrain.codegen.python_backend import PythonBackend  # noqa: E402
from edgetrain.compiler.graph.ir import OptimizerConfig  # noqa: E402
from edgetrain.compiler.graph.liveness import analyze  # noqa: E402
from edgetrain.compiler.graph.streaming import stream_until, stream_weights  # noqa: E402
from edgetrain.compiler.model_graph import trace_model  # noqa: E402
from edgetrain.compiler.pipeline import CompileOptions, compile_model  # noqa: E402
from edgetrain.compiler.schedule_file import format as schedule_format  # noqa: E402
from edgetrain.compiler.scheduling.budget import min_budget  # noqa: E402
from edgetrain.compiler.workbench.run import run_plan  # noqa: E402
from edgetrain.targets import load_target  # noqa: E402

from test_user_models import OPTIMIZERS  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = "tests/llm_models.py:llama"
TARGET = "jetson-orin-nano"
BF16 = {"dtype": "bfloat16"}


def _opts(out, budget, optimizer="adamw", **kwargs) -> CompileOptions:
    return CompileOptions(model=SPEC, target=TARGET, budget=budget, out=str(out), batch_size=1, time_limit=5,
                          loss="model", optimizer=OPTIMIZERS[optimizer], model_kwargs={**BF16, **kwargs})


@pytest.fixture(scope="module")
def graph():
    return trace_model(_opts("unused", "100%"), load_target(TARGET), PythonBackend()).graph


def _streamed(schedule: dict) -> set[str]:
    return {p for n in schedule["graph"]["nodes"] for p in n.get("streamed", ())}


def test_stream_until_takes_the_shortest_run_of_the_largest_frozen_weights(graph):
    frozen = [p for p in graph.params if p not in set(graph.trainable_params)]
    largest = max(graph.params[p].bytes for p in frozen)
    low = min_budget(analyze(graph))
    assert stream_until(graph, lambda g: min_budget(analyze(g)) <= low, 1 << 40) == []  # fits as it is
    chosen = stream_until(graph, lambda g: min_budget(analyze(g)) <= low - 1, 1 << 40)
    assert len(chosen) == 1 and graph.params[chosen[0]].bytes == largest  # the tied embedding
    # a streamed weight leaves the resident state, and is its readers' workspace
    g = stream_weights(graph, chosen)
    assert g.param_bytes == graph.param_bytes - largest
    readers = [n for n in g.nodes if chosen[0] in n.streamed]
    assert readers and all(n.workspace_bytes >= largest for n in readers)
    # the storage's size bounds it; a fit never reached streams all that storage holds
    assert stream_until(graph, lambda g: False, largest - 1) == []
    everything = stream_until(graph, lambda g: False, 1 << 40)
    assert set(everything) == {p for p in frozen if graph.params[p].bytes}


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_a_bf16_llama_streaming_its_frozen_base_trains_as_eager_autograd(tmp_path, graph, optimizer):
    in_memory = min_budget(analyze(graph))
    budget = in_memory * 3 // 4  # no schedule keeping every frozen weight in memory fits
    c = compile_model(_opts(tmp_path, str(budget), optimizer))
    s = schedule_format.load(str(tmp_path))
    streamed = _streamed(s)
    assert streamed and not streamed & set(s["graph"]["trainable"])
    assert c["streamed"] and set(c["streamed"]) == streamed and c["peak_bytes"] <= budget
    result = run_plan(str(tmp_path), steps=2, check=True)
    assert result["ok"], result.get("error")
    assert result["max_abs_err"] == 0.0  # bf16 base, streamed or not: the same kernels on the same bytes
    assert result["measured_peak_bytes"] == result["predicted_peak_bytes"] <= budget
    # every page-in the schedule predicts, streamed weights' reads among them, and no other
    assert result["paged_bytes"] == 2 * s["predicted"]["paged_bytes"]


def test_a_budget_that_fits_streams_nothing(tmp_path):
    compile_model(_opts(tmp_path, "100%"))
    s = schedule_format.load(str(tmp_path))
    assert not _streamed(s)
    assert "streamed" not in open(tmp_path / "plan.py").read()


@pytest.mark.slow
def test_real_memory_of_a_streaming_step_stays_within_the_budget():
    """benchmarks/streamed_memory.py: 40 MB of frozen bf16 weights at a 30 MB budget, real memory measured."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "streamed_memory.py"), "--budget", "30MB",
                        "--json"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:] + r.stdout[-2000:]
    row = json.loads(r.stdout.strip().splitlines()[-1])
    assert row["malloc_isolated"] and row["streamed_weights"] > 0 and row["frozen_bytes"] > row["budget_bytes"]
    assert row["ledger_peak_bytes"] == row["schedule_peak_bytes"] <= row["budget_bytes"]
    assert row["real_bytes"] <= row["budget_bytes"], row


def test_the_stream_choice_spends_only_its_share_of_a_short_time_limit(tmp_path, graph):
    """At --time-limit 1 the choice has a quarter second: a MILP whose build alone takes seconds is not tried, the
    rule's weights stream, and choosing them takes a fraction of the limit (it took 8 s when the MILP was built
    regardless)."""
    budget = min_budget(analyze(graph)) * 3 // 4
    o = _opts(tmp_path, str(budget))
    c = compile_model(dataclasses.replace(o, time_limit=1.0))
    s = c["streaming"]
    assert s["kept"] == "rule" and s["skipped"] and "decision tensors" in s["skipped"]
    assert set(c["streamed"]) == set(s["rule"]) and c["peak_bytes"] <= budget
    assert s["seconds"] <= s["share_s"] == pytest.approx(0.25)
    assert c["phases"]["place_weights"] < 1.0  # the choice's pass as a whole, within the limit asked for
