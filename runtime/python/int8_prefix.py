"""An int8 frozen prefix run with the C kernels' integer arithmetic (int8_reference), to the dequantised boundary.

`program` is the JSON list a quantized graph's int8 nodes make (compiler/graph/quantize.py: each node's op and its
attrs["q8"]); `values` the integer parameters (int8 weights, int32 biases). The result is the float32 tensor the
float head reads, computed as the firmware must compute it: the bits to compare the firmware against.
"""
from __future__ import annotations

import json

import numpy as np

from . import int8_reference as ref


def _conv(x: np.ndarray, q: dict, values: dict) -> np.ndarray:
    rq = ref.Requant(np.asarray(q["mult"], np.int64), np.asarray(q["shift"], np.int64), q["zp"])
    return ref.conv2d_forward(x, q["x_zp"], values[q["weight"]], values[q["bias"]], rq, tuple(q["stride"]),
                              tuple(q["padding"]), tuple(q["dilation"]), q["groups"])


def run_prefix(program: str, values: dict[str, np.ndarray], x: np.ndarray) -> dict[str, np.ndarray]:
    """The boundary tensors (float32, by the dequantize steps' names) of the int8 prefix on the float input `x`."""
    held: dict[str, np.ndarray] = {}
    out: dict[str, np.ndarray] = {}
    for step in json.loads(program):
        op, q = step["op"], step["q8"]
        a = x if op == "q8_quantize" else held[step["input"]]
        if op == "q8_quantize":  # round half to even, as numpy and torch's quantize_per_tensor do
            v = np.clip(np.round(a.astype(np.float64) / q["scale"]) + q["zp"], -128, 127).astype(np.int8)
        elif op == "q8_conv2d":
            v = _conv(a, q, values)
        elif op == "q8_relu":
            v = ref.relu_forward(a, q["zp"])
        elif op == "q8_relu6":
            v = ref.relu6_forward(a, q["zp"], q["q6"])
        elif op == "q8_dequantize":
            out[step["name"]] = (np.float32(q["scale"]) * (a.astype(np.float32) - np.float32(q["zp"])))
            continue
        else:
            raise ValueError(f"an int8 prefix has no op {op!r}")
        held[step["name"]] = v
    return out
