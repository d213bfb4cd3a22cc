"""An int8 frozen prefix run with the C kernels' integer arithmetic (int8_reference), to the dequantised boundary.

`program` is the JSON list a quantized graph's int8 nodes make (compiler/graph/quantize.py: each node's op and its
attrs["q8"]); `values` the integer parameters (int8 weights, int32 biases). The result is the float32 tensor the
float head reads, computed as the firmware must compute it: the bits to compare the firmware against.

A prefix computed patch by patch (compiler/graph/tiling.py's int8 plan, a "q8_patches" step) runs here tile by tile
as the firmware does: each op on its operands' patches, a convolution's padding made explicit with its input's zero
point, the quantisation on its crop of the float input. `untiled` gives the same program with those steps expanded
back into one op per node: the two must agree bit for bit (each output pixel's integer sum is the same whatever the
tile), which the tests hold.
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


def _op(op: str, q: dict, xs: list[np.ndarray], values: dict) -> np.ndarray:
    """One int8 op (the program's names) on its operands: the float input for q8_quantize, int8 otherwise."""
    if op == "q8_quantize":
        return _quantize(xs[0].astype(np.float32), q)
    if op == "q8_add":  # float32 sum of the dequantised operands, quantised to the add's scale
        return _quantize(_dequantize(xs[0], *q["a"]) + _dequantize(xs[1], *q["b"]), q)
    if op == "q8_conv2d":
        return _conv(xs[0], q, values)
    if op == "q8_relu":
        return ref.relu_forward(xs[0], q["zp"])
    if op == "q8_relu6":
        return ref.relu6_forward(xs[0], q["zp"], q["q6"])
    raise ValueError(f"an int8 prefix has no op {op!r}")


def step(op: str, q: dict, xs: list[np.ndarray], values: dict) -> np.ndarray:
    """One step of a program on its operands (the float input for q8_quantize, int8 otherwise): an int8 op, or
    q8_dequantize's float32 boundary. The Python runtime's int8 ops (q8_ops.py) run each node through it."""
    if op == "q8_dequantize":
        return _dequantize(xs[0], q["scale"], q["zp"])
    return _op(op, q, xs, values)


def _operand(patches: dict, g: dict, pad_value: int) -> np.ndarray:
    """An op's operand patch: its crop of the tensor's patch, padded with `pad_value` (a zero point: a real 0)."""
    y, h, x, w = g["crop"]
    t = patches[g["from"]][:, :, y:y + h, x:x + w]
    top, bottom, left, right = g["pad"]
    if not any(g["pad"]):
        return t
    return np.pad(t, ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=pad_value)


def run_tiled(plan: dict, values: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """An int8 prefix computed tile by tile as `plan` says (its output tensor, int8): what the firmware computes."""
    n, c, h, w = plan["tensors"][-1]
    out = np.zeros((n, c, h, w), np.int8)
    last = len(plan["tensors"]) - 1
    for tile in plan["tiles"]:
        patches = {0: x}
        for i, (op, gathers) in enumerate(zip(plan["ops"], tile["steps"])):
            q = dict(op["q8"], padding=[0, 0]) if op["op"] == "q8_conv2d" else op["q8"]  # the patch holds the padding
            pad = op["q8"]["x_zp"] if op["op"] == "q8_conv2d" else 0
            patches[i + 1] = _op(op["op"], q, [_operand(patches, g, pad) for g in gathers], values)
        y0, y1, x0, x1 = tile["regions"][last]
        out[:, :, y0:y1, x0:x1] = patches[last]
    return out


def untiled(program: str) -> str:
    """`program` with each tiled prefix expanded back into its nodes, one op each, on whole tensors."""
    steps = []
    for step in json.loads(program):
        if step["op"] != "q8_patches":
            steps.append(step)
            continue
        plan = step["plan"]
        names = step["inputs"][:1] + plan["replaces"]  # tensor j of the plan: its source, then the nodes replaced
        for i, op in enumerate(plan["ops"]):
            steps.append({"name": names[i + 1], "op": op["op"], "q8": op["q8"],
                          "inputs": [names[a] for a in op["operands"]]})
    return json.dumps(steps)


def run_prefix(program: str, values: dict[str, np.ndarray], x: np.ndarray) -> dict[str, np.ndarray]:
    """The boundary tensors (float32, by the dequantize steps' names) of the int8 prefix on the float input `x`."""
    held: dict[str, np.ndarray] = {}
    out: dict[str, np.ndarray] = {}
    for step in json.loads(program):
        op = step["op"]
        reads_input = op == "q8_quantize" or (op == "q8_patches" and step["plan"]["ops"][0]["op"] == "q8_quantize")
        xs = [x] if reads_input else [held[r] for r in step["inputs"]]
        if op == "q8_dequantize":
            out[step["name"]] = _dequantize(xs[0], step["q8"]["scale"], step["q8"]["zp"])
        elif op == "q8_patches":
            held[step["name"]] = run_tiled(step["plan"], values, xs[0])
        else:
            held[step["name"]] = _op(op, step["q8"], xs, values)
    return out
