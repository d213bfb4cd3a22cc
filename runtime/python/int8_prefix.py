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
    return ref.conv2d_forward(x, q["x_zp"], values[q["weight"]], values.get(q["bias"]), rq, tuple(q["stride"]),
                              tuple(q["padding"]), tuple(q["dilation"]), q["groups"])


def _dequantize(v: np.ndarray, scale: float, zp: int) -> np.ndarray:
    """float32 s * (q - zp): one float32 subtraction (exact) and one rounded product."""
    return np.float32(scale) * (v.astype(np.float32) - np.float32(zp))


def _quantize(v: np.ndarray, q: dict) -> np.ndarray:
    """int8 round(v / s) + zp, saturated: the quotient in float32 (the C runtime's), halves to even (lrintf's)."""
    return np.clip(np.rint(v / np.float32(q["scale"])) + q["zp"], -128, 127).astype(np.int8)


def run_prefix(program: str, values: dict[str, np.ndarray], x: np.ndarray) -> dict[str, np.ndarray]:
    """The boundary tensors (float32, by the dequantize steps' names) of the int8 prefix on the float input `x`."""
    held: dict[str, np.ndarray] = {}
    out: dict[str, np.ndarray] = {}
    for step in json.loads(program):
        op, q = step["op"], step["q8"]
        a = x if op == "q8_quantize" else held[step["inputs"][0]]
        if op == "q8_quantize":
            v = _quantize(a.astype(np.float32), q)
        elif op == "q8_add":  # float32 sum of the dequantised operands, quantised to the add's scale
            v = _quantize(_dequantize(a, *q["a"]) + _dequantize(held[step["inputs"][1]], *q["b"]), q)
        elif op == "q8_conv2d":
            v = _conv(a, q, values)
        elif op == "q8_relu":
            v = ref.relu_forward(a, q["zp"])
        elif op == "q8_relu6":
            v = ref.relu6_forward(a, q["zp"], q["q6"])
        elif op == "q8_dequantize":
            out[step["name"]] = _dequantize(a, q["scale"], q["zp"])
            continue
        else:
            raise ValueError(f"an int8 prefix has no op {op!r}")
        held[step["name"]] = v
    return out
