"""Operand views: how a plan reads a tensor through a chain of zero-cost views.

A chain step is ["reshape", shape], ["narrow", dim, start, length], ["permute", dims] or ["item", k] (element
k of a tuple output). The compiler folds a reshape into an operand only where torch would make it a view, so
`copied` (bytes of a reshape that had to copy) stays 0 in a correct plan; the executor counts it anyway.
"""
from __future__ import annotations

from torch import Tensor


class ViewError(ValueError):
    pass


def apply_views(t, chain) -> tuple[Tensor, int]:
    """`t` (a tensor, or a tuple for "item") seen through `chain`; returns it and the bytes copied."""
    copied = 0
    for v in chain:
        kind = v[0]
        if kind == "item":
            if not isinstance(t, tuple):
                raise ViewError(f"item view {v!r} on a single tensor")
            t = t[int(v[1])]
            continue
        if isinstance(t, tuple):
            raise ViewError(f"view {v!r} on a tuple output needs an item view first")
        if kind == "reshape":
            try:
                t = t.view(tuple(v[1]))
            except RuntimeError:  # not expressible as a view of this layout: a real copy
                t = t.reshape(tuple(v[1]))
                copied += t.numel() * t.element_size()
        elif kind == "narrow":
            t = t.narrow(int(v[1]), int(v[2]), int(v[3]))
        elif kind == "permute":
            t = t.permute(*[int(d) for d in v[1]])
        else:
            raise ViewError(f"unknown view {v!r}")
    if isinstance(t, tuple):
        raise ViewError("a tuple output read without an item view")
    return t, copied
