"""An optimizer update's own memory: the parameter-sized temporaries it allocates while it runs.

One rule for the compiler's memory model and the runtime's ledger (docs/memory-model.md, "Optimizer updates"):

- a gradient takes the weight decay in place when the node does not hold it, no other update reads it, and
  it is all of its storage densely from offset 0 (as it is, or through a view such as the transpose of a
  transpose); the runtime also checks that no other tensor shares its storage (`inplace.sole_owner`);
- otherwise an update with a non-decoupled weight decay allocates `grad + wd * param`, and the optimizers
  whose step divides by a square root (Adam's `denom`, Adagrad's `std`) allocate that too: each unit's
  `temporaries` says how many are live at once.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from .aten_call import view_of
from .optimizers import unit_of


def takes_decay_in_place(item: int, kept, readers: int) -> bool:
    """The static part of the rule: output `item` is a gradient the node does not hold (`kept`: the items it
    holds or keeps as aux) and `readers` updates read (only its own may write into it)."""
    return item not in kept and readers == 1


def dense_whole(v: Tensor) -> bool:
    """`v` is all of its storage, densely from offset 0: writing into it writes every byte it owns and no other.
    On a meta tensor: what a fresh output seen through the same view is."""
    return v.is_contiguous() and not v.storage_offset() and \
        v.untyped_storage().nbytes() == v.numel() * v.element_size()


def temporary_bytes(config: Mapping[str, Any], in_place: bool, grad_bytes: int) -> int:
    """Bytes an update of a parameter with a `grad_bytes` gradient allocates at its peak."""
    u = unit_of(config)
    return u.temporaries(u.settings(config), in_place) * grad_bytes


def planned_temporary_bytes(config: Mapping[str, Any], item: int, kept, readers: int, grad: Tensor,
                            view_steps) -> int:
    """What the compiler counts for one update: `grad` the output item (a fake or meta tensor of its shape and
    dtype), `view_steps` its prepared view chain (`aten_call.prepared_view`) or None."""
    v = torch.empty(tuple(grad.shape), dtype=grad.dtype, device="meta")
    if view_steps is not None:
        v = view_of(v, view_steps)
    in_place = takes_decay_in_place(item, kept, readers) and dense_whole(v)
    return temporary_bytes(config, in_place, v.numel() * v.element_size())
