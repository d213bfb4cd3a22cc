"""What bounds the smallest feasible budget, said where a budget is refused and by `edgetrain inspect`.

A small CNN as users write it (conv-BN-ReLU-pool twice, 3x32x32, batch 8): below its smallest budget the
refusal names the node whose working set is the bound (its op, the user's line, its inputs, outputs and
scratch) and what would lower it; the parts add up to the smallest budget. No message prints a negative size.
"""
from __future__ import annotations

import json
import re

import pytest
import torch
from torch import nn

from edgetrain.compiler.errors import BudgetError, DeviceFitError
from edgetrain.compiler.graph.liveness import analyze
from edgetrain.compiler.graph.streaming import choose_streamed
from edgetrain.compiler.pipeline import CompileOptions, build_graph, compile_model
from edgetrain.compiler.scheduling.bound import remedies, smallest_budget_bound
from edgetrain.compiler.scheduling.budget import min_budget
from edgetrain.compiler.scheduling.schedulers import run_scheduler
from edgetrain.compiler.workbench import cli
from edgetrain.targets import load_target


class UsersCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2))
        self.fc = nn.Linear(32 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.features(x), 1))


def users_cnn() -> nn.Module:
    torch.manual_seed(0)
    return UsersCNN()


users_cnn.input_shape = (3, 32, 32)  # type: ignore[attr-defined]
users_cnn.num_classes = 10  # type: ignore[attr-defined]

MODEL = "tests/test_budget_bound.py:users_cnn"


def _options(out, budget="100%") -> CompileOptions:
    return CompileOptions(model=MODEL, target="rpi4", budget=budget, out=str(out), batch_size=8, time_limit=10)


@pytest.fixture(scope="module")
def graph():
    _, _, g = build_graph(_options(""), load_target("rpi4"))
    return g, analyze(g)


def test_the_bound_is_the_stage_of_the_smallest_budget_and_its_parts_add_up(graph):
    g, lv = graph
    b = smallest_budget_bound(g, lv)
    assert b.budget_bytes == min_budget(lv)
    assert b.state_bytes + b.inputs_bytes + b.output_bytes + b.scratch_bytes + b.other_bytes == b.budget_bytes
    n = g.nodes[b.stage]
    assert (b.node, b.op, b.source) == (n.name, n.op, n.source) and b.source  # the user's line
    # No stage needs more: the bound's stage is where min_budget is reached.
    assert all(lv.static[t] <= b.budget_bytes for t in range(lv.T))


def test_a_budget_below_the_smallest_names_the_op_that_bounds_it(graph):
    g, lv = graph
    b = smallest_budget_bound(g, lv)
    with pytest.raises(BudgetError) as e:
        run_scheduler(g, lv, load_target("rpi4"), b.budget_bytes - 1, time_limit=5)
    msg = str(e.value)
    assert f"node `{b.node}` ({b.op}" in msg and b.source in msg
    for part in (f"inputs {b.inputs_bytes} B", f"outputs {b.output_bytes} B", f"scratch {b.scratch_bytes} B"):
        assert part in msg
    assert "--batch-size" in msg and "--train" in msg and remedies(b) in msg
    assert not re.search(r"-\d+ ?B", msg)


def test_inspect_says_what_bounds_the_smallest_budget(tmp_path, capsys, graph):
    g, lv = graph
    compile_model(_options(tmp_path / "o", "min"))
    capsys.readouterr()
    assert cli.main(["inspect", str(tmp_path / "o"), "--json"]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    b = smallest_budget_bound(g, lv)
    got = r["smallest_budget_bound"]
    assert (got["node"], got["budget_bytes"]) == (b.node, b.budget_bytes) == (got["node"], r["min_feasible_bytes"])
    assert cli.main(["inspect", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert f"node `{b.node}`" in out.replace("\n", " ") or b.node in out


def test_no_room_left_for_streaming_says_by_how_much_the_fixed_state_exceeds_ram():
    with pytest.raises(DeviceFitError) as e:
        choose_streamed({"a": 4000, "b": 3000}, flash_room=5000, ram_room=-129060, storage_bytes=10**6,
                        device="nrf52840")
    msg = str(e.value)
    assert "exceeds the RAM by 129060 B" in msg and "--train" in msg
    assert not re.search(r"-\d", msg)


def test_compile_below_the_smallest_budget_names_the_op_that_bounds_it(tmp_path, graph):
    g, lv = graph
    b = smallest_budget_bound(g, lv)
    with pytest.raises(BudgetError) as e:
        compile_model(_options(tmp_path / "o", str(b.budget_bytes - 1)))
    msg = str(e.value)
    assert f"node `{b.node}` ({b.op}" in msg and b.source in msg and remedies(b) in msg
    assert not re.search(r"-\d+ ?B", msg)
