"""Prepared calls: a node's call is read once and reused, but never with arguments other than the call's own."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from edgetrain.runtime.python import Runtime, prepared

ADD, MUL = "aten.add.Tensor", "aten.mul.Tensor"
CONV, CONV_BW = "aten.convolution.default", "aten.convolution_backward.default"
BN = "aten._native_batch_norm_legit_functional.default"


def T(k: int) -> dict:
    return {"$t": k}


@pytest.fixture
def rt(tmp_path):
    g = torch.Generator().manual_seed(11)
    save_file({"param/w": torch.rand(3, generator=g) + 0.5, "param/b": torch.randn(3, generator=g),
               "param/k": torch.randn(3, 3, 1, 1, generator=g), "buffer/rm": torch.randn(3, generator=g),
               "buffer/rv": torch.rand(3, generator=g) + 0.5}, str(tmp_path / "w.safetensors"))
    return Runtime(tmp_path / "w.safetensors", tmp_path / "pages", device="cpu", lr=0.1, momentum=0.9)


def _step(rt, x, body):
    rt.begin_step(x, torch.zeros(x.shape[0], dtype=torch.long))
    rt.load_input()
    out = body(rt)
    rt.free("input")
    rt.end_step()
    return out


def test_attrs_that_change_between_calls_are_read_anew(rt):
    x = torch.randn(4, 3, 2, 2)
    attrs = {"args": [T(0), T(1)], "kwargs": {"alpha": 2}}
    seen = []

    def body(r):
        seen.append(r.compute("s", ADD, ["input", "input"], attrs=attrs).clone())
        r.free("s")

    _step(rt, x, body)
    assert torch.equal(seen[-1], x + 2 * x)
    attrs["kwargs"]["alpha"] = 3  # the same dict, changed in place
    _step(rt, x, body)
    assert torch.equal(seen[-1], x + 3 * x)
    attrs = {"args": [T(0), T(1)], "kwargs": {"alpha": 3}}  # a new dict, equal: still right
    _step(rt, x, body)
    assert torch.equal(seen[-1], x + 3 * x)
    attrs = {"args": [T(0), T(1)], "scratch": 1000}  # the scratch is counted from the call that carries it
    rt.ledger.reset_peak()
    _step(rt, x, body)
    assert torch.equal(seen[-1], x + x)
    assert rt.ledger.peak_bytes == rt.ledger.live_bytes + 2 * x.nbytes + 1000


def test_operands_that_change_between_calls_are_read_anew(rt):
    x = torch.randn(4, 3, 2, 2)

    def body(inputs):
        def run(r):
            r.compute("sq", MUL, ["input", "input"], attrs={"args": [T(0), T(1)]})
            out = r.compute("s", ADD, inputs, attrs={"args": [T(0), T(1)]}).clone()
            r.free("s")
            r.free("sq")
            return out
        return run

    assert torch.equal(_step(rt, x, body(["input", "sq"])), x + x * x)
    assert torch.equal(_step(rt, x, body(["sq", "sq"])), x * x + x * x)
    view = {"t": "input", "view": [["aten.permute.default", [[0, 1, 3, 2]]]]}
    assert torch.equal(_step(rt, x, body(["sq", view])), x * x + x.permute(0, 1, 3, 2))


def test_a_compute_and_a_recompute_of_one_node_are_each_prepared_right(rt):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 3, 5, 5, generator=g)
    attrs = {"args": [T(0), {"$p": "w"}, {"$p": "b"}, {"$b": "rm"}, {"$b": "rv"}, True, 0.1, 1e-5], "aux": [1, 2],
             "keep": 0, "updates": [{"buffer": "rm", "item": 3}, {"buffer": "rv", "item": 4}]}
    w, b = rt.params["w"].clone(), rt.params["b"].clone()
    rm, rv = rt.buffers["rm"].clone(), rt.buffers["rv"].clone()
    for step in range(3):  # the second and third reuse what the first prepared
        want = torch.nn.functional.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-5)
        outs = []

        def body(r):
            outs.append(r.compute("bn", BN, ["input"], attrs=attrs).clone())
            assert "bn.aux" in r.resident()  # a first computation keeps its statistics
            r.free("bn")
            outs.append(r.recompute("bn", BN, ["input"], attrs=attrs).clone())
            assert "bn.aux" in r.resident()  # the recompute held no second copy: still one aux
            r.free("bn")
            r.free("bn.aux")

        _step(rt, x, body)
        assert torch.equal(outs[0], want) and torch.equal(outs[1], want), step
        # the running statistics moved once per step (by the compute), never by the recompute
        assert torch.equal(rt.buffers["rm"], rm) and torch.equal(rt.buffers["rv"], rv), step
    assert {k for k in rt._prepared} == {("bn", True), ("bn", False)}


def test_each_node_is_prepared_once_and_parameters_are_read_as_updated(rt, monkeypatch):
    calls = []
    real = prepared.prepare
    monkeypatch.setattr(prepared, "prepare", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    x = torch.randn(2, 3, 4, 4)
    conv = {"args": [T(0), {"$p": "k"}, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1]}
    bw = {"args": [T(0), T(1), {"$p": "k"}, [0], [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [True, True, False]],
          "keep": 0, "updates": [{"item": 1, "param": "k"}]}
    ref_k = rt.params["k"].clone()
    opt_k = torch.nn.Parameter(ref_k.clone())
    opt = torch.optim.SGD([opt_k], lr=0.1, momentum=0.9, foreach=False)
    for _ in range(3):
        def body(r):
            y = r.compute("c", CONV, ["input"], attrs=conv).clone()
            r.compute("g", CONV_BW, ["c", "input"], attrs=bw)
            r.free("c")
            r.free("g")
            return y

        y = _step(rt, x, body)
        want = torch.nn.functional.conv2d(x, opt_k.detach())
        assert torch.equal(y, want)  # read the weights as the last step's update left them
        opt.zero_grad()
        torch.nn.functional.conv2d(x, opt_k).backward(want)
        opt.step()
        assert torch.equal(rt.params["k"], opt_k.detach())
    assert calls == ["c", "g"]


def test_parameters_and_buffers_are_read_only_mappings(rt):
    with pytest.raises(TypeError):
        rt.params["w"] = torch.zeros(3)
    with pytest.raises(TypeError):
        rt.buffers["rm"] = torch.zeros(3)
    rt.params["w"].zero_()  # the tensors themselves may change in place (a resumed checkpoint)
    assert torch.equal(rt.params["w"], torch.zeros(3))


def test_a_float_json_cannot_write_travels_as_a_marker_and_comes_back_exact():
    """inf, -inf and nan (attention's mask fill, traced as torch's math) are written as {"$float": ...}: the schedule
    stays standard JSON, and the runtime gives the op the float itself."""
    import json
    import math

    from edgetrain.compiler.graph.aten_node import literal
    from edgetrain.runtime.python import aten_call

    args = [float("-inf"), float("inf"), float("nan"), 1.5, [2, float("-inf")]]
    written = literal(args, "test")
    text = json.dumps(written, allow_nan=False)  # raises if a bare Infinity or NaN were left
    back = aten_call.fill(json.loads(text), [], {}, {}, None, torch.device("cpu"))
    assert back[0] == -math.inf and back[1] == math.inf and math.isnan(back[2]) and back[3] == 1.5
    assert back[4] == [2, -math.inf]  # a plan that holds one runs: tests/test_transformer_exactness.py, GPU plan
