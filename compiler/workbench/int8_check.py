"""`run --check` of a plan with an int8 frozen prefix (compile --quantize-frozen int8): C firmware (run_c.py) or a
Python plan (run.py).

Two checks, each as strict as its arithmetic allows:
- the prefix: the plan's dequantised boundary on the last batch (the firmware's et_int8_boundary, the Python
  runtime's boundary tensors as its step made them) equals, bit for bit, the Python integer reference's
  (runtime/python/int8_prefix.py) on the same input, integer weights (derived again from the float ones) and scales;
- the head: the float model trained by autograd with each boundary module's output replaced by that reference's
  boundary (a forward hook), so that the head trains from exactly what the firmware's head reads; its weights are
  then held to the firmware's within the float check's tolerance (check_rules.RTOL, check_rules.ATOL).
"""
from __future__ import annotations

import json

import numpy as np
import torch
from safetensors.numpy import load_file

from edgetrain.compiler.errors import EdgetrainError
from edgetrain.compiler.graph.ir import TrainingGraph
from edgetrain.compiler.graph.quantize import (Q8_ADD, Q8_CONV, Q8_DEQUANTIZE, conv_integers, int8_tiled_plan,
                                               prefix_program, q8_layers)
from edgetrain.compiler.graph.qas_lower import QAS_BACKWARD
from edgetrain.runtime.python.int8_prefix import run_prefix


class Int8Reference:
    """The integer reference of a schedule's int8 prefix: its program, integer parameters and boundary modules."""

    def __init__(self, body: dict, weights_path: str) -> None:
        g = TrainingGraph.from_json(body["graph"])
        self.program = prefix_program(g)
        floats = load_file(weights_path)
        self.values: dict[str, np.ndarray] = {}
        self.floats: dict[str, np.ndarray] = {}  # the float values the integers are made from, by parameter
        for q in (q for n in g.nodes for q in q8_layers(n.attrs) if "weight" in q):  # a tiled prefix's too
            w = {p: floats[f"param/{p}"] for p in (q["weight"], q["bias"]) if p}
            self.floats.update(w)
            self.values.update(conv_integers(q, {p: v.astype(np.float64) for p, v in w.items()}))
        self.boundary = [n for n in g.nodes if n.op == Q8_DEQUANTIZE]  # in graph order: the firmware's order
        self.graph = g
        self.per_step: list[dict[str, np.ndarray]] | None = None  # int8 bias training: each step's boundary
        self.current: dict[int, dict[str, np.ndarray]] = {}  # what each fed model's hooks hand its head, by id

    def outputs(self, x: torch.Tensor) -> dict[str, np.ndarray]:
        """The dequantised boundary tensors (float32, by dequantize node) on the float input `x`."""
        return run_prefix(self.program, self.values, x.detach().cpu().numpy().astype(np.float32))

    def flat(self, x: torch.Tensor) -> np.ndarray:
        out = self.outputs(x)
        return np.concatenate([out[n.name].reshape(-1) for n in self.boundary]).astype(np.float32)

    def feed(self, model: torch.nn.Module):
        """Hooks on the modules whose outputs are the boundary tensors, each returning the reference's value for the
        batch last given to the function this returns."""
        current: dict[str, np.ndarray] = {}
        self.current[id(model)] = current
        for n in self.boundary:
            src = self.graph.node(n.inputs[0].name)
            module = _boundary_module(model, src, self.graph)
            module.register_forward_hook(
                lambda m, args, out, name=n.name: torch.from_numpy(current[name]).reshape(out.shape).to(out.device, out.dtype))

        steps = iter(self.per_step) if self.per_step is not None else None

        def before(x: torch.Tensor) -> None:
            current.clear()
            current.update(self.outputs(x) if steps is None else next(steps))
        return before

    def refresh(self, model: torch.nn.Module, x: torch.Tensor) -> None:
        """Hand `model`'s head the reference's boundary on `x` now (after training: the trained biases')."""
        self.current[id(model)].clear()
        self.current[id(model)].update(self.outputs(x))

    def replay_qas(self, body: dict, grads: np.ndarray, batches) -> dict[str, np.ndarray]:
        """int8 bias training's integer reference (runtime/python/int8_qas.py) over `batches`, each step's backward
        from the float gradient the firmware's head handed the region that step (`grads`, flat, step after step:
        the head's float arithmetic is held to autograd apart). Returns the trained int32 biases; afterwards the
        reference's boundary is the trained region's (`outputs`), and `feed` hands each step's to the head."""
        from edgetrain.runtime.python import int8_qas as qas

        node = next(n for n in self.graph.nodes if n.op == QAS_BACKWARD)
        trained, bname = node.attrs["qas"]["trained"], node.attrs["qas"]["boundary"]
        program = json.loads(self.program)
        shape = self.graph.node(bname).shape
        per = int(np.prod(shape))
        if grads.size != per * len(batches):
            raise EdgetrainError(f"--check: the firmware handed {grads.size} gradient floats for {len(batches)} steps "
                                 f"of {per}")
        opt = qas.sgd_of(body["graph"]["optimizer"])
        state = qas.initial_state(program, self.values, trained)
        self.per_step = []
        for k, (x, _) in enumerate(batches):
            fwd = qas.forward(program, self.values, state, x.detach().cpu().numpy().astype(np.float32))
            self.per_step.append(fwd.boundary)
            g = grads[k * per:(k + 1) * per].reshape(shape)
            qas.update(program, opt, state, qas.backward(program, self.values, fwd, {bname: g}, trained))
        self.initial = {b: v.copy() for b, v in self.values.items() if b in state.biases}
        self.values.update(state.biases)
        return dict(state.biases)


def _boundary_module(model: torch.nn.Module, node, g: TrainingGraph) -> torch.nn.Module:
    """The module whose output is `node`: a convolution's (_conv_module), or a residual add's: the innermost module
    above the convolution that feeds the add whose output is its input plus that convolution's (a probe on a copy
    of the model says so; MobileNetV2's inverted residual)."""
    if node.op != Q8_ADD:
        return _conv_module(model, node)
    convs = [g.node(r.name) for r in node.inputs if g.node(r.name).op == Q8_CONV]
    for conv in convs:
        inner = _conv_module(model, conv)
        path = next(p for p, m in model.named_modules() if m is inner).split(".")
        for k in range(len(path) - 1, 0, -1):
            outer = ".".join(path[:k])
            if _adds_to_its_input(model, outer, ".".join(path), g.input_shape):
                return model.get_submodule(outer)
    raise EdgetrainError(f"--check: the int8 prefix hands the float head `{node.name}` ({node.op}), a residual add "
                         "that is no module's output (its input plus a convolution's), so the autograd reference "
                         "cannot feed its head the integer prefix's value there; run without --check")


def _adds_to_its_input(model: torch.nn.Module, outer: str, conv: str, input_shape) -> bool:
    """Whether module `outer`'s output is its input plus convolution `conv`'s output, on a random batch run
    through a copy of `model` in eval mode (the model's own running statistics untouched)."""
    import copy

    probe = copy.deepcopy(model).eval()
    seen = {}
    probe.get_submodule(outer).register_forward_hook(lambda m, args, out: seen.update(x=args[0], y=out))
    probe.get_submodule(conv).register_forward_hook(lambda m, args, out: seen.update(c=out))
    with torch.no_grad():
        dtype = next(probe.parameters()).dtype  # the reference's (float64 where it trains in double)
        probe(torch.randn(tuple(input_shape), generator=torch.Generator().manual_seed(0), dtype=dtype))
    x, y, c = seen.get("x"), seen.get("y"), seen.get("c")
    return all(isinstance(t, torch.Tensor) for t in (x, y, c)) and x.shape == y.shape == c.shape \
        and torch.equal(y, x + c)


def _conv_module(model: torch.nn.Module, node) -> torch.nn.Module:
    """The convolution module whose output is `node` (the int8 prefix's last op there), found by its weight."""
    plan = int8_tiled_plan(node.attrs)  # computed patch by patch: its last op's
    q8 = plan["ops"][-1]["q8"] if plan else node.attrs["q8"] if node.op == Q8_CONV else {}
    if "weight" in q8:
        path = q8["weight"].rsplit(".", 1)[0]
        module = model.get_submodule(path) if path != q8["weight"] else None
        if isinstance(module, torch.nn.Conv2d):
            return module
    raise EdgetrainError(f"--check: the int8 prefix hands the float head `{node.name}` ({node.op}), which is no "
                         "nn.Conv2d module's output, so the autograd reference cannot feed its head the integer "
                         "prefix's value there; run without --check")


def has_int8_prefix(body: dict) -> bool:
    """Whether a schedule's graph hands its float head an int8 prefix's dequantised boundary."""
    return any(n["op"] == Q8_DEQUANTIZE for n in body["graph"]["nodes"])


def boundary_mismatches(ours: np.ndarray, ref: np.ndarray) -> int:
    """Elements whose float32 bits differ (a size mismatch counts every element)."""
    if ours.shape != ref.shape:
        return max(ours.size, ref.size)
    return int(np.count_nonzero(ours.view(np.uint32) != ref.view(np.uint32)))
