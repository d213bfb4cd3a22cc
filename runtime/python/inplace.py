"""Elementwise ops run in place: where the schedule counts it (`into=`), and where the plan frees the operand next.

Counted (`COUNTED`): a node whose graph says its output takes a dying operand's bytes (`attrs["into"]`,
compiler/graph/inplace.py) runs the op's variant that writes into that operand: its out= overload (a structured
kernel: TensorIterator reads each element before it writes it, so an output that is exactly an input gives the
values the functional op gives) or, for relu, whose out= overload allocates, its in-place twin; and the two ops a
gradient is accumulated with (addmm, index_put with accumulate), which read only their own element of the
operand they add into. The ledger
counts the output in the operand's bytes, as the schedule does; a node that cannot run so fails, naming why.

Opportunistic (below):

A plan marks a node's operands that it frees right after the node's op, nothing in between (`attrs["dying"]`,
operand indices; `codegen/python_plan.py`). Where the op has an in-place twin that runs the same kernel
(`relu_` is `clamp_min_`, `add_` is `add`'s), the runtime writes the output into the dying operand's storage, as
eager PyTorch does for `nn.ReLU(inplace=True)`: the values are bitwise those of the out-of-place op (the same
TensorIterator kernel; `a + b` and `b + a` are the same IEEE sum), and no fresh output is allocated and written.

The memory model does not change: the ledger counts the output as a new tensor and releases the operand at its
free, as the schedule predicts, while the process holds one tensor less until that free (docs/memory-model.md).
The runtime refuses any read of the overwritten operand before its free (`Runtime` marks it), so a plan that
reads it again fails naming it instead of reading the output's values.
"""
from __future__ import annotations

import torch
from torch import Tensor

from . import update_memory

# out-of-place op -> its in-place twin (same structured kernel, same arguments)
INPLACE = {
    "aten.relu.default": "aten.relu_.default",
    "aten.hardtanh.default": "aten.hardtanh_.default",
    "aten.leaky_relu.default": "aten.leaky_relu_.default",
    "aten.hardswish.default": "aten.hardswish_.default",
    "aten.silu.default": "aten.silu_.default",
    "aten.sigmoid.default": "aten.sigmoid_.default",
    "aten.tanh.default": "aten.tanh_.default",
    "aten.add.Tensor": "aten.add_.Tensor",
    "aten.mul.Tensor": "aten.mul_.Tensor",
}
# binary ops whose operands may swap (without alpha): the in-place twin writes into its first argument
COMMUTATIVE = frozenset({"aten.add.Tensor", "aten.mul.Tensor"})

# functional op -> the op that updates those buffers in place (eager's batch norm), and for each output that
# is a buffer's new value, the argument holding that buffer
BUFFER_UPDATES = {
    "aten._native_batch_norm_legit_functional.default": ("aten._native_batch_norm_legit.default", {3: 3, 4: 4}),
}

# op -> (the overload that writes its output into an operand, the keyword naming that operand: None where it
# writes into its first argument), and the arguments (by position) it may write into. Checked against the
# functional op bit for bit in tests/test_runtime_inplace.py.
_GRAD = "grad_input"
COUNTED: dict[str, tuple[str, str | None, tuple[int, ...]]] = {
    "aten.relu.default": ("aten.relu_.default", None, (0,)),  # relu.out has no kernel of its own
    "aten.hardtanh.default": ("aten.hardtanh.out", "out", (0,)),
    "aten.leaky_relu.default": ("aten.leaky_relu.out", "out", (0,)),
    "aten.hardswish.default": ("aten.hardswish.out", "out", (0,)),
    "aten.hardsigmoid.default": ("aten.hardsigmoid.out", "out", (0,)),
    "aten.silu.default": ("aten.silu.out", "out", (0,)),
    "aten.sigmoid.default": ("aten.sigmoid.out", "out", (0,)),
    "aten.tanh.default": ("aten.tanh.out", "out", (0,)),
    "aten.gelu.default": ("aten.gelu.out", "out", (0,)),
    "aten.add.Tensor": ("aten.add.out", "out", (0, 1)),
    "aten.sub.Tensor": ("aten.sub.out", "out", (0, 1)),
    "aten.mul.Tensor": ("aten.mul.out", "out", (0, 1)),
    "aten.div.Tensor": ("aten.div.out", "out", (0, 1)),
    "aten.threshold_backward.default": ("aten.threshold_backward.grad_input", _GRAD, (0, 1)),
    "aten.hardtanh_backward.default": ("aten.hardtanh_backward.grad_input", _GRAD, (0, 1)),
    "aten.leaky_relu_backward.default": ("aten.leaky_relu_backward.grad_input", _GRAD, (0, 1)),
    "aten.hardsigmoid_backward.default": ("aten.hardsigmoid_backward.grad_input", _GRAD, (0, 1)),
    "aten.sigmoid_backward.default": ("aten.sigmoid_backward.grad_input", _GRAD, (0, 1)),
    "aten.tanh_backward.default": ("aten.tanh_backward.grad_input", _GRAD, (0, 1)),
    "aten.silu_backward.default": ("aten.silu_backward.grad_input", _GRAD, (0, 1)),
    "aten.gelu_backward.default": ("aten.gelu_backward.grad_input", _GRAD, (0, 1)),
    # A gradient accumulated into (a chunked head's weight gradient, a tied embedding's rows scattered into it):
    # addmm's out= copies nothing when out is self, then runs the same GEMM with beta; index_put is index_put_
    # on a clone.
    "aten.addmm.default": ("aten.addmm.out", "out", (0,)),
    "aten.index_put.default": ("aten.index_put_.default", None, (0,)),
}
IN_PLACE_ARGS = {op: spec[2] for op, spec in COUNTED.items()}  # what the compiler's graph pass reads


def counted_attrs(op: str, attrs: dict) -> tuple[str, dict]:
    """The overload and attrs of node `op` writing into its operand `attrs["into"]` (at an argument `COUNTED`
    allows). ValueError where it does not."""
    if op not in COUNTED:
        raise ValueError(f"{op} has no kernel here that writes its output into an operand")
    variant, keyword, positions = COUNTED[op]
    k, args = attrs["into"], attrs.get("args", [])
    at = [j for j in positions if j < len(args) and args[j] == {"$t": k}]
    if not at:
        raise ValueError(f"{op} writes into its argument {' or '.join(map(str, positions))}, and operand {k} is "
                         "not one of them as it is")
    if keyword is None:
        if at[0] != 0:
            raise ValueError(f"{variant} writes into its first argument only")
        return variant, attrs
    return variant, dict(attrs, kwargs={**(attrs.get("kwargs") or {}), keyword: {"$t": k}})


_use_count = getattr(torch._C, "_storage_Use_Count", None)


def updates_buffers_in_place(op: str, attrs: dict) -> bool:
    """Whether a first computation of `op` may run the variant that updates the buffers itself: each of the
    node's updates writes output item k into the buffer that argument k of the map passes as it is. The
    functional op runs that same kernel on clones of the buffers, and the node copies the clones back."""
    spec = BUFFER_UPDATES.get(op)
    if spec is None or attrs.get("then"):
        return False
    args, items = attrs.get("args", []), spec[1]
    updates = attrs.get("updates", ())
    if len(updates) != len(items):
        return False
    for u in updates:
        k = items.get(u.get("item"))
        if k is None or "buffer" not in u or u.get("view") or k >= len(args):
            return False
        a = args[k]
        if not (isinstance(a, dict) and a.get("$b") == u["buffer"] and not a.get("view")):
            return False
    return True


def _dense(t: Tensor) -> bool:
    return t.is_contiguous() or (t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last))


def sole_owner(t: Tensor) -> bool:
    """No other tensor (a view, a parameter, a page being written) shares the operand's storage: the tensor
    itself and its storage's Python object are its only users."""
    if _use_count is None:
        return False
    s = t.untyped_storage()
    return _use_count(s._cdata) <= 2 and s.nbytes() == t.numel() * t.element_size()


def whole_view_owner(v: Tensor) -> bool:
    """`v`, a view of one other tensor, is all of its storage, densely (the transposes of a transpose): it and that
    tensor are the storage's only users, so writing into `v` changes nothing anyone else reads."""
    if _use_count is None or not update_memory.dense_whole(v):
        return False
    return _use_count(v.untyped_storage()._cdata) <= 3


def plan(op: str, attrs: dict, ins: list, plain: list[bool]) -> tuple[int, list] | None:
    """(operand index, argument template with that operand first) where `op` may write into a dying operand,
    or None. `plain[k]`: operand k is a resident tensor as it is (not seen through a view)."""
    dying = attrs.get("dying")
    if not dying or op not in INPLACE or attrs.get("then") or attrs.get("keep") is not None:
        return None
    args = attrs.get("args", [])
    if not args or not isinstance(args[0], dict) or "$t" not in args[0]:
        return None
    first = args[0]["$t"]
    refs = [a["$t"] for a in args if isinstance(a, dict) and "$t" in a]
    if any(not isinstance(r, int) or not 0 <= r < len(ins) for r in refs):  # the op's own call names the error
        return None
    if op in COMMUTATIVE:
        if attrs.get("kwargs") or len(args) != 2 or len(refs) != 2 or refs[0] == refs[1]:
            return None
        other_k = refs[1]
        k = first if first in dying else other_k if other_k in dying else None
        if k is None or not plain[k]:
            return None
        t, other = ins[k], ins[other_k if k == first else first]
        if not (isinstance(other, Tensor) and other.shape == t.shape and other.dtype == t.dtype
                and other.stride() == t.stride() and other.device == t.device):
            return None
        template = args if k == first else [args[1], args[0]]
    else:
        k = first
        if k not in dying or refs.count(k) != 1 or not plain[k]:
            return None
        t = ins[k]
        template = args
    if not (isinstance(t, Tensor) and t.numel() and t.is_floating_point() and _dense(t) and sole_owner(t)):
        return None
    ptr = t.untyped_storage().data_ptr()
    if any(isinstance(o, Tensor) and j != k and o.numel() and o.untyped_storage().data_ptr() == ptr
           for j, o in enumerate(ins)):  # another operand on the same bytes
        return None
    return k, template
