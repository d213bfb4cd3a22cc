"""`edgetrain.q8_*`: an int8 frozen prefix's nodes as torch ops, for Python plans (`--quantize-frozen int8`).

Each op is one node of compiler/graph/quantize.py's rewrite - q8_quantize, q8_conv2d, q8_relu, q8_relu6, q8_add,
q8_dequantize - and takes the node's quantisation (its attrs["q8"], as JSON) as the keyword `q8`. The arithmetic is
the integer reference's (int8_prefix.step, on int8_reference's kernels): the bits the C firmware computes, so a
Python plan and a firmware of the same schedule hand their float heads the same boundary. Activations between the
ops are torch int8 tensors (one byte an element, as the schedule counts them); int8 weights and int32 biases are
the plan's parameters. A prefix computed patch by patch runs through `patch_forward` (its int8 plan: `tiled`).

numpy computes on the CPU: these ops take and return CPU tensors, and the runtime refuses them on another device.
"""
from __future__ import annotations

import ctypes
import json
from functools import lru_cache

import numpy as np
import torch

from . import int8_prefix

_LIB = torch.library.Library("edgetrain", "FRAGMENT")  # patch_forward.py defines the namespace
_SCHEMAS = {
    "q8_quantize": "q8_quantize(Tensor x, *, str q8) -> Tensor",
    "q8_conv2d": "q8_conv2d(Tensor x, Tensor weight, Tensor? bias, *, str q8) -> Tensor",
    "q8_relu": "q8_relu(Tensor x, *, str q8) -> Tensor",
    "q8_relu6": "q8_relu6(Tensor x, *, str q8) -> Tensor",
    "q8_add": "q8_add(Tensor a, Tensor b, *, str q8) -> Tensor",
    "q8_dequantize": "q8_dequantize(Tensor x, *, str q8) -> Tensor",
}


@lru_cache(maxsize=256)
def _q8(text: str) -> dict:
    return json.loads(text)


_NUMPY = {torch.int8: np.int8, torch.int32: np.int32, torch.float32: np.float32}


def _array(t: torch.Tensor) -> np.ndarray:
    """The tensor's bytes as a numpy array for the op's duration, read through their address: `Tensor.numpy()`
    would pin the storage's size, which a streamed weight's must give back after the op (streamed_weights.py)."""
    if t.device.type != "cpu":
        raise RuntimeError(f"an int8 prefix runs on the CPU (numpy), got a tensor on {t.device}")
    if not t.is_contiguous() or not t.numel():  # a copy of its own, which the array keeps alive
        return t.contiguous().numpy()
    buf = (ctypes.c_char * t.nbytes).from_address(t.data_ptr())
    return np.frombuffer(buf, dtype=_NUMPY[t.dtype]).reshape(tuple(t.shape))


def _result(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


def _unary(op: str):
    def run(x: torch.Tensor, *, q8: str) -> torch.Tensor:
        return _result(int8_prefix.step(op, _q8(q8), [_array(x)], {}))
    return run


def q8_conv2d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, *, q8: str) -> torch.Tensor:
    q = _q8(q8)
    values = {q["weight"]: _array(weight)}
    if bias is not None:
        values[q["bias"]] = _array(bias)
    return _result(int8_prefix.step("q8_conv2d", q, [_array(x)], values))


def q8_add(a: torch.Tensor, b: torch.Tensor, *, q8: str) -> torch.Tensor:
    return _result(int8_prefix.step("q8_add", _q8(q8), [_array(a), _array(b)], {}))


def tiled(x: torch.Tensor, params: list, plan: dict) -> torch.Tensor:
    """An int8 prefix computed patch by patch (tiling.py's int8 plan: `patch_forward` hands it here): the
    reference's tile-by-tile run, each convolution's integer weight and bias by the name its quantisation gives."""
    values = {}
    for op in plan["ops"]:
        if op["op"] == "q8_conv2d":
            values[op["q8"]["weight"]] = _array(params[op["weight"]])
            if op["bias"] is not None:
                values[op["q8"]["bias"]] = _array(params[op["bias"]])
    return _result(int8_prefix.run_tiled(plan, values, _array(x)))


_IMPLS = {"q8_conv2d": q8_conv2d, "q8_add": q8_add,
          **{op: _unary(op) for op in ("q8_quantize", "q8_relu", "q8_relu6", "q8_dequantize")}}
for _name, _schema in _SCHEMAS.items():
    _LIB.define(_schema)
    _LIB.impl(_name, _IMPLS[_name], "CPU")


def runs_int8(op: str, attrs: dict) -> bool:
    """Whether a plan node runs one of these ops: an int8 node, or a prefix computed patch by patch in int8."""
    if op.startswith("edgetrain.q8_"):
        return True
    args = attrs.get("args") or ()  # patch_forward's plan: tiling.py writes an int8 plan's "dtype" first
    return op == "edgetrain.patch_forward.default" and len(args) == 3 and isinstance(args[2], str) \
        and args[2].startswith('{"dtype":"int8"')
