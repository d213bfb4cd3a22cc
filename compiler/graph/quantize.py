"""A frozen forward prefix in int8: the first milestone of quantized training (a float head on an int8 backbone).

The prefix is the graph's leading chain of convolutions and ReLU/ReLU6 over frozen weights whose intermediates no
other node reads (no gradient flows through a frozen prefix, so nothing of it is saved). This pass replaces its
nodes by int8 nodes of the same names whose byte sizes are real (1 byte an activation element; int8 weights, int32
biases in `params`), adds a node quantising the float input and one dequantising the boundary, which the float head
reads. Scheduling, the MILP and the arena then count int8 sizes without knowing about quantisation.

The arithmetic is CMSIS-NN's (docs/int8-kernels.md): weights symmetric per output channel, activations one scale and
a zero point each, calibrated from the float prefix's ranges over a few batches (`calibrate`); biases int32 at
`s_x * s_w[oc]`; each conv output requantised with a Q31 multiplier and a shift per channel. A node's attrs["q8"]
holds all of it; runtime/python/int8_prefix.py runs the same integer arithmetic with int8_reference.
Pure functions: nothing here solves, reads files or touches the graph it is given.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace

import numpy as np
import torch

from edgetrain.runtime.python.int8_reference import quantize_multiplier

from ..errors import UnsupportedModelError
from .ir import Node, TensorRef, TensorSpec, TrainingGraph

CONV = "aten.convolution.default"
HARDTANH, RELU, ADD = "aten.hardtanh.default", "aten.relu.default", "aten.add.Tensor"
Q8_QUANTIZE = "edgetrain.q8_quantize.default"
Q8_CONV = "edgetrain.q8_conv2d.default"
Q8_RELU = "edgetrain.q8_relu.default"
Q8_RELU6 = "edgetrain.q8_relu6.default"
Q8_ADD = "edgetrain.q8_add.default"
Q8_DEQUANTIZE = "edgetrain.q8_dequantize.default"


@dataclass(frozen=True)
class Quantized:
    """The rewrite: the nodes made int8 (by name), the new graph and the integer parameter values it reads."""

    nodes: tuple[str, ...]
    graph: TrainingGraph
    values: dict[str, np.ndarray]  # int8 weights, int32 biases, by parameter name


def _t(a) -> bool:
    return isinstance(a, dict) and set(a) == {"$t"}


def _supported(n: Node, frozen: set[str]) -> bool:
    if n.op == ADD:  # a residual add: two tensors, no alpha
        return n.kind == "forward" and n.dtype == "float32" and len(n.inputs) == 2 \
            and not any(r.view for r in n.inputs) and n.attrs.get("args") == [{"$t": 0}, {"$t": 1}] \
            and n.shape is not None
    if n.kind != "forward" or n.dtype != "float32" or n.shape is None or len(n.inputs) != 1 \
            or any(r.view for r in n.inputs) or n.streamed or not set(n.params) <= frozen or "args" not in n.attrs:
        return False
    a = n.attrs["args"]
    if n.op == CONV:  # 2-d, not transposed, no output padding; a whole weight (a block's rows stay float32 with the
        # other blocks that read the same parameter: graph/.. frontend/channel_blocks.py)
        return len(a) == 9 and _t(a[0]) and isinstance(a[1], dict) and set(a[1]) == {"$p"} and not a[6] \
            and list(a[7]) == [0, 0] and len(a[3]) == 2
    if n.op == HARDTANH:
        return _t(a[0]) and list(a[1:]) == [0.0, 6.0]
    return n.op == RELU and len(a) == 1


def _readers(g: TrainingGraph) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for n in g.nodes:
        for r in n.inputs:
            out.setdefault(r.name, []).append(n.name)
    return out


def frozen_prefix(g: TrainingGraph) -> tuple[str, ...]:
    """The nodes from the input up to the first that cannot run in int8 (convolutions, ReLU/ReLU6 and residual adds
    over frozen weights), each reading the input or them. The float nodes read its boundary tensors, dequantised."""
    if g.input_dtype != "float32":
        return ()
    frozen = set(g.params) - set(g.trainable_params)
    region = {next(n.name for n in g.nodes if n.kind == "input")}
    chain: list[str] = []
    for n in g.nodes:
        if n.kind in ("input", "labels"):
            continue
        if not _supported(n, frozen) or any(r.name not in region for r in n.inputs) \
                or (n.op == ADD and any(g.node(r.name).shape != n.shape for r in n.inputs)):  # no broadcasting
            break
        chain.append(n.name)
        region.add(n.name)
    return tuple(chain)


def prefix_or_error(g: TrainingGraph, flag: str = "--quantize-frozen int8") -> tuple[str, ...]:
    """`frozen_prefix(g)`, or one error saying why there is none and what to do (nothing frozen, or an op int8 has
    no kernel for where the prefix would begin)."""
    frozen = set(g.params) - set(g.trainable_params)
    if not frozen:
        raise UnsupportedModelError(f"{flag}: every parameter of the model trains, so there is no frozen backbone to "
                                    "quantise; freeze it with --train (e.g. --train last:2), or drop the flag")
    prefix = frozen_prefix(g)
    if prefix:
        return prefix
    first = next(n for n in g.nodes if n.kind not in ("input", "labels"))
    why = "reads trained parameters" if set(first.params) - frozen else "has no int8 kernel"
    raise UnsupportedModelError(
        f"{flag}: the model's first op, node `{first.name}` ({first.op}{', ' + first.source if first.source else ''}), "
        f"{why}; an int8 prefix is the frozen convolutions, ReLU/ReLU6 and residual adds from the input on. Freeze "
        "the first layers (--train) or drop the flag")


def boundary(g: TrainingGraph, prefix: tuple[str, ...]) -> tuple[str, ...]:
    """The prefix's tensors that a node outside it reads."""
    inside, readers = set(prefix), _readers(g)
    return tuple(p for p in prefix if any(r not in inside for r in readers.get(p, [])))


def _run_float(n: Node, xs: list[torch.Tensor], weights: dict[str, torch.Tensor]) -> torch.Tensor:
    a, x = n.attrs["args"], xs[0]
    if n.op == ADD:
        return xs[0] + xs[1]
    if n.op == CONV:
        return torch.ops.aten.convolution(x, weights[a[1]["$p"]], weights[a[2]["$p"]] if a[2] else None, *a[3:])
    if n.op == HARDTANH:
        return torch.clamp(x, 0.0, 6.0)
    return torch.relu(x)


def calibrate(g: TrainingGraph, prefix: tuple[str, ...], weights: dict[str, torch.Tensor],
              batches: list[torch.Tensor]) -> dict[str, tuple[float, float]]:
    """Each prefix tensor's (min, max) over `batches` in float, the input's under the input node's name."""
    src = next(n.name for n in g.nodes if n.kind == "input")
    lo: dict[str, float] = {}
    hi: dict[str, float] = {}
    with torch.no_grad():
        for x in batches:
            seen = {src: x}
            for name in prefix:
                n = g.node(name)
                seen[name] = _run_float(n, [seen[r.name] for r in n.inputs], weights)
            for name, t in seen.items():
                lo[name] = min(lo.get(name, 0.0), float(t.min()))  # 0 in range: zero padding is exact
                hi[name] = max(hi.get(name, 0.0), float(t.max()))
    return {k: (lo[k], hi[k]) for k in lo}


def activation_quant(lo: float, hi: float) -> tuple[float, int]:
    """(scale, zero point) mapping [lo, hi] (which holds 0) onto -128..127."""
    scale = max(hi - lo, 1e-8) / 255.0
    zp = int(np.clip(round(-128 - lo / scale), -128, 127))
    return scale, zp


def weight_quant(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int8 weights, per-output-channel scales): symmetric, each channel's largest magnitude at 127."""
    amax = np.abs(w.reshape(w.shape[0], -1)).max(axis=1).astype(np.float64)
    scales = np.where(amax > 0, amax / 127.0, 1.0)
    q = np.clip(np.round(w / scales.reshape((-1,) + (1,) * (w.ndim - 1))), -127, 127).astype(np.int8)
    return q, scales


def conv_integers(q8: dict, weights) -> dict[str, np.ndarray]:
    """An int8 convolution's integer parameters from its float ones and the scales its attrs["q8"] holds: int8
    weights (round(w / s_w[oc])) and int32 biases (round(b / (s_x * s_w[oc]))). The one definition of both: the
    pass calls it, and so does every backend that writes them out."""
    s_w = np.asarray(q8["w_scales"], np.float64)
    w = np.asarray(weights[q8["weight"]].detach().double().numpy() if isinstance(weights[q8["weight"]], torch.Tensor)
                   else weights[q8["weight"]], np.float64)
    out = {q8["weight"]: np.clip(np.round(w / s_w.reshape((-1,) + (1,) * (w.ndim - 1))), -127, 127).astype(np.int8)}
    if q8["bias"]:
        b = weights[q8["bias"]]
        b = np.asarray(b.detach().double().numpy() if isinstance(b, torch.Tensor) else b, np.float64)
        bias = np.round(b / (q8["x_scale"] * s_w)).astype(np.int64)
        if np.abs(bias).max(initial=0) >= 1 << 31:
            raise ValueError(f"{q8['bias']} does not fit int32 at its input's and weights' scales")
        out[q8["bias"]] = bias.astype(np.int32)
    return out


def quantize_frozen(g: TrainingGraph, prefix: tuple[str, ...], ranges: dict[str, tuple[float, float]],
                    weights: dict[str, torch.Tensor]) -> Quantized:
    """`g` with `prefix` in int8 (module docstring); `ranges` from `calibrate`."""
    if not prefix:
        raise ValueError("no frozen prefix to quantise")
    src = next(n for n in g.nodes if n.kind == "input")
    qin = f"{src.name}_q8"
    in_scale, in_zp = activation_quant(*ranges[src.name])
    quant: dict[str, tuple[float, int]] = {qin: (in_scale, in_zp)}
    params, values = dict(g.params), {}
    new: dict[str, Node] = {qin: Node(qin, "forward", Q8_QUANTIZE, (TensorRef(src.name),), shape=src.shape,
                                      dtype="int8", attrs={"q8": {"scale": in_scale, "zp": in_zp}},
                                      flops=int(np.prod(src.shape)))}
    for name in prefix:
        n = g.node(name)
        ins = tuple(qin if r.name == src.name else r.name for r in n.inputs)
        prev = ins[0]
        s_x, zp_x = quant[prev]
        if n.op == ADD:  # each operand dequantised in float32, summed, quantised to the add's own scale
            s_y, zp_y = activation_quant(*ranges[name])
            q8 = {"a": list(quant[ins[0]]), "b": list(quant[ins[1]]), "scale": s_y, "zp": zp_y}
            quant[name] = (s_y, zp_y)
            new[name] = replace(n, op=Q8_ADD, inputs=tuple(TensorRef(i) for i in ins), dtype="int8",
                                attrs={"q8": q8})
            continue
        if n.op == CONV:
            a = n.attrs["args"]
            wname, bname = a[1]["$p"], a[2]["$p"] if a[2] else None
            _, s_w = weight_quant(weights[wname].detach().double().numpy())
            s_y, zp_y = activation_quant(*ranges[name])
            ms = [quantize_multiplier(float(s_x * sw / s_y)) for sw in s_w]
            q8 = {"x_zp": zp_x, "x_scale": s_x, "scale": s_y, "zp": zp_y, "w_scales": [float(v) for v in s_w],
                  "mult": [m for m, _ in ms], "shift": [s for _, s in ms],
                  "stride": list(a[3]), "padding": list(a[4]), "dilation": list(a[5]), "groups": a[8],
                  "weight": wname, "bias": bname}
            for p, v in conv_integers(q8, weights).items():
                values[p] = v
                params[p] = TensorSpec(params[p].shape, str(v.dtype))
            quant[name] = (s_y, zp_y)
            op = Q8_CONV
        else:  # ReLU/ReLU6 keep their input's quantisation: a clamp at the zero point (and at 6)
            q8 = {"scale": s_x, "zp": zp_x}
            if n.op == HARDTANH:
                q8["q6"] = int(min(127, zp_x + round(6.0 / s_x)))
            quant[name] = (s_x, zp_x)
            op = Q8_RELU6 if n.op == HARDTANH else Q8_RELU
        # args: the operand a backend's in-place table (graph/inplace.py) may write a ReLU's output over
        args = {} if op == Q8_CONV else {"args": [{"$t": 0}]}
        new[name] = replace(n, op=op, inputs=(TensorRef(prev),), dtype="int8", attrs={"q8": q8, **args})
    deq = {b: Node(f"{b}_dq", "forward", Q8_DEQUANTIZE, (TensorRef(b),), shape=g.node(b).shape, dtype="float32",
                   attrs={"q8": {"scale": quant[b][0], "zp": quant[b][1]}}, flops=int(np.prod(g.node(b).shape)))
           for b in boundary(g, prefix)}
    nodes: list[Node] = []
    for n in g.nodes:
        if n.name in new:
            if n.name == prefix[0]:
                nodes.append(new[qin])
            nodes.append(new[n.name])
            continue
        for b, d in deq.items():  # dequantised just before its first float reader: the float copy lives least
            if any(r.name == b for r in n.inputs):
                if d not in nodes:
                    nodes.append(d)
                n = replace(n, inputs=tuple(TensorRef(d.name, r.view) if r.name == b else r for r in n.inputs))
        nodes.append(n)
    graph = replace(g, nodes=nodes, params=params)
    return Quantized(prefix, graph, values)


def int8_tiled_plan(attrs: dict) -> dict | None:
    """The plan of an int8 prefix computed patch by patch (graph/tiling.py's node, from its attrs); None for any
    other node."""
    a = attrs.get("args")  # tiling.py writes the plan's "dtype" first: no other node's text starts so
    if not (isinstance(a, list) and len(a) == 3 and isinstance(a[2], str) and a[2].startswith('{"dtype":"int8"')):
        return None
    return json.loads(a[2])


def q8_layers(attrs: dict) -> list[dict]:
    """The quantisations (attrs["q8"]) a node computes with: its own, or each int8 op's of a tiled int8 prefix."""
    if "q8" in attrs:
        return [attrs["q8"]]
    plan = int8_tiled_plan(attrs)
    return [op["q8"] for op in plan["ops"]] if plan else []


def prefix_program(q: Quantized | TrainingGraph) -> str:
    """The int8 nodes (of a rewrite, or of a graph that holds them) as the runtime reference reads them (JSON: name,
    op, operand and attrs["q8"], in order; a tiled int8 prefix as op "q8_patches" with its plan under "plan")."""
    g = q.graph if isinstance(q, Quantized) else q
    steps = []
    for n in g.nodes:
        if n.op.startswith("edgetrain.q8_"):
            steps.append({"name": n.name, "op": n.op.split(".")[1], "inputs": [r.name for r in n.inputs],
                          "q8": n.attrs["q8"]})
        elif (plan := int8_tiled_plan(n.attrs)) is not None:
            steps.append({"name": n.name, "op": "q8_patches", "inputs": [r.name for r in n.inputs], "plan": plan})
    return json.dumps(steps)


# -- int8 bias training (QAS): the region extended over convolutions whose bias alone trains ---------------------

def _bias_only(n: Node, frozen: set[str], trained: set[str]) -> str | None:
    """The bias of a convolution whose weight is frozen and whose bias trains (int8 can run it, its bias int32 state
    updated by QAS); None for any other node."""
    if n.op != CONV or "args" not in n.attrs:
        return None
    a = n.attrs["args"]
    bias = a[2]["$p"] if len(a) == 9 and isinstance(a[2], dict) and "$p" in a[2] else None
    if bias is None or bias not in trained or not _supported(n, frozen | {bias}):
        return None
    return bias


def qas_region(g: TrainingGraph) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(prefix, tail): the frozen prefix (`frozen_prefix`), then the nodes after it int8 still runs where a
    convolution's bias alone may train: convolutions over frozen weights (their biases trained or not), ReLU/ReLU6
    and residual adds, each reading the region, up to the first other node; a tensor the gradient reaches that two
    nodes read ends it (one gradient a tensor: no integer sum at two scales). The tail starts at the first
    trained bias (the prefix stops there), so every tail node is on its gradient's path; empty where none follows."""
    prefix = frozen_prefix(g)
    if not prefix:
        return (), ()
    frozen, trained = set(g.params) - set(g.trainable_params), set(g.trainable_params)
    region = set(prefix) | {next(n.name for n in g.nodes if n.kind == "input")}
    fwd = [n for n in g.nodes if n.kind == "forward"]
    tail: list[str] = []
    need: set[str] = set()  # region tensors a gradient reaches (downstream of a trained bias)
    for n in fwd[fwd.index(g.node(prefix[-1])) + 1:]:
        bias = _bias_only(n, frozen, trained)
        if (bias is None and not _supported(n, frozen)) or any(r.name not in region for r in n.inputs) \
                or (n.op == ADD and any(g.node(r.name).shape != n.shape for r in n.inputs)):
            break
        tail.append(n.name)
        region.add(n.name)
        if bias is not None or any(r.name in need for r in n.inputs):
            need.add(n.name)
    readers: dict[str, int] = {}
    for n in fwd:
        for r in n.inputs:
            readers[r.name] = readers.get(r.name, 0) + 1
    for i, t in enumerate(tail):  # a tensor the gradient reaches, read twice: the region ends with it, so that
        if t in need and readers.get(t, 0) > 1:  # the float head alone reads it (and sums its gradients)
            return prefix, tuple(tail[:i + 1])
    return prefix, tuple(tail)


def qas_or_error(g: TrainingGraph, flag: str = "--int8-biases") -> tuple[tuple[str, ...], tuple[str, ...]]:
    """`qas_region(g)`, or one error saying why int8 bias training cannot run (an optimizer it has no integer update
    for, no int8 prefix, no convolution whose bias alone trains right after it, a trained parameter inside the
    region that is not such a bias); checked before any solve."""
    from edgetrain.runtime.python.int8_qas import sgd_of

    try:
        sgd_of(g.optimizer.to_json())
    except ValueError as e:
        raise UnsupportedModelError(f"{flag}: {e}. Use --optimizer sgd (momentum and weight decay are fine), or drop "
                                    "the flag") from None
    prefix = prefix_or_error(g, flag)
    prefix, tail = qas_region(g)
    trained = set(g.trainable_params)
    biases = [b for n in tail if (b := _bias_only(g.node(n), set(g.params) - trained, trained))]
    if not biases:
        after = next((n for n in g.nodes[g.index(prefix[-1]) + 1:] if n.kind == "forward"), None)
        said = f"node `{after.name}` ({after.op}{', ' + after.source if after.source else ''})" if after else "nothing"
        raise UnsupportedModelError(
            f"{flag}: no convolution whose bias alone trains follows the int8 prefix (it ends at `{prefix[-1]}`; "
            f"next is {said}); train the last blocks' biases, e.g. --train 'features.17.*bias,classifier.*', with "
            "their weights frozen, or drop the flag")
    return prefix, tail


def qas_biases(g: TrainingGraph, tail: tuple[str, ...]) -> tuple[str, ...]:
    """The trained biases of a region's tail, in graph order: the int32 state QAS updates."""
    trained = set(g.trainable_params)
    return tuple(b for n in tail if (b := _bias_only(g.node(n), set(g.params) - trained, trained)))


def quantize_region(g: TrainingGraph, region: tuple[str, ...], ranges: dict[str, tuple[float, float]],
                    weights: dict[str, torch.Tensor]) -> Quantized:
    """The int8 program of a QAS region (prefix + tail): `quantize_frozen` on the graph's forward nodes alone, so
    that the boundary is what the float forward reads (the backward's reads of saved tensors are the integer
    backward's own); its trained biases' int32 values are their starting state."""
    fwd = replace(g, nodes=[n for n in g.nodes if n.kind in ("input", "forward")])
    return quantize_frozen(fwd, region, ranges, weights)
