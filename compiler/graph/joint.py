"""The training graph from torch's joint forward-backward graph: one node per aten op.

What becomes what:
- views, aliases, `detach` and `getitem` are folded into the operands of their readers (a view chain on a
  base tensor: no memory, never recomputed);
- a node holds the outputs of its op that other nodes read. A forward op's small side outputs read only by
  one backward node (batch-norm's saved mean and inverse std) are its *aux*, kept from the forward pass to
  that node. A forward op with two large outputs read apart (max-pool's values and indices, dropout's output
  and mask) becomes one node per output, each running the op (the second keeps its own output only);
- a parameter's complete gradient is consumed where it is made: the node applies the optimizer and drops it
  (the fused update); a node that reads a parameter in the backward pass runs before its update;
- buffer updates (batch-norm running statistics) are applied by the node that makes them, on its first
  computation only, so a recompute never updates them twice.
FLOPs come from torch's flop counter where it knows the op, else from one rule: elements read and written.
"""
from __future__ import annotations

import operator
from collections import Counter
from dataclasses import dataclass, field, replace
from math import prod

import networkx as nx
import torch
import torch.fx as fx

from edgetrain.runtime.python.aten_call import dropped_bytes, held_items, prepared_view
from edgetrain.runtime.python.optim import update_flops_per_element
from edgetrain.runtime.python.threads import PLAN_THREADS
from edgetrain.runtime.python.update_memory import planned_temporary_bytes

from edgetrain.compiler.errors import UnsupportedModelError
from edgetrain.compiler.frontend.capture import JointCapture
from edgetrain.compiler.frontend.random_keys import draws_random

from .aten_node import ALIASES, dtype_name, is_view, literal, numel, op_flops, op_name, op_scratch, spec_of
from .fusion import fuse_updates, remap_operands as _remap
from .ir import Node, OptimizerConfig, TensorRef, TrainingGraph

_AUX_SHARE = 8  # a side output at most 1/8 of the op's main output may ride along as aux


@dataclass
class _Out:
    """Output k of op node `node` (k None: the op's single result), seen through `view`."""

    node: str
    k: int | None
    view: tuple = ()


@dataclass
class _State:
    """A parameter or buffer placeholder seen through `view`."""

    kind: str  # "param" | "buffer"
    name: str
    view: tuple = ()


@dataclass
class _Op:
    fx: fx.Node
    args: list
    kwargs: dict
    operands: list  # _Out, in marker order
    readers: dict = field(default_factory=dict)  # output k -> names of op nodes that read it
    kind: str = "forward"


class _Builder:
    def __init__(self, cap: JointCapture) -> None:
        self.cap = cap
        self.ref: dict[str, object] = {}
        self.ops: dict[str, _Op] = {}
        self.order: list[str] = []

    # -- pass 1: fold views, record each op's operands ------------------------------------------------
    def walk(self) -> None:
        cap = self.cap
        for n in self.cap.gm.graph.nodes:
            if n.op in ("placeholder", "get_attr"):
                if n.name in cap.params:
                    self.ref[n.name] = _State("param", cap.params[n.name])
                elif n.name in cap.buffers:
                    self.ref[n.name] = _State("buffer", cap.buffers[n.name])
                else:
                    self.ref[n.name] = _Out("input" if n.name == cap.inputs[0] else "labels", None)
            elif n.op == "call_function" and n.target is operator.getitem:
                base, k = self.ref[n.args[0].name], n.args[1]
                if isinstance(base, _Out) and base.k is None and not base.view and base.node in self.ops \
                        and isinstance(self.ops[base.node].fx.meta.get("val"), (tuple, list)):
                    self.ref[n.name] = _Out(base.node, k)
                else:  # an item of a list of views (split, unbind)
                    self.ref[n.name] = self._viewed(base, ("item", k))
            elif n.op == "call_function" and is_view(n.target):
                base = self.ref[n.args[0].name] if isinstance(n.args[0], fx.Node) else None
                if base is None:
                    raise UnsupportedModelError(f"view {n.name} of a non-tensor")
                name = op_name(n.target)
                view = () if name in ALIASES else ((name, tuple(_tuplify(literal(a, n.name)) for a in n.args[1:])),)
                if n.kwargs:
                    raise UnsupportedModelError(f"view op {name} with keyword arguments at node {n.name}")
                self.ref[n.name] = self._viewed(base, *view) if view else base
            elif n.op == "call_function":
                self._op(n)
            elif n.op == "output":
                pass
            else:
                raise UnsupportedModelError(f"graph node {n.name} of kind {n.op} is not supported")

    @staticmethod
    def _viewed(base, *views):
        if isinstance(base, _Out):
            return _Out(base.node, base.k, base.view + views)
        if isinstance(base, _State):
            return _State(base.kind, base.name, base.view + views)
        raise UnsupportedModelError(f"a view of {base!r}")

    def _op(self, n: fx.Node) -> None:
        if not hasattr(n.target, "_schema"):
            raise UnsupportedModelError(f"node {n.name}: {n.target} is not an aten op")
        operands: list[_Out] = []

        def marker(a):
            if isinstance(a, fx.Node):
                r = self.ref[a.name]
                if isinstance(r, _State):
                    key = "$p" if r.kind == "param" else "$b"
                    return {key: r.name, **({"view": [list(v) for v in r.view]} if r.view else {})}
                if not isinstance(r, _Out):
                    raise UnsupportedModelError(f"node {n.name}: operand {a.name} is not a tensor")
                val = a.meta.get("val")
                if isinstance(val, torch.Tensor) and val.numel() == 0:  # no data: made where it is read
                    return {"$empty": list(val.shape), "dtype": dtype_name(val)}
                operands.append(r)
                return {"$t": len(operands) - 1}
            if isinstance(a, (list, tuple)) and any(isinstance(x, fx.Node) for x in a):
                return [marker(x) for x in a]
            return literal(a, f"node {n.name} ({op_name(n.target)})")

        args = [marker(a) for a in n.args]
        kwargs = {k: marker(v) for k, v in n.kwargs.items()}
        self.ops[n.name] = _Op(fx=n, args=args, kwargs=kwargs, operands=operands)
        self.order.append(n.name)
        self.ref[n.name] = _Out(n.name, None)
        for r in operands:
            if r.node in self.ops:
                self.ops[r.node].readers.setdefault(r.k, []).append(n.name)


def _tuplify(x):
    return tuple(_tuplify(v) for v in x) if isinstance(x, list) else x


def _outputs(op: _Op) -> list:
    val = op.fx.meta.get("val")
    return list(val) if isinstance(val, (tuple, list)) else [val]


def build_graph(cap: JointCapture, model: str, input_shape: tuple[int, ...], num_classes: int, loss: str,
                optimizer: OptimizerConfig, input_dtype: str = "float32", input_high: int | None = None,
                seed_keys: dict[str, str] | None = None, widen_fusion: bool = True,
                scratch_threads: int = PLAN_THREADS) -> TrainingGraph:
    """The TrainingGraph of a captured training step (stage t computes node t). `widen_fusion`: see
    `fusion.fuse_updates`; `scratch_threads`: the intra-op threads the kernels' own scratch is counted for (the
    target's, `workspace.scratch_threads`; 0 counts none: workspace.py's `applies`)."""
    b = _Builder(cap)
    b.walk()
    ops = b.ops
    out_node = cap.gm.graph.output_node()
    outputs = {o.name: b.ref[o.name] for o in out_node.args[0] if isinstance(o, fx.Node)}
    loss_ref = outputs[cap.loss]
    if not isinstance(loss_ref, _Out) or loss_ref.node not in ops:
        raise UnsupportedModelError("the loss is not computed by the model's graph")

    # Updates: each parameter's gradient and each buffer's new value, at the op that makes it.
    updates: dict[str, list[dict]] = {}
    for fx_name, p in cap.grads.items():
        r = outputs[fx_name]
        if not isinstance(r, _Out) or r.node not in ops:
            raise UnsupportedModelError(f"the gradient of parameter {p} is not computed by an op")
        updates.setdefault(r.node, []).append({"item": r.k, "view": r.view, "param": p})
    for fx_name, buf in cap.buffer_updates.items():
        r = outputs[fx_name]
        if not isinstance(r, _Out) or r.node not in ops:
            raise UnsupportedModelError(f"the new value of buffer {buf} is not computed by an op")
        updates.setdefault(r.node, []).append({"item": r.k, "view": r.view, "buffer": buf})

    _read_running_stats_from_buffers(ops, updates)

    # Dead code (shape asserts, values nothing reads) is dropped: keep what updates, or the loss needs.
    dag0 = _op_dag(b.order, ops)
    roots = set(updates) | {loss_ref.node}
    live = set(roots)
    for root in roots:
        live |= nx.ancestors(dag0, root)
    for name in [n for n in b.order if n not in live]:
        del ops[name]
    b.order = [n for n in b.order if n in live]
    for op in ops.values():
        op.readers = {k: [r for r in rs if r in live] for k, rs in op.readers.items()}

    # Kinds: what the loss depends on (and what depends on nothing of the backward) is forward.
    dag = _op_dag(b.order, ops)
    backward = nx.descendants(dag, loss_ref.node)
    for name in b.order:
        ops[name].kind = "backward" if name in backward else "forward"
    ops[loss_ref.node].kind = "loss"

    # A parameter's update runs after every node that reads the parameter.
    param_update: dict[str, str] = {u["param"]: node for node, us in updates.items() for u in us if "param" in u}
    readers_of: dict[str, list[str]] = {}
    for name, op in ops.items():
        for p in _state_names(op, "$p"):
            readers_of.setdefault(p, []).append(name)
    for p, upd in param_update.items():
        for r in readers_of.get(p, []):
            if r != upd and ops[r].kind == "backward":
                if nx.has_path(dag, upd, r):
                    raise UnsupportedModelError(
                        f"parameter {p} is read by {r} after its gradient is complete; its update cannot run "
                        "before that read")
                dag.add_edge(r, upd)
    fwd_names = [n for n in b.order if ops[n].kind == "forward"]
    bwd_names = list(nx.lexicographical_topological_sort(dag.subgraph([n for n in b.order if ops[n].kind == "backward"]),
                                                          key=b.order.index))
    ordered = fwd_names + [loss_ref.node] + bwd_names

    x_val = next(n for n in cap.gm.graph.nodes if n.name == cap.inputs[0]).meta["val"]
    y_val = next(n for n in cap.gm.graph.nodes if n.name == cap.inputs[1]).meta["val"]
    input_node = Node(name="input", kind="input", op="input", shape=spec_of(x_val).shape, dtype=dtype_name(x_val),
                      source="the data batch")
    labels_node = Node(name="labels", kind="labels", op="labels", shape=spec_of(y_val).shape, dtype=dtype_name(y_val),
                       source="the data batch")
    nodes = fuse_updates(_nodes(b, ops, ordered, updates, loss_ref, cap, seed_keys or {}, scratch_threads,
                                optimizer.to_json()),
                         widen=widen_fusion, sizes={"input": input_node.bytes, "labels": labels_node.bytes})
    # input first; labels right before the first node that reads them.
    first_label = next((i for i, n in enumerate(nodes) if any(r.name == "labels" for r in n.inputs)), len(nodes))
    nodes = [input_node] + nodes[:first_label] + [labels_node] + nodes[first_label:]

    model_params = {}
    for ph, p in cap.params.items():
        val = next(n for n in cap.gm.graph.nodes if n.name == ph).meta["val"]
        model_params[p] = spec_of(val)
    model_buffers = {}
    for ph, buf in cap.buffers.items():
        val = next(n for n in cap.gm.graph.nodes if n.name == ph).meta.get("val")
        model_buffers[buf] = spec_of(val if val is not None else cap.constants[buf])
    trainable = tuple(p for p in model_params if p in set(cap.grads.values()))
    # A node that completes gradients also runs their optimizer steps: their arithmetic is part of its cost.
    per_element = update_flops_per_element(optimizer.to_json())
    nodes = [replace(n, flops=n.flops + per_element * sum(prod(model_params[p].shape) for p in n.updates))
             if n.updates else n for n in nodes]
    return TrainingGraph(model=model, nodes=nodes, params=model_params, buffers=model_buffers,
                         input_shape=tuple(input_shape), num_classes=num_classes, loss=loss, optimizer=optimizer,
                         input_dtype=input_dtype, input_high=input_high, trainable=trainable, exported=cap.exported)


_BN_BACKWARD = "aten.native_batch_norm_backward.default"


def _read_running_stats_from_buffers(ops: dict[str, _Op], updates: dict[str, list[dict]]) -> None:
    """A training-mode batch-norm backward gets the new running statistics as operands (running_mean,
    running_var) but never reads their values (it uses the saved mean and inverse std): it reads them from the
    buffers instead, which the forward op has already updated, so its forward node keeps 2C words, not 4C."""
    new_value = {(node, u["item"]): u["buffer"] for node, us in updates.items() for u in us
                 if "buffer" in u and not u.get("view")}
    for name, op in ops.items():
        if op_name(op.fx.target) != _BN_BACKWARD or op.args[7] is not True:
            continue
        by_buffer: dict[int, str] = {}
        for pos in (3, 4):  # running_mean, running_var
            a = op.args[pos]
            r = op.operands[a["$t"]] if isinstance(a, dict) and "$t" in a else None
            if r is not None and not r.view and (r.node, r.k) in new_value:
                by_buffer[a["$t"]] = new_value[(r.node, r.k)]
        if not by_buffer:
            continue
        remap: dict[int, dict] = {}
        kept: list[_Out] = []
        for i, r in enumerate(op.operands):
            if i in by_buffer:
                remap[i] = {"$b": by_buffer[i]}
                ops[r.node].readers[r.k].remove(name)
            else:
                remap[i] = {"$t": len(kept)}
                kept.append(r)
        op.args, op.kwargs, op.operands = _remap(op.args, remap), _remap(op.kwargs, remap), kept


def _op_dag(order: list[str], ops: dict[str, _Op]) -> nx.DiGraph:
    """Which op reads which (the tensors between ops; parameters and the batch are not nodes)."""
    dag = nx.DiGraph()
    dag.add_nodes_from(order)
    for name, op in ops.items():
        for r in op.operands:
            if r.node in ops:
                dag.add_edge(r.node, name)
    return dag


def _state_names(op: _Op, key: str) -> list[str]:
    found: list[str] = []

    def visit(a):
        if isinstance(a, dict):
            if key in a:
                found.append(a[key])
            else:
                for v in a.values():
                    visit(v)
        elif isinstance(a, list):
            for v in a:
                visit(v)

    visit(op.args)
    visit(op.kwargs)
    return list(dict.fromkeys(found))


def _nodes(b: _Builder, ops: dict[str, _Op], ordered: list[str], updates: dict, loss_ref: _Out,
           cap: JointCapture, seed_keys: dict[str, str], scratch_threads: int = PLAN_THREADS,
           optim_config: dict | None = None) -> list[Node]:
    """One Node per op (two or more for a forward op whose large outputs are read apart). `scratch_threads`: the
    intra-op threads the kernels' scratch is counted for (0: none counted); `optim_config`: the optimizer whose
    updates' temporaries the updating nodes hold (None: SGD's defaults)."""
    # How each op's outputs are held: name of the node holding output k, and its view prefix.
    held: dict[tuple[str, int | None], tuple[str, tuple]] = {}
    plan: dict[str, list[dict]] = {}  # op -> the nodes it becomes: {"name", "keep", "aux"}
    aux_of_reader: dict[str, tuple[str, dict[int, int]]] = {}
    for name in ordered:
        op = ops[name]
        outs = _outputs(op)
        tuple_valued = isinstance(op.fx.meta.get("val"), (tuple, list))
        read = [k for k in op.readers if op.readers[k]]
        if name == loss_ref.node and loss_ref.k not in read:
            read.append(loss_ref.k)
        if not tuple_valued:
            plan[name] = [{"name": name, "keep": None if read else "none", "aux": []}]
            if read:
                held[(name, None)] = (name, ())
            continue
        read = sorted(k for k in read if k is not None)
        if not read:
            plan[name] = [{"name": name, "keep": [], "aux": []}]
            continue
        if op.kind != "forward" or len(read) == 1:
            if len(read) == 1:
                plan[name] = [{"name": name, "keep": read[0], "aux": []}]
                held[(name, read[0])] = (name, ())
            else:
                plan[name] = [{"name": name, "keep": read, "aux": []}]
                for j, k in enumerate(read):
                    held[(name, k)] = (name, (("item", j),))
            continue
        main = max(read, key=lambda k: numel(outs[k]))
        small = [k for k in read if k != main and numel(outs[k]) * _AUX_SHARE <= numel(outs[main])]
        readers = {r for k in small for r in op.readers[k]}
        aux_ok = small and len(readers) == 1 and all(ops[r].kind == "backward" for r in readers) \
            and next(iter(readers)) not in aux_of_reader
        aux = small if aux_ok else []
        if aux:
            aux_of_reader[next(iter(readers))] = (name, {k: j for j, k in enumerate(aux)})
        parts = [{"name": name, "keep": main, "aux": aux}]
        held[(name, main)] = (name, ())
        for k in read:
            if k == main or k in aux:
                continue
            part = f"{name}.out{k}"
            parts.append({"name": part, "keep": k, "aux": []})
            held[(name, k)] = (part, ())
        plan[name] = parts

    def tref(r: _Out) -> TensorRef:
        if r.node in ("input", "labels"):
            return TensorRef(r.node, r.view)
        holder, prefix = held[(r.node, r.k)]
        return TensorRef(holder, prefix + r.view)

    nodes: list[Node] = []
    for name in ordered:
        op = ops[name]
        outs = _outputs(op)
        flops = op_flops(op.fx, outs)
        opname = op_name(op.fx.target)
        aux_from = aux_of_reader.get(name)
        operands = []
        args, kwargs = op.args, op.kwargs
        if aux_from:  # operands that are the forward node's aux become {"$aux": j}
            src, index = aux_from
            keep_ops: list[int] = []
            remap: dict[int, dict] = {}
            for i, r in enumerate(op.operands):
                if r.node == src and r.k in index and not r.view:
                    remap[i] = {"$aux": index[r.k]}
                else:
                    remap[i] = {"$t": len(keep_ops)}
                    keep_ops.append(i)
            args, kwargs = _remap(args, remap), _remap(kwargs, remap)
            operands = [op.operands[i] for i in keep_ops]
        else:
            operands = list(op.operands)
        refs = tuple(tref(r) for r in operands)
        params = tuple(_state_names(op, "$p"))
        buffers = tuple(_state_names(op, "$b"))
        ups = updates.get(name, [])
        scratch = op_scratch(op.fx, scratch_threads) if scratch_threads else 0
        for part_i, part in enumerate(plan[name]):
            keep = part["keep"]
            if keep == "none":
                shape, dtype, items = None, "float32", None
            elif keep is None:
                spec = spec_of(outs[0])
                shape, dtype, items = spec.shape, spec.dtype, None
            elif isinstance(keep, list):
                shape, dtype = None, "float32"
                items = tuple(spec_of(outs[k]) for k in keep) if keep else None
            else:
                spec = spec_of(outs[keep])
                shape, dtype, items = spec.shape, spec.dtype, None
            dropped = dropped_bytes(outs, keep, part["aux"])
            aux_bytes = sum(spec_of(outs[k]).bytes for k in part["aux"])
            attrs: dict = {"args": args, **({"kwargs": kwargs} if kwargs else {})}
            if keep is not None:  # None: the op's single result (the runtime's default)
                attrs["keep"] = keep
            if part["aux"]:
                attrs["aux"] = part["aux"]
            if scratch:  # the runtime's ledger holds it while the kernel runs
                attrs["scratch"] = scratch
            mine = ups if part_i == 0 else []
            if mine:
                attrs["updates"] = [{k: ([list(v) for v in u[k]] if k == "view" else u[k]) for k in u
                                     if not (k == "view" and not u[k])} for u in mine]
            if draws_random(op.fx.target, op.fx.args, op.fx.kwargs):  # unkeyed: its own name
                attrs["seed_key"] = seed_keys.get(name, name)
            if name == loss_ref.node:
                attrs["loss_item"] = loss_ref.k
            opt_updates = tuple(u["param"] for u in mine if "param" in u)
            # torch's optimizers allocate them, whatever the target (C firmware's lowering drops them)
            temporaries = _update_temporaries(attrs.get("updates", ()), outs, part, optim_config or {})
            nodes.append(Node(
                name=part["name"], kind=op.kind, op=opname, inputs=refs, params=params, buffers=buffers,
                attrs=attrs, shape=shape, dtype=dtype, items=items, aux_bytes=aux_bytes,
                aux_of=aux_from[0] if aux_from else None,
                workspace_bytes=dropped + scratch, update_temporary_bytes=temporaries, flops=flops,
                updates=opt_updates,
                source=_source(op, ops, cap.sources, {u["param"] for u in ups if "param" in u})))
    return nodes


def _update_temporaries(specs: list[dict], outs: list, part: dict, optim_config: dict) -> int:
    """The largest of the node's updates' parameter-sized temporaries (they run one after another, beside its
    dropped outputs and kernel scratch, as the runtime's ledger holds them): the rule in
    runtime/python/update_memory.py, read from the updates as the runtime reads them."""
    kept = (*held_items(part["keep"]), *part["aux"])
    readers = Counter(u.get("item") or 0 for u in specs)
    return max((planned_temporary_bytes(optim_config, u.get("item") or 0, kept, readers[u.get("item") or 0],
                                        outs[u.get("item") or 0], prepared_view(u.get("view")))
                for u in specs if "param" in u), default=0)


def _source(op: _Op, ops: dict[str, _Op], sources: dict[str, str], updated: set[str]) -> str:
    """The user's line of a forward op. A backward op is labelled by the forward op it differentiates: the one
    reading (or making the gradient of) the same parameter, else the forward operand its name continues (`avg_pool2d` for
    `avg_pool2d_backward`), else its last forward operand."""
    if op.kind != "backward":
        return sources.get(op.fx.name, "")
    params = set(_state_names(op, "$p")) | updated
    forward = [o for o in ops.values() if o.kind == "forward"]
    owner = next((o for o in forward if params & set(_state_names(o, "$p"))), None)
    if owner is None:
        read = [ops[r.node] for r in op.operands if r.node in ops and ops[r.node].kind == "forward"]
        name = op_name(op.fx.target).split(".")[1]
        owner = next((o for o in read if name.startswith(op_name(o.fx.target).split(".")[1])), None) \
            or (read[-1] if read else None)
    if owner is None:
        return ""
    line = sources.get(owner.fx.name)
    return f"backward of {owner.fx.name}" + (f", {line}" if line else "")
