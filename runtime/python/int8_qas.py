"""Training the biases of an int8 region in integers (tiny-training's sparse bias update with Quantization-Aware
Scaling): the forward, the backward and the update of one step, the bits firmware must match.

The region is an int8 program (compiler/graph/quantize.py's JSON: the frozen prefix, then convolutions whose bias
alone trains, ReLU/ReLU6 and residual adds) whose trained biases are int32 state at `s_x * s_w[oc]`. A step:

- forward: the program on the float input (int8_prefix's ops), each int8 tensor held for the backward; the float
  head reads the dequantised boundary;
- the head's float gradient at each boundary tensor quantised to int8, symmetric, one scale per tensor
  (`quantize_gradient`: max|g| / 127 in float32; an all-zero gradient has scale 0);
- backward in integers: ReLU/ReLU6 pass the gradient where the saved output is inside the clamp, a residual add
  passes it to both operands, a convolution's bias gradient is the exact int32 channel sum of its output gradient;
  where a trained bias lies further up, the input gradient: the output gradient first requantised per channel
  onto one common scale (`grad_rescale`: channel oc times s_w[oc] / max s_w, so every channel's product with its
  weights has the scale s_gy * max s_w), then the exact int32 input-gradient sums, quantised to int8 by their own
  largest magnitude (`quantize_sums`, integer rounding);
- the update, QAS: the bias gradient in real units (s_gy * sum, float32), SGD's momentum and weight decay in real
  units, and the int32 bias moved by round(lr * m / (s_x * s_w[oc])): the real-valued SGD step on the int32 grid
  (`bias_step`).

Every float operation is float32 in a fixed order (as the C kernels compute it with -ffp-contract=off); every
rounding is named. Supported optimizers: SGD with momentum (dampening 0, not Nesterov) and weight decay.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from . import int8_reference as ref
from .int8_prefix import run_tiled, step as run_step

F32 = np.float32
SUPPORTED_OPTIMIZERS = "SGD (with or without momentum and weight decay; not Nesterov)"


@dataclass(frozen=True)
class Sgd:
    """The update's settings, float32 as the firmware holds them."""
    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0


def sgd_of(optimizer: dict) -> Sgd:
    """The settings of a schedule's optimizer (OptimizerConfig.to_json()), or ValueError naming what QAS lacks."""
    if optimizer.get("name") != "sgd" or optimizer.get("nesterov"):
        what = "SGD with Nesterov momentum" if optimizer.get("name") == "sgd" else optimizer.get("name")
        raise ValueError(f"int8 bias training updates with {SUPPORTED_OPTIMIZERS}; {what} has no integer update here")
    return Sgd(float(optimizer["lr"]), float(optimizer.get("momentum", 0.0)), float(optimizer.get("weight_decay", 0.0)))


@dataclass
class QasState:
    """The trained state: int32 biases (by parameter name) and their momentum buffers (float32, real units)."""
    biases: dict[str, np.ndarray]
    momentum: dict[str, np.ndarray] = field(default_factory=dict)


def trained_convs(program: list[dict], trained) -> list[dict]:
    """The program's convolutions whose bias trains, in order."""
    return [s for s in program if s["op"] == "q8_conv2d" and s["q8"]["bias"] in set(trained)]


def initial_state(program: list[dict], values: dict[str, np.ndarray], trained) -> QasState:
    """The biases' starting integers (conv_integers' rounding, in `values`) and zero momentum."""
    convs = trained_convs(program, trained)
    return QasState({s["q8"]["bias"]: values[s["q8"]["bias"]].astype(np.int32).copy() for s in convs},
                    {s["q8"]["bias"]: np.zeros(len(s["q8"]["w_scales"]), F32) for s in convs})


def bias_scales(q8: dict) -> np.ndarray:
    """s_x * s_w[oc] of a convolution's int32 bias, float32 (its product in float64, then rounded once)."""
    return (float(q8["x_scale"]) * np.asarray(q8["w_scales"], np.float64)).astype(F32)


def grad_rescale(w_scales) -> tuple[np.ndarray, np.ndarray, float]:
    """(mult, shift, ratio): the per-channel requantisation of an output gradient by s_w[oc] / max s_w (each <= 1),
    after which every channel's products with its weights share the scale s_gy * ratio, ratio = max s_w."""
    s = np.asarray(w_scales, np.float64)
    top = float(s.max())
    ms = [ref.quantize_multiplier(float(v / top)) for v in s]
    return np.array([m for m, _ in ms], np.int64), np.array([e for _, e in ms], np.int64), top


def quantize_gradient(g: np.ndarray) -> tuple[np.ndarray, np.float32]:
    """(int8, scale) of a float32 gradient: s = max|g| / 127 (float32), q = round(g / s) with halves to even,
    saturated to +-127; an all-zero gradient, or one with a NaN or an infinity, gives zeros and scale 0."""
    g = np.asarray(g, F32)
    amax = F32(np.abs(g).max(initial=F32(0)))
    if not (amax > 0 and np.isfinite(amax)):  # an all-zero or non-finite gradient moves nothing
        return np.zeros(g.shape, np.int8), F32(0)
    s = F32(amax / F32(127))
    return np.clip(np.rint(g / s), -127, 127).astype(np.int8), s


def quantize_sums(acc: np.ndarray, scale) -> tuple[np.ndarray, np.float32]:
    """(int8, scale) of exact integer sums whose unit is `scale`: q = round(acc * 127 / M), M = max|acc|, halves
    away from zero, in integers; the scale is scale * M / 127 (float32, in that order). M = 0: zeros, scale 0."""
    acc = np.asarray(acc, np.int64)
    m = int(np.abs(acc).max(initial=0))
    if m == 0:
        return np.zeros(acc.shape, np.int8), F32(0)
    q = (2 * 127 * np.abs(acc) + m) // (2 * m)
    return np.where(acc < 0, -q, q).astype(np.int8), F32(F32(scale) * F32(m) / F32(127))


def round_to_int32(v: np.ndarray) -> np.ndarray:
    """float32 values rounded to integers with halves to even, saturated to int32 (the C kernel's rounding)."""
    v = np.asarray(v, F32)
    return np.clip(np.rint(v).astype(np.float64), ref.INT32_MIN, ref.INT32_MAX).astype(np.int64)


def bias_step(opt: Sgd, gb: np.ndarray, s_g, b: np.ndarray, m: np.ndarray, s_b: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
    """One QAS SGD step of an int32 bias (float32, in this order): g = s_g * gb (+ wd * s_b * b); m = momentum *
    m + g (torch's buffer, which starts at the first gradient: 0 * momentum + g is g); b -= round(lr * m / s_b),
    saturated. Returns (b, m)."""
    g = F32(s_g) * gb.astype(F32)
    if opt.weight_decay:
        g = g + F32(opt.weight_decay) * (s_b * b.astype(F32))
    if opt.momentum:
        m = F32(opt.momentum) * m + g
        d = m
    else:
        d = g
    step = round_to_int32((F32(opt.lr) * d) / s_b)
    b = np.clip(b.astype(np.int64) - step, ref.INT32_MIN, ref.INT32_MAX).astype(np.int32)
    return b, m.astype(F32)


@dataclass
class Forward:
    """What the forward leaves for the backward: every int8 tensor by name, and the boundary (float32, by the
    dequantize steps' names) the head reads."""
    held: dict[str, np.ndarray]
    boundary: dict[str, np.ndarray]


def forward(program: list[dict], values: dict[str, np.ndarray], state: QasState, x: np.ndarray) -> Forward:
    """The int8 region on the float input `x`, its trained biases taken from `state`."""
    vals = {**values, **state.biases}
    held: dict[str, np.ndarray] = {}
    out: dict[str, np.ndarray] = {}
    for step in program:
        op = step["op"]
        reads_input = op == "q8_quantize" or (op == "q8_patches" and step["plan"]["ops"][0]["op"] == "q8_quantize")
        xs = [x] if reads_input else [held[r] for r in step["inputs"]]
        if op == "q8_dequantize":
            out[step["name"]] = run_step(op, step["q8"], xs, vals)
        elif op == "q8_patches":
            held[step["name"]] = run_tiled(step["plan"], vals, xs[0])
        else:
            held[step["name"]] = run_step(op, step["q8"], xs, vals)
    return Forward(held, out)


def needs_grad(program: list[dict], trained) -> set[str]:
    """The int8 tensors a gradient must reach: the outputs of trained convolutions and of every step reading one."""
    trained, need = set(trained), set()
    for s in program:
        if s["op"] == "q8_dequantize":  # the float head's operand: its gradient is the head's
            continue
        if (s["op"] == "q8_conv2d" and s["q8"]["bias"] in trained) or any(r in need for r in s.get("inputs", [])):
            need.add(s["name"])
    return need


def backward(program: list[dict], values: dict[str, np.ndarray], fwd: Forward, grads: dict[str, np.ndarray],
             trained) -> dict[str, tuple[np.ndarray, np.float32]]:
    """Each trained bias's gradient as (exact int32 channel sums, their scale): the region's backward in integers
    from the head's float gradients at the boundary (`grads`, by dequantize step)."""
    need, trained = needs_grad(program, trained), set(trained)
    flow: dict[str, tuple[np.ndarray, np.float32]] = {}

    def give(name: str, g: np.ndarray, s) -> None:
        if name not in need:
            return
        if name in flow:  # one producer of each tensor's gradient (the region analysis refuses a second)
            raise ValueError(f"int8 bias training: tensor `{name}` gets its gradient from two readers")
        flow[name] = (g, F32(s))

    for step in program:
        if step["op"] == "q8_dequantize" and step["name"] in grads:
            give(step["inputs"][0], *quantize_gradient(grads[step["name"]]))
    out: dict[str, tuple[np.ndarray, np.float32]] = {}
    for step in reversed(program):
        if step["name"] not in flow:
            continue
        gy, s = flow.pop(step["name"])
        op, q, ins = step["op"], step.get("q8", {}), step.get("inputs", [])
        if op == "q8_relu":
            give(ins[0], ref.relu_backward(gy, fwd.held[step["name"]], q["zp"]), s)
        elif op == "q8_relu6":
            give(ins[0], ref.relu6_backward(gy, fwd.held[step["name"]], q["zp"], q["q6"]), s)
        elif op == "q8_add":
            for r in ins:
                give(r, gy, s)
        elif op == "q8_conv2d":
            if q["bias"] in trained:
                out[q["bias"]] = (ref._checked(gy.astype(np.int64).sum(axis=(0, 2, 3))).astype(np.int32), s)
            if ins[0] in need:
                mult, shift, ratio = grad_rescale(q["w_scales"])
                g2 = ref.output(gy.astype(np.int64), ref.Requant(mult, shift, 0, -127, 127), 1)
                sums = ref.conv2d_backward_input_sums(g2, values[q["weight"]], fwd.held[ins[0]].shape[2:],
                                                      tuple(q["stride"]), tuple(q["padding"]), tuple(q["dilation"]),
                                                      q["groups"])
                give(ins[0], *quantize_sums(sums, F32(s) * F32(ratio)))
        else:
            raise ValueError(f"int8 bias training has no backward for {op!r} (`{step['name']}`)")
    return out


def update(program: list[dict], opt: Sgd, state: QasState, bias_grads: dict[str, tuple[np.ndarray, np.float32]]
           ) -> None:
    """Each trained bias moved by its QAS step (`bias_step`), in place in `state`."""
    for step in trained_convs(program, bias_grads):
        name = step["q8"]["bias"]
        gb, s_g = bias_grads[name]
        state.biases[name], state.momentum[name] = bias_step(opt, gb, s_g, state.biases[name],
                                                             state.momentum[name], bias_scales(step["q8"]))


def train_step(program: str | list[dict], values: dict[str, np.ndarray], state: QasState, opt: Sgd, trained,
               x: np.ndarray, head) -> float:
    """One training step of the region's biases; `head(boundary) -> (loss, grads)` runs (and updates) the float
    head on the dequantised boundary and gives its float32 gradient there, by dequantize step. The loss."""
    steps = json.loads(program) if isinstance(program, str) else program
    fwd = forward(steps, values, state, np.asarray(x, F32))
    loss, grads = head(fwd.boundary)
    update(steps, opt, state, backward(steps, values, fwd, {k: np.asarray(v, F32) for k, v in grads.items()}, trained))
    return float(loss)


def real_biases(program: str | list[dict], state: QasState) -> dict[str, np.ndarray]:
    """The trained biases in real units (float64: s_x * s_w[oc] * b), for comparing with float training."""
    steps = json.loads(program) if isinstance(program, str) else program
    return {s["q8"]["bias"]: bias_scales(s["q8"]).astype(np.float64) * state.biases[s["q8"]["bias"]]
            for s in trained_convs(steps, state.biases)}
