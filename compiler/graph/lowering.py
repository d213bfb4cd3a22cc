"""Lower a forward graph to the training DAG: loss, backward kernels with fused SGD, gradient sums.

Order of the result (the execution order, stage t computes node t):
    input, forward nodes..., labels, loss, bwd.loss, then per forward node in reverse: [gsum.<n>], bwd.<n>
A backward node reads the gradient of its forward node's output plus exactly the operands the registry
lists as saved, and applies SGD to the forward node's parameters right after computing their gradients:
after the input gradient that needed the old weights, so gradients never need a buffer of their own.

What a node holds depends on the runtime that runs the plan (index dtype, gradient workspace, max-pool
scratch): `graph.backends` describes each, and `lower` applies the chosen one to every node.
"""
from __future__ import annotations

import dataclasses
from math import prod

from .backends import PYTHON, Backend
from .forward import ForwardGraph
from .ir import LOSSES, Node, OptimizerConfig, TensorRef, TrainingGraph, inverse_view, view_shape
from .ops import GRAD_SUM, OPS, grad_sum_flops, sgd_flops



def _view_shape(shapes: dict[str, tuple], r: TensorRef) -> tuple:
    return view_shape(shapes[r.name], r.view)


def _to_base(shapes: dict[str, tuple], grad: TensorRef, operand: TensorRef) -> TensorRef:
    """A gradient computed in the shape `operand` is seen in, re-viewed in the shape of its base tensor."""
    if not operand.view:
        return grad
    return TensorRef(grad.name, grad.view + inverse_view(shapes[operand.name], operand.view))


def _for_backend(n: Node, backend: Backend) -> Node:
    """A forward node as `backend`'s runtime holds it (the frontend's node is left untouched)."""
    backend.check_node(n)
    if n.op == "maxpool_argmax":
        scratch = n.workspace_bytes if backend.maxpool_value_scratch else 0
        return dataclasses.replace(n, dtype=backend.index_dtype, workspace_bytes=scratch)
    return n


def lower(fwd: ForwardGraph, model_name: str, loss: str = "cross_entropy",
          optimizer: OptimizerConfig | None = None, backend: Backend = PYTHON) -> TrainingGraph:
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; choose one of {LOSSES}")
    optimizer = optimizer or OptimizerConfig()
    nodes: list[Node] = [_for_backend(n, backend) for n in fwd.nodes]
    fwd = dataclasses.replace(fwd, nodes=list(nodes))
    shapes: dict[str, tuple] = {n.name: n.shape for n in nodes}  # type: ignore[misc]
    logits_shape = _view_shape(shapes, fwd.output)
    labels_shape = logits_shape[:-1] if loss == "cross_entropy" else logits_shape
    nodes.append(Node(name="labels", kind="labels", op="labels", shape=labels_shape,
                      dtype=backend.index_dtype if loss == "cross_entropy" else "float32", source="the data batch"))
    shapes["labels"] = labels_shape
    logits, labels = fwd.output, TensorRef("labels")
    if loss == "cross_entropy" and len(logits_shape) > 2:  # per-token classes (an LM): over all B*T positions
        rows = prod(logits_shape[:-1])
        logits = TensorRef(logits.name, logits.view + (("reshape", (rows, logits_shape[-1])),))
        labels = TensorRef("labels", (("reshape", (rows,)),))
    loss_shape = _view_shape(shapes, logits)
    rule = OPS[loss]
    in_shapes = [loss_shape, _view_shape(shapes, labels)]
    nodes.append(Node(name="loss", kind="loss", op=loss, inputs=(logits, labels), shape=(),
                      flops=rule.flops(in_shapes, (), {}), source="the loss"))
    backend.check_node(nodes[-1])

    # Which forward tensors need a gradient: those downstream of a parameter.
    needs_grad: dict[str, bool] = {}
    for n in fwd.nodes:
        rule_n = OPS[n.op]
        needs_grad[n.name] = bool(n.params) or any(
            needs_grad.get(r.name, False) for k, r in enumerate(n.inputs) if k not in rule_n.nondiff_inputs)

    contributions: dict[str, list[TensorRef]] = {n.name: [] for n in fwd.nodes}
    nodes.append(Node(name="bwd.loss", kind="backward", op=rule.backward, inputs=(logits, labels),
                      shape=loss_shape, flops=rule.input_grad_flops(in_shapes, (), {}), forward_of="loss",
                      source="the loss"))
    shapes["bwd.loss"] = loss_shape
    contributions[fwd.output.name].append(_to_base(shapes, TensorRef("bwd.loss"), logits))

    for n in reversed(fwd.nodes):
        if not needs_grad[n.name] or not contributions[n.name]:
            continue
        grads = contributions[n.name]
        if len(grads) == 1:
            gy = grads[0]
        else:
            gy = TensorRef(f"gsum.{n.name}")
            nodes.append(Node(name=gy.name, kind="grad_sum", op=GRAD_SUM, inputs=tuple(grads), shape=n.shape,
                              flops=grad_sum_flops(n.shape, len(grads)), forward_of=n.name,  # type: ignore[arg-type]
                              source=n.source))
            shapes[gy.name] = n.shape  # type: ignore[assignment]
        rule_n = OPS[n.op]
        in_shapes = [_view_shape(shapes, r) for r in n.inputs]
        if rule_n.grad_views is not None:  # add, cat: each input's gradient is a view of gy
            for r, view in zip(n.inputs, rule_n.grad_views(in_shapes, n.shape, n.attrs)):  # type: ignore[arg-type]
                if needs_grad.get(r.name, False):
                    contributions[r.name].append(_to_base(shapes, TensorRef(gy.name, gy.view + view), r))
            continue
        wrt = [k for k in rule_n.grad_inputs if k not in rule_n.nondiff_inputs]
        needs = [k for k in wrt if needs_grad.get(n.inputs[k].name, False)]
        if rule_n.backward is None or not (needs or n.params):
            continue
        saved = []
        for s in rule_n.saved:
            saved.append(TensorRef(n.name) if s == "out" else n.inputs[int(s[2:])])
        flops = rule_n.input_grad_flops(in_shapes, n.shape, n.attrs) if needs else 0  # type: ignore[misc]
        if n.params:
            flops += rule_n.param_grad_flops(in_shapes, n.shape, n.attrs)  # type: ignore[misc]
            flops += sgd_flops([fwd.params[p].shape for p in n.params])
        name = f"bwd.{n.name}"
        multi = len(rule_n.grad_inputs) > 1  # a tuple of every input gradient, held as one tensor
        out_shape = (sum(prod(in_shapes[k]) for k in rule_n.grad_inputs),) if multi else in_shapes[0]
        nodes.append(Node(
            name=name, kind="backward", op=rule_n.backward, inputs=(gy, *saved), params=n.params,
            attrs={**n.attrs, "input_shape": list(in_shapes[0]), "needs_input_grad": bool(needs)},
            shape=out_shape if needs else None,
            aux_of=n.name if n.aux_bytes else None,
            # The gradients, until SGD applies them; none where the runtime fuses the update into the wgrad.
            workspace_bytes=(sum(fwd.params[p].bytes for p in n.params) if backend.param_grad_workspace else 0)
            + (rule_n.bwd_scratch_bytes(in_shapes, n.shape, n.attrs) if rule_n.bwd_scratch_bytes else 0),
            flops=int(flops), forward_of=n.name, source=n.source,
        ))
        for j, k in enumerate(rule_n.grad_inputs):
            if k not in needs:
                continue
            grad = TensorRef(name, (("item", j),)) if multi else TensorRef(name)
            contributions[n.inputs[k].name].append(_to_base(shapes, grad, n.inputs[k]))
        shapes[name] = out_shape

    return TrainingGraph(model=model_name, nodes=nodes, params=dict(fwd.params), buffers=dict(fwd.buffers),
                         input_shape=fwd.input_shape, num_classes=logits_shape[-1], loss=loss, optimizer=optimizer,
                         input_dtype=fwd.input_dtype, input_high=fwd.input_high)


def apply_costs(graph: TrainingGraph, target, measured_s: dict[str, float] | None = None) -> None:
    """Annotate each node with time and energy on `target` (from FLOPs, or measured seconds when given)."""
    for n in graph.nodes:
        if measured_s is not None and n.name in measured_s:
            n.time_s = measured_s[n.name]
            n.energy_j = n.time_s * target.flops_per_s / target.flops_per_joule
        else:
            n.time_s = target.compute_time_s(n.flops)
            n.energy_j = target.compute_energy_j(n.flops)
