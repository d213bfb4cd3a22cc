"""What one optimizer is to edgetrain: its settings, its state, its update and the torch.optim optimizer it matches."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from torch import Tensor

# The update of one parameter: called with (grad, grad_is_scratch) and grad mode off. `grad_is_scratch`: nothing
# reads the gradient after the update, so the update may write into it.
Update = Callable[[Tensor, bool], None]


@dataclass(frozen=True)
class OptimizerUnit:
    """One optimizer. Its settings are keyword arguments of `torch.optim.<torch_class>` under the same names, so
    the exactness reference is that class built with them (and foreach=False: single-tensor arithmetic)."""

    name: str  # what `--optimizer` takes
    torch_class: str  # the torch.optim class its update matches bit for bit
    defaults: Mapping[str, Any]  # every setting it takes, with the value a compile uses when none is given
    state: Callable[[Mapping[str, Any]], tuple[str, ...]]  # state tensors per trainable parameter, each its size
    flops: Callable[[Mapping[str, Any]], int]  # elementwise operations per parameter element of one update
    update: Callable[[Mapping[str, Any], Tensor, dict[str, Tensor]], Update]  # (settings, parameter, its state)
    step_counter: bool = False  # a 0-d float32 step count per parameter, as torch keeps one (4 bytes)
    # Parameter-sized temporaries the update holds at once at its peak, given whether the gradient takes the
    # weight decay in place (runtime/python/update_memory.py: the memory model and the ledger count them)
    temporaries: Callable[[Mapping[str, Any], bool], int] = lambda s, in_place: 0
    check: Callable[[Mapping[str, Any]], str | None] = lambda s: None  # settings torch would refuse, said plainly
    c_kernel: str | None = None  # runtime/c/kernels/<c_kernel>.c applies it in C firmware; None: C has none
    c_requires: Mapping[str, Any] = field(default_factory=dict)  # settings the C kernel has only at these values

    def __post_init__(self) -> None:
        object.__setattr__(self, "defaults", MappingProxyType(dict(self.defaults)))
        object.__setattr__(self, "c_requires", MappingProxyType(dict(self.c_requires)))

    def settings(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """The unit's settings from a config (a schedule's `optimizer`): each given value, else the default; a
        JSON list (betas) back to a tuple."""
        out = {}
        for k, v in self.defaults.items():
            given = config.get(k, v)
            out[k] = tuple(given) if isinstance(given, list) else given
        return out
