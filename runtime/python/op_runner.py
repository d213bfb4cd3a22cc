"""How the executor runs one node's op: its operands read (views applied), its kernel called (the node's own op, an
in-place twin into an operand the plan frees next, or the op that writes into the operand it is counted in), the
outputs the plan keeps held in the ledger, its kernel scratch and dropped outputs counted while they live, and the
optimizer updates the node carries applied. `Runtime` (executor.py) holds the state these read: tensors by name,
the ledger, the page store.
"""
from __future__ import annotations

import torch
from torch import Tensor

from . import aten_call, inplace, prepared
from .plan_error import PlanError


class Overwritten:
    """Stands for a resident tensor whose storage an in-place op took (`inplace.py`) until the plan frees it."""
    __slots__ = ("op", "by")

    def __init__(self, op: int, by: str) -> None:
        self.op, self.by = op, by


def _aliases(outs, ins) -> bool:
    """Whether an output with elements shares its storage with an operand with elements."""
    ptrs = [o.untyped_storage().data_ptr() for o in outs if isinstance(o, Tensor) and o.numel()]
    if ptrs:
        for t in ins:
            if isinstance(t, Tensor) and t.numel() and t.untyped_storage().data_ptr() in ptrs:
                return True
    return False


class OpRunner:
    """The op-running half of `Runtime` (a base class of it)."""

    def _operands(self, node: prepared.Node) -> list:
        live, ins = self._live, []
        for k, (r, view) in enumerate(node.operands):
            t = live.get(r)
            if t.__class__ is not Tensor:  # absent, overwritten, read ahead, or a held tuple: the full check
                t = self._require(r)
            if view is not None:
                try:
                    t = aten_call.view_of(t, view)
                except (RuntimeError, IndexError, TypeError) as e:
                    raise PlanError(f"{self._what}: view {node.inputs[k]['view']} of '{r}': {e}") from None
            ins.append(t)
        return ins

    def _run_aten(self, first, name, node):
        """One aten op: operands in, the outputs the plan keeps held, updates applied, the rest dropped."""
        ins = self._operands(node)
        aux = self._require(node.aux_name) if node.aux_name is not None else None
        spot = self._inplace_spot(node, ins) if node.dying and node.into is None else None
        ledger = self.ledger
        grad_was = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)  # torch.no_grad() without its context object, once per op
        try:
            # A kernel's scratch (the compiler's rule, in the plan) is held while its op runs and its outputs are applied.
            if node.scratch:
                ledger.enter(node.scratch, node.scratch_label)
                try:
                    held, outs = self._own_op(first, name, node, ins, aux, spot)
                finally:
                    ledger.leave(node.scratch)
            else:
                held, outs = self._own_op(first, name, node, ins, aux, spot)
            if spot is not None:  # the operand's bytes are the output's now: any read before its free is refused
                self._live[node.operands[spot[0]][0]] = Overwritten(self._op, name)
                self.in_place_ops += 1
            for sub in node.then:  # each holds nothing
                ledger.enter(sub.scratch, sub.scratch_label)
                try:
                    more = aten_call.run(sub.call, ins, aux, self.seed, self.step, held)
                    dropped = aten_call.dropped_bytes(more, "none")
                    ledger.enter(dropped, sub.drop_label)
                    try:
                        self._apply_updates(more, sub.updates, ledger)
                    finally:
                        ledger.leave(dropped)
                finally:
                    ledger.leave(sub.scratch)
        finally:
            torch._C._set_grad_enabled(grad_was)
        if self.observe and name in self.observe:  # a copy outside the ledger, for a check (run --check)
            self.observed[name] = held.detach().clone()
        if node.loss_item is not None:
            item = node.loss_item[0]
            self._step_loss = float(outs[0] if item is None else outs[item])
            self.losses.append(self._step_loss)
        return held

    def _inplace_spot(self, node, ins):
        """(operand, arguments) where the op may write into an operand the plan frees right after it."""
        spot = inplace.plan(node.op, node.attrs, ins, node.plain)
        if spot is None or self.store.writing(node.operands[spot[0]][0]):  # a page-out still reading it keeps it
            return None
        return spot

    def _own_op(self, first, name, node, ins, aux, spot=None):
        """The node's own op: its outputs held (and aux), its updates applied while the rest are dropped.
        `spot`: run the op's in-place twin into that operand (`inplace.plan`)."""
        updates = node.updates
        twin, self._twin = self._twin, None  # (key, operands, outputs) of the call just before, of this node's op
        if spot is not None or node.into is not None:
            twin = None  # an in-place twin runs instead
        if node.into is not None:
            outs = self._into(name, node, ins, aux)
        elif spot is None and node.buffer_call is not None:
            outs = aten_call.run(node.buffer_call, ins, aux, self.seed, self.step)
            new = node.buffer_outs  # the new values, in place already
            try:
                outs += [new[k] for k in range(len(outs), len(outs) + len(new))]
            except KeyError as e:
                raise PlanError(f"{self._what}: unknown op, parameter or buffer {e.args[0]!r}") from None
            updates = ()
        elif spot is None and node.twin is not None:
            # A node holding one output of an op whose outputs are held apart: the op's node computed by the call
            # just before on the same operands ran it already (the graph's time model still counts both runs).
            if twin is not None and len(twin[1]) == len(ins) and all(a is b for a, b in zip(twin[1], ins)):
                outs = twin[2]
            else:
                twin = None  # its outputs go before this op makes its own
                outs = aten_call.run(node.call, ins, aux, self.seed, self.step)
                self._twin = (node.twin, ins, outs)
        else:
            outs = aten_call.run(node.call if spot is None else node.inplace_call(spot), ins, aux, self.seed,
                                 self.step)
        items = node.held_items
        if not items:
            held = None
        elif node.keep_list:
            held = tuple(outs[k] for k in items)
        else:
            held = outs[items[0]]
        if node.into is not None:  # counted in the operand's bytes, as the schedule counts it
            x = node.operands[node.into][0]
            self.ledger.hand_over(x, name)
            self._live[x] = Overwritten(self._op, name)
            self.in_place_ops += 1
            if held is not None:
                self._live[name] = held
        elif held is not None and spot is None:
            held_items = held if node.keep_list else (held,)
            if _aliases(held_items, ins):
                raise PlanError(f"{self._what}: the op's output aliases an operand")
            self._hold(name, held, sum(o.nbytes for o in held_items) if node.keep_list else held.nbytes)
        elif held is not None:  # counted as a new tensor, as the schedule does; the operand's bytes go at its free
            self._hold(name, held, held.nbytes)
        if first and node.aux_items:
            aux_out = tuple(outs[k] for k in node.aux_items)
            self._hold(f"{name}.aux", aux_out, sum(a.nbytes for a in aux_out))
        # a dropped output written into its operand is in the operand's bytes: counted there, not here
        into_dropped = {0} if node.into is not None and held is None else set()
        dropped = aten_call.dropped_among(outs, node.kept | into_dropped) if len(outs) > 1 or node.multi_out else 0
        if dropped:
            self.ledger.enter(dropped, node.drop_label)
            try:
                self._apply_updates(outs, updates, self.ledger)
            finally:
                self.ledger.leave(dropped)
        elif updates:  # nothing dropped: the gradients are held, counted as the node's output
            self._apply_updates(outs, updates, self.ledger)
        if node.into is not None and held is None:  # read by its updates, gone with them
            self.ledger.release(name)
        return held, outs

    def _into(self, name, node, ins, aux) -> list:
        """Run the node's op writing its output into operand `node.into`, which the schedule counts it in."""
        k = node.into
        x, t = node.operands[k][0], ins[k]
        if node.operands[k][1] is not None or not isinstance(t, Tensor) or not inplace.sole_owner(t):
            raise PlanError(f"{self._what}: cannot write into '{x}': another tensor shares its bytes")
        if t.nbytes != self.ledger.bytes_of(x) or any(
                j != k and isinstance(o, Tensor) and o.numel() and o.untyped_storage().data_ptr() ==
                t.untyped_storage().data_ptr() for j, o in enumerate(ins)):
            raise PlanError(f"{self._what}: cannot write into '{x}': another operand shares its bytes")
        if self.store.writing(x):  # never for a tensor with a fixed life; a page-out would be reading it
            self._waited(lambda: self.store.wait(x))
        outs = aten_call.run(node.into_call, ins, aux, self.seed, self.step)
        if outs[0] is not t and (not isinstance(outs[0], Tensor) or outs[0].data_ptr() != t.data_ptr()):
            raise PlanError(f"{self._what}: {node.into_call.op} did not write into '{x}'")
        return outs

    @staticmethod
    def _apply_updates(outs: list, updates, ledger=None) -> None:
        """Each update reads its output item; a parameter's gradient nothing else holds dies with its update. The
        ledger holds the update's parameter-sized temporaries while it runs (runtime/python/update_memory.py)."""
        for u in updates:
            value = outs[u.item]
            if u.view is not None:
                value = aten_call.view_of(value, u.view)
            if u.buffer is not None:
                u.buffer.copy_(value)
                continue
            in_place = u.may_scratch and (inplace.sole_owner(value) if u.view is None
                                          else inplace.whole_view_owner(value))
            temporaries = u.temporaries[in_place] * value.nbytes if ledger is not None else 0
            if temporaries:
                ledger.enter(temporaries, u.label)
            try:
                u.apply(value, in_place)
            finally:
                if temporaries:
                    ledger.leave(temporaries)
