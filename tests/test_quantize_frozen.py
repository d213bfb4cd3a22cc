"""A frozen prefix in int8 (compiler/graph/quantize.py): real byte sizes in the graph, and the integer reference run
(runtime/python/int8_prefix.py) close to the float prefix it replaces."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from edgetrain.compiler.graph.liveness import analyze
from edgetrain.compiler.graph.quantize import (Q8_ADD, Q8_DEQUANTIZE, Q8_QUANTIZE, _run_float, activation_quant,
                                               boundary, calibrate, frozen_prefix, prefix_program, quantize_frozen,
                                               weight_quant)
from edgetrain.compiler.pipeline import CompileOptions, build_graph
from edgetrain.compiler.scheduling.budget import min_budget
from edgetrain.runtime.python import int8_reference as ref
from edgetrain.runtime.python.int8_prefix import run_prefix
from edgetrain.targets import load_target


@pytest.fixture(scope="module")
def built():
    opts = CompileOptions(model="mcu_mbv2_40", target="nrf52840", budget="auto", out="unused", batch_size=1, emit="c")
    _, model, g = build_graph(opts, load_target("nrf52840"))
    weights = dict(model.named_parameters())
    prefix = frozen_prefix(g)
    torch.manual_seed(0)
    ranges = calibrate(g, prefix, weights, [torch.rand(g.input_shape) for _ in range(4)])
    return g, weights, prefix, quantize_frozen(g, prefix, ranges, weights)


def test_the_prefix_stops_at_the_first_op_int8_cannot_run(built):
    g, _, prefix, _ = built
    # the whole frozen backbone, residual add included, up to the trained head's batch norm
    assert len(prefix) == 19 and prefix[:2] == ("convolution", "hardtanh") and "add" in prefix
    assert boundary(g, prefix) == ("convolution_10",)
    after = g.nodes[g.index(prefix[-1]) + 1]
    assert after.op == "aten._native_batch_norm_legit_functional.default" and set(after.params) <= set(g.trainable_params)
    assert all(p not in g.trainable_params for n in prefix for p in g.node(n).params)


def test_int8_nodes_count_one_byte_an_element_and_the_head_reads_floats(built):
    g, _, prefix, q = built
    for name in prefix:
        assert q.graph.node(name).dtype == "int8"
        assert q.graph.node(name).bytes * 4 == g.node(name).bytes
    for p in q.values:
        assert q.graph.params[p].dtype == ("int8" if p.endswith("weight") else "int32")
        assert q.values[p].dtype == np.dtype(q.graph.params[p].dtype)
    add = q.graph.node("add")
    assert add.op == Q8_ADD and [r.name for r in add.inputs] == ["hardtanh", "convolution_3"]
    head = g.nodes[g.index("convolution_10") + 1].name
    assert [r.name for r in q.graph.node(head).inputs] == ["convolution_10_dq"]
    dq = q.graph.node("convolution_10_dq")
    assert dq.op == Q8_DEQUANTIZE and dq.dtype == "float32"
    order = [n.name for n in q.graph.nodes]
    assert order.index("input_q8") < order.index("convolution") and q.graph.node("input_q8").op == Q8_QUANTIZE
    assert order.index("convolution_10") < order.index("convolution_10_dq") < order.index(head)
    # the memory model sees the smaller tensors: the least budget falls (448,600 -> 122,200 bytes when written)
    low_f, low_q = min_budget(analyze(g)), min_budget(analyze(q.graph))
    assert low_q < 0.35 * low_f


def test_the_integer_run_is_within_six_percent_of_the_float_prefix(built):
    g, weights, prefix, q = built
    torch.manual_seed(1)
    x = torch.rand(g.input_shape)
    out = run_prefix(prefix_program(q), q.values, x.numpy())
    seen = {"input": x}
    with torch.no_grad():
        for name in prefix:
            seen[name] = _run_float(g.node(name), [seen[r.name] for r in g.node(name).inputs], weights)
    assert set(out) == {"convolution_10_dq"}
    v, f = out["convolution_10_dq"], seen["convolution_10"].numpy()
    # int8 rounding at each of the 19 steps: the stated tolerance is a relative L2 error of 6% (3.5% when written)
    assert np.linalg.norm(v - f) <= 0.06 * np.linalg.norm(f)
    assert np.abs(v - f).max() >= q.graph.node("convolution_10_dq").attrs["q8"]["scale"] / 4  # quantised, not passed


def test_the_reference_is_the_kernels_arithmetic(built):
    """The first conv of the program recomputed by hand from its attrs: the reference's steps are int8_reference's."""
    g, _, _, q = built
    torch.manual_seed(2)
    x = torch.rand(g.input_shape).numpy()
    qin, conv = q.graph.node("input_q8").attrs["q8"], q.graph.node("convolution").attrs["q8"]
    xq = np.clip(np.rint(x / np.float32(qin["scale"])) + qin["zp"], -128, 127).astype(np.int8)
    y = ref.conv2d_forward(xq, conv["x_zp"], q.values[conv["weight"]], q.values[conv["bias"]],
                           ref.Requant(np.array(conv["mult"]), np.array(conv["shift"]), conv["zp"]),
                           tuple(conv["stride"]), tuple(conv["padding"]), tuple(conv["dilation"]), conv["groups"])
    y = ref.relu6_forward(y, conv["zp"], q.graph.node("hardtanh").attrs["q8"]["q6"])
    # the same program cut after the stem's ReLU6, with a dequantize of it appended
    program = [s for s in json.loads(prefix_program(q)) if s["name"] in ("input_q8", "convolution", "hardtanh")]
    program.append({"name": "stem", "op": "q8_dequantize", "inputs": ["hardtanh"], "q8": {"scale": conv["scale"],
                                                                                          "zp": conv["zp"]}})
    out = run_prefix(json.dumps(program), q.values, x)["stem"]
    assert np.array_equal(out, np.float32(conv["scale"]) * (y.astype(np.float32) - np.float32(conv["zp"])))


def test_quantisation_helpers():
    scale, zp = activation_quant(-1.0, 3.0)
    assert abs(scale * (127 - zp) - 3.0) < scale and abs(scale * (-128 - zp) + 1.0) < scale
    w = np.array([[0.5, -1.0], [0.0, 0.0], [2.0, 0.1]])
    qw, s = weight_quant(w)
    assert qw.dtype == np.int8 and list(qw[0]) == [64, -127] and list(qw[1]) == [0, 0] and qw[2, 0] == 127
    assert s[1] == 1.0  # an all-zero channel keeps a usable scale
