"""A frozen prefix in int8 (compiler/graph/quantize.py): real byte sizes in the graph, and the integer reference run
(runtime/python/int8_prefix.py) close to the float prefix it replaces."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from edgetrain.compiler.graph.liveness import analyze
from edgetrain.compiler.graph.quantize import (Q8_DEQUANTIZE, Q8_QUANTIZE, _run_float, activation_quant,
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
    # the stem and the first inverted residual block up to its residual add (no int8 add kernel)
    assert prefix == ("convolution", "hardtanh", "convolution_1", "hardtanh_1", "convolution_2", "hardtanh_2",
                      "convolution_3")
    assert boundary(g, prefix) == ("hardtanh", "convolution_3")  # both operands of the add
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
    assert [r.name for r in add.inputs] == ["hardtanh_dq", "convolution_3_dq"]
    assert q.graph.node("hardtanh_dq").op == Q8_DEQUANTIZE and q.graph.node("hardtanh_dq").dtype == "float32"
    order = [n.name for n in q.graph.nodes]
    assert order.index("input_q8") < order.index("convolution") and q.graph.node("input_q8").op == Q8_QUANTIZE
    assert order.index("convolution_3") < order.index("hardtanh_dq") < order.index("add")
    # the memory model sees the smaller tensors: the least budget falls (448,600 -> 218,200 bytes when written)
    low_f, low_q = min_budget(analyze(g)), min_budget(analyze(q.graph))
    assert low_q < 0.6 * low_f


def test_the_integer_run_is_within_five_percent_of_the_float_prefix(built):
    g, weights, prefix, q = built
    torch.manual_seed(1)
    x = torch.rand(g.input_shape)
    out = run_prefix(prefix_program(q), q.values, x.numpy())
    seen = {"input": x}
    with torch.no_grad():
        for name in prefix:
            seen[name] = _run_float(g.node(name), seen[g.node(name).inputs[0].name], weights)
    assert set(out) == {"hardtanh_dq", "convolution_3_dq"}
    for name, v in out.items():
        f = seen[name[:-3]].numpy()
        scale = q.graph.node(name).attrs["q8"]["scale"]
        # int8 rounding at every step: the stated tolerance, 5% of the tensor's largest magnitude
        assert np.abs(v - f).max() <= 0.05 * np.abs(f).max()
        assert np.abs(v - f).max() >= scale / 4  # it is quantised, not the float tensor passed through


def test_the_reference_is_the_kernels_arithmetic(built):
    """The first conv of the program recomputed by hand from its attrs: the reference's steps are int8_reference's."""
    g, _, _, q = built
    torch.manual_seed(2)
    x = torch.rand(g.input_shape).numpy()
    qin, conv = q.graph.node("input_q8").attrs["q8"], q.graph.node("convolution").attrs["q8"]
    xq = np.clip(np.round(x.astype(np.float64) / qin["scale"]) + qin["zp"], -128, 127).astype(np.int8)
    y = ref.conv2d_forward(xq, conv["x_zp"], q.values[conv["weight"]], q.values[conv["bias"]],
                           ref.Requant(np.array(conv["mult"]), np.array(conv["shift"]), conv["zp"]),
                           tuple(conv["stride"]), tuple(conv["padding"]), tuple(conv["dilation"]), conv["groups"])
    y = ref.relu6_forward(y, conv["zp"], q.graph.node("hardtanh").attrs["q8"]["q6"])
    out = run_prefix(prefix_program(q), q.values, x)["hardtanh_dq"]
    assert np.array_equal(out, np.float32(conv["scale"]) * (y.astype(np.float32) - np.float32(conv["zp"])))


def test_quantisation_helpers():
    scale, zp = activation_quant(-1.0, 3.0)
    assert abs(scale * (127 - zp) - 3.0) < scale and abs(scale * (-128 - zp) + 1.0) < scale
    w = np.array([[0.5, -1.0], [0.0, 0.0], [2.0, 0.1]])
    qw, s = weight_quant(w)
    assert qw.dtype == np.int8 and list(qw[0]) == [64, -127] and list(qw[1]) == [0, 0] and qw[2, 0] == 127
    assert s[1] == 1.0  # an all-zero channel keeps a usable scale
