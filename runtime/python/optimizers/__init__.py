"""The optimizers a plan applies right after a parameter's gradient is complete, one unit each (`unit.py`).

Adding one: a module here with its OptimizerUnit, and its entry in OPTIMIZERS below. `--optimizer`'s choices,
the memory model's state bytes, the update's cost, the Python runtime's update, `run --check`'s torch.optim
reference and the C firmware's refusal all read the unit.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .adagrad import ADAGRAD
from .adam import ADAM, ADAMW
from .sgd import SGD
from .unit import OptimizerUnit, Update

OPTIMIZERS: dict[str, OptimizerUnit] = {u.name: u for u in (SGD, ADAM, ADAMW, ADAGRAD)}
DEFAULT = "sgd"  # a config without a name (a plan written by hand) is SGD's

__all__ = ["OPTIMIZERS", "DEFAULT", "OptimizerUnit", "Update", "unit_of", "state_names", "step_counter_bytes",
           "update_flops_per_element", "c_refusal"]


def unit_of(config: Mapping[str, Any]) -> OptimizerUnit:
    name = config.get("name", DEFAULT)
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")
    return OPTIMIZERS[name]


def state_names(config: Mapping[str, Any]) -> tuple[str, ...]:
    """The state tensors an optimizer keeps per trainable parameter (each the parameter's size)."""
    u = unit_of(config)
    return u.state(u.settings(config))


def step_counter_bytes(config: Mapping[str, Any]) -> int:
    """A per-parameter step count (Adam's, Adagrad's) is a 0-d float32 tensor."""
    return 4 if unit_of(config).step_counter else 0


def update_flops_per_element(config: Mapping[str, Any]) -> int:
    """Elementwise operations per parameter element of one update (the unit's arithmetic)."""
    u = unit_of(config)
    return u.flops(u.settings(config))


def c_refusal(config: Mapping[str, Any]) -> str | None:
    """Why C firmware cannot train with this optimizer (its unit has no C kernel, or a setting that kernel does
    not implement), naming what it can train with; None when it can."""
    u = unit_of(config)
    s = u.settings(config)
    off = [k for k, v in u.c_requires.items() if s[k] != v]
    if u.c_kernel is not None and not off:
        return None
    have = [w for w in OPTIMIZERS.values() if w.c_kernel is not None]
    kernels = ", ".join(w.torch_class + (f" ({', '.join(f'{k}={v}' for k, v in w.c_requires.items())})"
                                         if w.c_requires else "") for w in have)
    asked = u.name + "".join(f" with {k}={s[k]}" for k in off)
    return (f"the C runtime trains with {kernels}, not {asked}; use "
            f"{' or '.join(f'--optimizer {w.name}' for w in have)} or --emit python")
