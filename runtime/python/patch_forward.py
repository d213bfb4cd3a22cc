"""`edgetrain.patch_forward`: a frozen forward prefix computed tile by tile, as the compiler planned it.

The plan (JSON, compiler/graph/tiling.py writes it) lists the prefix's ops (convolution, ReLU/ReLU6, add) and,
per output tile, every tensor's region and each operand's crop and zero padding. Each op runs on its
operands' patches with torch's own kernels (a convolution with its padding made explicit), so the prefix's
full-resolution intermediates never exist; the output is written tile by tile. Registered as a torch op so
that a plan calls it like any aten op.
"""
from __future__ import annotations

import json
from functools import lru_cache

import torch
import torch.nn.functional as F

_LIB = torch.library.Library("edgetrain", "DEF")
_LIB.define("patch_forward(Tensor x, Tensor?[] params, str plan) -> Tensor")

aten = torch.ops.aten


@lru_cache(maxsize=64)
def _plan(text: str) -> dict:
    return json.loads(text)


def _operand(patches: dict, g: dict) -> torch.Tensor:
    y, h, x, w = g["crop"]
    t = patches[g["from"]][:, :, y:y + h, x:x + w]
    top, bottom, left, right = g["pad"]
    return F.pad(t, (left, right, top, bottom)) if any(g["pad"]) else t


def _run(op: dict, args: list, params: list) -> torch.Tensor:
    if op["op"] == "conv":
        bias = None if op["bias"] is None else params[op["bias"]]
        return aten.convolution.default(args[0], params[op["weight"]], bias, op["stride"], [0, 0], op["dilation"],
                                        False, [0, 0], op["groups"])
    if op["op"] == "hardtanh":
        return aten.hardtanh.default(args[0], *op["literals"])
    if op["op"] == "relu":
        return aten.relu.default(args[0])
    return aten.add.Tensor(args[0], args[1])


def patch_forward(x: torch.Tensor, params: list, plan: str) -> torch.Tensor:
    p = _plan(plan)
    if p.get("dtype") == "int8":  # an int8 prefix's patches: the integer reference's arithmetic (q8_ops.py)
        from .q8_ops import tiled

        return tiled(x, params, p)
    n, c, h, w = p["tensors"][-1]
    out = x.new_empty((n, c, h, w))
    last = len(p["tensors"]) - 1
    dies = _last_reads(p)
    for tile in p["tiles"]:
        patches = {0: x}
        for i, (op, gathers) in enumerate(zip(p["ops"], tile["steps"])):
            patches[i + 1] = _run(op, [_operand(patches, g) for g in gathers], params)
            for a in dies[i]:  # a patch is freed after its last reader, as the plan's buffers are packed
                del patches[a]
        y0, y1, x0, x1 = tile["regions"][last]
        out[:, :, y0:y1, x0:x1] = patches[last]
    return out


def _last_reads(p: dict) -> list[list[int]]:
    """Per op, the patches (tensor indices, not the input) it reads last."""
    last = {}
    for i, op in enumerate(p["ops"]):
        for a in op["operands"]:
            if a:
                last[a] = i
    return [[a for a, i in last.items() if i == k] for k in range(len(p["ops"]))]


_LIB.impl("patch_forward", patch_forward, "CompositeExplicitAutograd")
_LIB.impl("patch_forward", lambda x, params, plan: x.new_empty(
    _plan(plan)["tensors"][-1], dtype=torch.int8 if _plan(plan).get("dtype") == "int8" else x.dtype), "Meta")
