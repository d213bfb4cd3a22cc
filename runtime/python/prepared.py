"""Prepared nodes: what a plan node's call needs that is the same at every step, read once and reused.

A plan passes each node's op and arguments at every call (a generated plan as Python, `plan_api.py`, read back
into the node's operands and attrs; `Runtime.compute` takes those directly). Reading them anew
(the argument template walked, markers looked up, parameters found by name, flags derived from `keep`, `aux`,
`updates`, `then`) was most of the runtime's Python per op. `prepare` reads them once into a `Node`; the runtime
keeps one per (node, compute or recompute) and reuses it only while the call's op, operands, attrs and aux
equal those it was made from (`Node.matches`: one comparison with a private copy; for a plan's call
`fn`, `call_args` and `call_keywords`, whose handles and kept views compare as themselves), so a call whose arguments
changed is prepared anew, never run with the old ones. What depends on the tensors of the step (operands,
output sizes, storage sharing) is still read at every call.
"""
from __future__ import annotations

import copy
import json
from collections import Counter
from dataclasses import dataclass

from torch import Tensor

from . import aten_call, fused_kernels, inplace, update_memory


@dataclass(slots=True, eq=False)
class Update:
    """An update applied right after the op: an output item (through a view) to a parameter or a buffer."""
    item: int
    view: tuple | None  # prepared (aten_call.prepared_view)
    apply: object = None  # the optimizer's update of a parameter: (grad, grad_is_scratch) -> None
    # A parameter's gradient the node does not hold and no other update reads: SGD may add into it (through a view
    # too, where the view is all of its bytes: a parameter-sized temporary there is memory no model counts)
    may_scratch: bool = False
    # Parameter-sized temporaries the update holds at its peak: (out of place, gradient taking the decay in place)
    temporaries: tuple[int, int] = (0, 0)
    label: str = ""
    buffer: Tensor | None = None  # a buffer's new value is copied into it (first computations only)


@dataclass(slots=True, eq=False)
class Fused:
    """An op fused after the node's own (`then`): it holds nothing; its outputs feed its updates."""
    call: aten_call.Call
    scratch: int
    scratch_label: str
    drop_label: str
    updates: tuple[Update, ...]


@dataclass(slots=True, eq=False)
class Node:
    # what it was prepared from, as copies the plan cannot change
    op: str
    inputs: list
    attrs: dict
    aux_of: str | None
    # read once
    operands: tuple[tuple[str, tuple | None], ...]  # (tensor name, prepared view chain or None) per operand
    plain: list[bool]  # operand k is a tensor as it is (in-place candidates)
    aux_name: str | None
    call: aten_call.Call
    buffer_call: aten_call.Call | None  # first computation that updates its buffers itself (inplace.py)
    buffer_outs: dict[int, Tensor]  # output item -> the buffer holding its new value after `buffer_call`
    dying: bool
    keep_list: bool  # `keep` is a list: the node holds a tuple
    held_items: tuple[int, ...]
    aux_items: tuple[int, ...]
    kept: frozenset  # items the node holds or keeps as aux (not dropped)
    updates: tuple[Update, ...]
    then: tuple[Fused, ...]
    scratch: int
    scratch_label: str
    drop_label: str
    loss_item: tuple | None  # (item,) where the op's output is the step's loss
    multi_out: bool  # keep is given: dropped outputs may exist even if the op returns one
    # One output of a multi-output op the graph holds apart (max pool's values and indices): the call without
    # what it keeps, shared by the op's other nodes, so the one computed right after it takes its outputs.
    twin: str | None
    inplace_calls: dict  # operand index -> the op's in-place twin writing into it, prepared on first use
    # The schedule counts the output in this operand's bytes (`into`): the call that writes it there.
    into: int | None
    into_call: aten_call.Call | None
    # A node prepared from a plan's call (plan_api.py): that call's op, arguments and keywords, compared with
    # each later call's (the plan's own objects: tensor handles, parameters and markers compare as themselves),
    # and what the call returns (its tensor's handle, and its aux's).
    fn: object = None
    call_args: tuple | None = None
    call_keywords: dict | None = None
    returns: object = None

    def matches(self, op: str, inputs: list, attrs: dict, aux_of: str | None) -> bool:
        return op == self.op and aux_of == self.aux_of and inputs == self.inputs and attrs == self.attrs

    def inplace_call(self, spot: tuple[int, list]) -> aten_call.Call:
        """The in-place twin writing into operand spot[0] (its argument template, spot[1], follows from it)."""
        c = self.inplace_calls.get(spot[0])
        if c is None:
            c = self.inplace_calls[spot[0]] = aten_call.Call(
                inplace.INPLACE[self.op], dict(self.attrs, args=spot[1]), self.call.params, self.call.buffers,
                self.call.device)
        return c


def _updates(specs, kept, first: bool, params: dict, buffers: dict, optim) -> tuple[Update, ...]:
    out = []
    readers = Counter(u.get("item") or 0 for u in specs)
    for u in specs:
        item, view = u.get("item") or 0, u.get("view")
        if "param" in u:
            name = u["param"]
            s = optim.settings
            out.append(Update(item, aten_call.prepared_view(view), apply=optim.updater(name, params[name]),
                              may_scratch=update_memory.takes_decay_in_place(item, kept, readers[item]),
                              temporaries=(optim.unit.temporaries(s, False), optim.unit.temporaries(s, True)),
                              label=f"update of {name} (temporaries)"))
        elif first:  # a recompute never updates running statistics again
            out.append(Update(item, aten_call.prepared_view(view), buffer=buffers[u["buffer"]]))
    return tuple(out)


# What a node's attrs say beyond the op's call: how its outputs are held and counted, what follows it.
_NOT_THE_CALL = frozenset({"keep", "aux", "scratch", "updates", "then", "dying", "loss_item", "into"})


def _twin(op: str, inputs: list, attrs: dict) -> str:
    """The op's call as a key: equal for the nodes that hold different outputs of one call."""
    return repr((op, inputs, sorted((k, v) for k, v in attrs.items() if k not in _NOT_THE_CALL)))


def _q8_call(attrs: dict) -> dict:
    """An int8 node's call: its quantisation (attrs["q8"]) given to its op as the keyword q8, in JSON (q8_ops.py)."""
    if "q8" not in attrs:
        return attrs
    return dict(attrs, kwargs={**(attrs.get("kwargs") or {}), "q8": json.dumps(attrs["q8"])})


def prepare(first: bool, name: str, op: str, inputs: list, attrs: dict, aux_of: str | None, params: dict,
            buffers: dict, device, optim) -> Node:
    """A node's call read once. KeyError names an unknown op, parameter or buffer."""
    inputs, attrs = copy.deepcopy(inputs), copy.deepcopy(attrs)
    keep, aux_items = attrs.get("keep"), tuple(attrs.get("aux", ()))
    held = aten_call.held_items(keep)
    kept = frozenset((*held, *aux_items))
    specs = attrs.get("updates", ())
    buffer_call, buffer_outs = None, {}
    if first and specs and inplace.updates_buffers_in_place(op, attrs):
        buffer_call = aten_call.Call(inplace.BUFFER_UPDATES[op][0], attrs, params, buffers, device)
        buffer_outs = {u["item"]: buffers[u["buffer"]] for u in specs}
    into, into_call = attrs.get("into"), None
    if into is not None:
        variant, into_attrs = inplace.counted_attrs(op, attrs)
        into_call = aten_call.Call(variant, into_attrs, params, buffers, device)
    then = tuple(Fused(aten_call.Call(sub["op"], sub, params, buffers, device), sub.get("scratch", 0),
                       f"{name} (then {sub['op']}, kernel scratch)", f"{name} (then {sub['op']})",
                       _updates(sub.get("updates", ()), (), first, params, buffers, optim))
                 for sub in attrs.get("then", ()))
    return Node(op=op, inputs=inputs, attrs=attrs, aux_of=aux_of,
                operands=tuple((r, None) if isinstance(r, str) else (r["t"], aten_call.prepared_view(r.get("view")))
                               for r in inputs),
                plain=[isinstance(r, str) for r in inputs],
                aux_name=f"{aux_of}.aux" if aux_of is not None else None,
                call=fused_kernels.Call(attrs, params, buffers, device) if op == fused_kernels.FUSED_OP
                else aten_call.Call(op, _q8_call(attrs), params, buffers, device),
                buffer_call=buffer_call, buffer_outs=buffer_outs, dying="dying" in attrs,
                keep_list=isinstance(keep, list), held_items=held, aux_items=aux_items, kept=kept,
                updates=_updates(specs, kept, first, params, buffers, optim), then=then,
                scratch=attrs.get("scratch", 0), scratch_label=f"{name} (kernel scratch)",
                drop_label=f"{name} (dropped outputs)",
                loss_item=(attrs["loss_item"],) if first and "loss_item" in attrs else None,
                multi_out=keep is not None, twin=_twin(op, inputs, attrs) if isinstance(keep, int) else None,
                inplace_calls={}, into=into, into_call=into_call)
