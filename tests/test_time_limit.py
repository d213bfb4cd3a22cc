"""`--time-limit` bounds the whole compile (starts, solves, sub-solves, retries), not each solve in it."""
from __future__ import annotations

import time

import pytest

from edgetrain.compiler.pipeline import CompileOptions, build_graph, compile_model
from edgetrain.compiler.scheduling import clock
from edgetrain.targets import load_target


def test_clamp_gives_a_solve_what_is_left():
    assert clock.clamp(30.0) == 30.0 and clock.left() is None  # outside a compile: the solve's own limit
    with clock.deadline(5.0):
        assert 4.0 < clock.clamp(30.0) <= 5.0 and clock.clamp(2.0) == 2.0
    with clock.deadline(-1.0):
        assert clock.expired() and clock.clamp(30.0) == clock.MIN_SOLVE_S and clock.clamp(0.2) == 0.2



def test_reserve_gives_the_solve_its_share_after_a_long_trace():
    with clock.deadline(-3.0):  # the trace took the whole limit and more
        clock.reserve(20.0)
        assert 19.0 < clock.left() <= 20.0 and clock.clamp(30.0) > 19.0
    with clock.deadline(50.0):  # time left: the deadline stays
        clock.reserve(20.0)
        assert 45.0 < clock.left() <= 50.0
    with clock.deadline(-3.0):
        clock.stop()
        clock.reserve(20.0)
        assert clock.clamp(30.0) == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("model,budget", [("resnet18", "88%")])
def test_a_compile_keeps_to_its_time_limit(tmp_path, model, budget):
    """A time-limited compile of a zoo model at a tight budget: its wall time, less one capture of the model,
    stays within the limit (10 s of margin for the replay, the MILP's build and the files)."""
    opts = CompileOptions(model=model, target="rpi4", budget=budget, out=str(tmp_path / "o"), batch_size=4,
                          time_limit=6.0, lns=0.4)
    t0 = time.perf_counter()
    build_graph(opts, load_target("rpi4"))
    capture = time.perf_counter() - t0
    t0 = time.perf_counter()
    r = compile_model(opts)
    wall = time.perf_counter() - t0
    assert r["peak_bytes"] <= r["budget_bytes"]
    assert wall <= opts.time_limit + capture + 10.0, (wall, capture)
    assert r["solver"]["seconds"] <= opts.time_limit + 1.0
