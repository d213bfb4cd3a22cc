"""Profiler fit: pure least squares, and real measurements of a layer + AAN-LL head that are linear in batch."""
import copy

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from edgetrain.compiler.frontend import zoo
from edgetrain.compiler.local.heads import head_spec, split_layers
from edgetrain.compiler.local.spec import make_head
from edgetrain.compiler.local.memory_lines import (fit_line, max_batch_under, measure_model_step_bytes, measure_step_bytes, model_memory_line, profile_layers, profiler_peak_bytes)
from edgetrain.compiler.local.partition import PartitionError, partition


def test_fit_line_exact_and_noisy():
    f = fit_line([1, 2, 4, 8], [150, 250, 450, 850])
    assert f.slope == pytest.approx(100) and f.intercept == pytest.approx(50) and f.r2 == pytest.approx(1)
    assert f.predict(16) == pytest.approx(1650)
    rng = np.random.default_rng(0)
    b = np.array([2, 4, 8, 16, 32, 64])
    y = 1000 * b + 5000 + rng.normal(0, 300, size=b.shape)
    g = fit_line(b, y)
    assert abs(g.slope - 1000) < 50 and 0.99 < g.r2 < 1
    assert fit_line([1, 2], [7, 7]).r2 == 1.0
    with pytest.raises(ValueError):
        fit_line([4, 4], [1, 2])
    with pytest.raises(ValueError):
        fit_line([1, 2, 3], [1, 2])
    line = f.to_line("conv")
    assert line.name == "conv" and line.bytes_at(3) == pytest.approx(350)


@settings(max_examples=100, deadline=None)
@given(slope=st.floats(1, 1e7), intercept=st.floats(0, 1e9),
       batches=st.lists(st.integers(1, 512), min_size=2, max_size=8, unique=True))
def test_fit_recovers_any_exact_line(slope, intercept, batches):
    f = fit_line(batches, [slope * b + intercept for b in batches])
    assert f.slope == pytest.approx(slope, rel=1e-6)
    assert f.predict(1000) == pytest.approx(slope * 1000 + intercept, rel=1e-6)
    assert f.r2 > 0.999999


def test_counter_components_on_a_conv_layer():
    torch.manual_seed(0)
    tl = split_layers(zoo.build("small_cnn"), (1, 28, 28))[1]   # conv 8->8 + BN + ReLU + max-pool
    spec = head_spec(tl.out_shape)
    s = measure_step_bytes(copy.deepcopy(tl.module), make_head(spec), tl.in_shape, 16)
    n_params = sum(p.numel() for p in tl.module.parameters()) + spec.params
    n_buffers = sum(b.untyped_storage().nbytes() for b in tl.module.buffers())
    assert s.static == 3 * 4 * n_params + n_buffers                 # param + grad + momentum
    assert s.batch_io == 16 * (4 * 8 * 28 * 28 + 8)                   # float input + int64 labels
    act = 16 * 4 * 8 * 28 * 28
    assert s.saved >= 2 * act                                         # conv out/BN out/ReLU out, at least two
    assert s.backward_grad == act
    assert np.isfinite(s.loss)


def test_real_layers_are_linear_in_batch_and_predict_held_out():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = zoo.build("vgg11")
    profs = profile_layers(model, batches=(2, 4, 8, 16), held_out=32)
    assert len(profs) == 8
    for p in profs:
        assert p.fit.r2 > 0.99, p.name
        assert p.held_out_rel_error < 0.10, (p.name, p.held_out_measured, p.held_out_predicted)
        assert p.fit.slope > 0
    # first layer: slope is at least its output activation (saved) + its gradient, per sample
    assert profs[0].fit.slope >= 2 * 4 * 64 * 16 * 16
    # the lines feed the partitioner: a budget that fits batch 8 of the hungriest layer
    lines = [p.fit.to_line(p.name) for p in profs]
    budget = max(ln.bytes_at(8) for ln in lines)
    part = partition(lines, budget)
    assert min(part.batches) >= 8
    assert p.to_dict()["held_out_rel_error"] == p.held_out_rel_error


def test_profiler_cross_check_on_first_layers():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = zoo.build("vgg11")
    profs = profile_layers(model, batches=(2, 4, 8, 16), held_out=32, layers=[0, 1], method="profiler")
    for p in profs:  # activation-dominated layers: the allocator-level peak is linear too
        assert p.fit.r2 > 0.99 and p.held_out_rel_error < 0.10, p.name
    tl = split_layers(model)[0]
    spec = head_spec(tl.out_shape)
    for b in (4, 16):
        step = measure_step_bytes(copy.deepcopy(tl.module), make_head(spec), tl.in_shape, b)
        assert step.scratch > 0  # a convolution's kernel scratch is counted
        # torch's allocator events do not see oneDNN's scratch: compare the tensors both count
        counted = step.peak - step.scratch
        seen = profiler_peak_bytes(copy.deepcopy(tl.module), make_head(spec), tl.in_shape, b)
        assert 0.7 < seen / counted < 1.3, (b, seen, counted)
    with pytest.raises(ValueError):
        profile_layers(model, layers=[0], method="cuda")


def test_main_prints_lines_and_blocks(capsys):
    from edgetrain.compiler.local.memory_lines import main

    main(["vgg11", "--budget-mb", "64"])
    out = capsys.readouterr().out
    assert "features.25" in out and "block 0: batch" in out and "R2" in out


# -- backprop baseline: the whole model's step, same counting rules ----------------------------------


def test_model_counter_matches_layer_counter_on_layer_plus_head():
    # A model that *is* one layer + its head: both counters must give the same bytes (same rules, same code).
    torch.manual_seed(0)
    tl = split_layers(zoo.build("small_cnn"), (1, 28, 28))[1]
    head = make_head(head_spec(tl.out_shape))
    a = measure_step_bytes(copy.deepcopy(tl.module), copy.deepcopy(head), tl.in_shape, 8)
    b = measure_model_step_bytes(torch.nn.Sequential(copy.deepcopy(tl.module), copy.deepcopy(head)),
                                 tl.in_shape, 8)
    assert (a.static, a.batch_io, a.saved, a.backward_grad, a.made, a.grads) == \
        (b.static, b.batch_io, b.saved, b.backward_grad, b.made, b.grads)
    assert a.loss == pytest.approx(b.loss)


def test_model_counter_holds_more_than_any_local_step():
    torch.manual_seed(0)
    model = zoo.build("small_cnn")
    whole = measure_model_step_bytes(copy.deepcopy(model), (1, 28, 28), 8)
    n_params = sum(p.numel() for p in model.parameters())
    n_buffers = sum(b.untyped_storage().nbytes() for b in model.buffers())
    assert whole.static == 3 * 4 * n_params + n_buffers
    layers = split_layers(model, (1, 28, 28))
    saved_local = [measure_step_bytes(copy.deepcopy(tl.module), make_head(head_spec(tl.out_shape)),
                                      tl.in_shape, 8).saved for tl in layers]
    # backprop keeps every layer's activations at once; local learning one layer's (+ a small head)
    assert whole.saved > max(saved_local)


def test_model_memory_line_is_linear_and_max_batch_respects_budget():
    torch.manual_seed(0)
    model = zoo.build("small_cnn")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    line = model_memory_line(model, (1, 28, 28), (2, 4, 8, 16))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # untouched
    assert line.r2 > 0.99 and line.slope > 0 and line.n_points == 4
    held_out = measure_model_step_bytes(copy.deepcopy(model), (1, 28, 28), 32).peak
    assert abs(line.predict(32) - held_out) / held_out < 0.05
    budget = line.predict(40) + line.slope / 2          # room for 40 samples, not 41
    b = max_batch_under(line, budget, cap=256)
    assert b == 40 and line.predict(b) <= budget < line.predict(b + 1)
    assert measure_model_step_bytes(copy.deepcopy(model), (1, 28, 28), b).peak <= budget * 1.01
    assert max_batch_under(line, budget, cap=16) == 16
    with pytest.raises(PartitionError, match="batch 1"):
        max_batch_under(line, line.predict(1) - 1)
