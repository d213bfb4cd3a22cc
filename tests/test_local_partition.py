"""Algorithm 1 (NeuroFlux partitioner) on synthetic memory lines: hand-worked example + hypothesis properties."""
import json
import math

import pytest
from hypothesis import given, settings, strategies as st

from edgetrain.compiler.errors import BudgetError
from edgetrain.compiler.local.partition import Line, PartitionError, feasible_batch, group, partition


def reference_algorithm1(lines, budget, cap=256, rho=0.40):
    """Direct transcription of Algorithm 1 as the paper's prose states it (see partition.py's docstring).

    for each layer: b = floor((budget - c) / m); if b > limit: b = limit
    blocks = []; current = [layer 0]
    for n = 1..N-1: if |b_n - b_{n-1}| / b_{n-1} < rho: current += [n] else: close current, current = [n]
    block batch = min of its layers' b
    """
    b = []
    for ln in lines:
        v = cap if ln.slope <= 0 else math.floor((budget - ln.intercept) / ln.slope)
        while ln.slope > 0 and v >= 1 and ln.slope * v + ln.intercept > budget:
            v -= 1  # float rounding: the largest b whose line value fits
        while ln.slope > 0 and v < cap and ln.slope * (v + 1) + ln.intercept <= budget:
            v += 1
        if v > cap:
            v = cap
        b.append(v)
    blocks, current = [], [0]
    for n in range(1, len(lines)):
        if abs(b[n] - b[n - 1]) / b[n - 1] < rho:
            current.append(n)
        else:
            blocks.append(current)
            current = [n]
    blocks.append(current)
    return [(blk, min(b[i] for i in blk)) for blk in blocks]


def test_worked_example_by_hand():
    # budget 1 MB; feasible batches: 40, 60, 75, 200, 300->256 (cap), 1000->256 (cap)
    # 40->60: |20|/40 = 0.50 >= 0.4 split; 60->75: 0.25 join; 75->200: 1.67 split;
    # 200->256: 0.28 join; 256->256: 0 join.
    lines = [
        Line("conv0", 20_000, 200_000),
        Line("conv1", 15_000, 100_000),
        Line("conv2", 12_000, 100_000),
        Line("conv3", 4_000, 200_000),
        Line("conv4", 3_000, 100_000),
        Line("conv5", 1_000, 0),
    ]
    p = partition(lines, 1_000_000)
    assert p.layer_names == [["conv0"], ["conv1", "conv2"], ["conv3", "conv4", "conv5"]]
    assert p.batches == [40, 60, 200]
    assert [lb.feasible_batch for b in p.blocks for lb in b.layers] == [40, 60, 75, 200, 256, 256]
    assert [lb.uncapped_batch for b in p.blocks for lb in b.layers] == [40, 60, 75, 200, 300, 1000]
    assert p.blocks[0].peak_bytes == 1_000_000  # conv0 fills the budget exactly at 40
    assert p.blocks[2].peak_bytes == 4_000 * 200 + 200_000
    d = json.loads(p.to_json())
    assert d["rho"] == 0.4 and d["cap"] == 256 and d["budget"] == 1_000_000
    assert [blk["batch"] for blk in d["blocks"]] == [40, 60, 200]
    assert reference_algorithm1(lines, 1_000_000) == [([0], 40), ([1, 2], 60), ([3, 4, 5], 200)]


def test_rho_is_strict_and_relative_to_previous_layer():
    assert group([100, 140]) == [[0], [1]]  # exactly 40%: not below the margin
    assert group([100, 139]) == [[0, 1]]
    assert group([100, 61]) == [[0, 1]]     # 39% down
    assert group([100, 60]) == [[0], [1]]   # 40% down
    # neighbours, not the block's first layer: 100 -> 130 -> 169 -> 219 drifts but stays one block
    assert group([100, 130, 169, 219]) == [[0, 1, 2, 3]]
    assert group([5, 5, 5], rho=0.0) == [[0], [1], [2]]


def test_layer_that_cannot_fit_batch_one_is_named():
    lines = [Line("ok", 10, 0), Line("features.3", 600, 500)]
    with pytest.raises(PartitionError, match=r"features\.3.*1100 bytes at batch 1.*budget of 1000") as e:
        partition(lines, 1000)
    assert isinstance(e.value, BudgetError)
    with pytest.raises(PartitionError, match="flat"):
        partition([Line("flat", 0, 2000)], 1000)


def test_flat_line_gets_cap_and_boundary_is_exact():
    assert feasible_batch(Line("f", 0.0, 10), 100, cap=64) == (64, None)
    assert feasible_batch(Line("x", 3, 1), 100) == (33, 33)   # 3*33+1 = 100 fits exactly
    assert feasible_batch(Line("x", 3, 2), 100) == (32, 32)
    # float rounding at the boundary: floor(0.3 / 0.1) == 2 in floats, yet 0.1*3 + 0.2 <= 0.5 fits
    assert feasible_batch(Line("x", 0.1, 0.2), 0.5) == (3, 3)
    with pytest.raises(PartitionError):
        partition([], 100)


lines_st = st.lists(
    st.builds(
        Line,
        name=st.text("abcdefgh", min_size=1, max_size=4),
        slope=st.one_of(st.integers(1, 2_000_000).map(float), st.floats(0.5, 5e6)),
        intercept=st.one_of(st.integers(0, 50_000_000).map(float), st.floats(0, 5e7)),
    ),
    min_size=1, max_size=24,
)


@settings(max_examples=300, deadline=None)
@given(lines=lines_st, extra=st.floats(0, 5e8), cap=st.integers(1, 1024),
       rho=st.sampled_from([0.0, 0.1, 0.25, 0.4, 0.7, 1.0]))
def test_properties_against_reference(lines, extra, cap, rho):
    budget = max(ln.bytes_at(1) for ln in lines) + extra  # every layer fits batch 1
    p = partition(lines, budget, cap=cap, rho=rho)
    # blocks cover all layers, in order, each once, consecutive
    flat = [lb.index for b in p.blocks for lb in b.layers]
    assert flat == list(range(len(lines)))
    for b in p.blocks:
        assert 1 <= b.batch <= cap
        assert b.batch == min(lb.feasible_batch for lb in b.layers)
        for lb in b.layers:
            # every layer of the block fits the budget at the block's batch
            assert lines[lb.index].bytes_at(b.batch) <= budget
            # ... and its own feasible batch is maximal (one more would not fit, unless capped)
            if lb.feasible_batch < cap:
                assert lines[lb.index].bytes_at(lb.feasible_batch + 1) > budget
        # inside a block, neighbours differ by < rho; across a block boundary, by >= rho
        fbs = [lb.feasible_batch for lb in b.layers]
        assert all(abs(x - y) < rho * y for y, x in zip(fbs, fbs[1:]))
    for prev, nxt in zip(p.blocks, p.blocks[1:]):
        y, x = prev.layers[-1].feasible_batch, nxt.layers[0].feasible_batch
        assert abs(x - y) >= rho * y
    # same grouping and batches as the direct transcription of Algorithm 1
    ref = reference_algorithm1(lines, budget, cap, rho)
    assert [([lb.index for lb in b.layers], b.batch) for b in p.blocks] == ref
    json.loads(p.to_json())


@settings(max_examples=100, deadline=None)
@given(lines=lines_st)
def test_infeasible_budget_raises(lines):
    worst = max(lines, key=lambda ln: ln.bytes_at(1))
    with pytest.raises(PartitionError, match="batch 1"):
        partition(lines, worst.bytes_at(1) * 0.999)
