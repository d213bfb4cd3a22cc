"""Budgets and deadlines: their syntax, and the figures of a model every budget is relative to.

Budget: an absolute size for the whole RAM the step may use (`2MB`, `512KiB`, `1.5GB`, `300000` bytes),
`B%`: the fixed state plus B% of store-all's (plain backprop's) activation peak, or `min`: the smallest
feasible budget, or `auto`: a microcontroller's RAM less what its firmware needs besides the training state
(stack, runtime statics), given by the compile driver for the target. The fixed state is what no schedule can avoid: parameters, optimizer state, buffers, and
the gradients of the largest layer, which fused SGD holds while it applies them (the other layers' gradients
never exist at the same time). The activation peak is the most store-all holds at once besides the state and
the running node's workspace. So 100% always fits store-all, and 0% is below any feasible budget.
Deadline: a multiple of the store-all time (`1.2`), or seconds (`0.5s`, `20ms`).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from edgetrain.compiler.errors import BudgetError
from edgetrain.compiler.graph.ir import TrainingGraph
from edgetrain.compiler.graph.liveness import Liveness

from .heuristics import store_all
from .steps import build_steps
from .validator import Report, validate

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def min_budget(lv: Liveness) -> int:
    """The smallest budget any schedule can meet: each backward stage must hold what its node reads.

    With paging it is attained (store everything, page in what each stage reads, free it at once).
    """
    need = max(lv.static[t] for t in range(lv.B0))
    for t in range(lv.B0, lv.T):
        need = max(need, lv.static[t] + sum(lv.size[i] for i in lv.needs[t]))
    return need


@dataclass(frozen=True)
class Anchors:
    """What a budget is relative to: the fixed state, store-all's activation peak, the smallest feasible budget,
    and store-all's own schedule as the validator counts it (its peak, time and energy)."""

    fixed_bytes: int
    activation_peak_bytes: int
    min_feasible_bytes: int
    store_all: Report


def anchors(g: TrainingGraph, lv: Liveness, target) -> Anchors:
    sa = validate(g, build_steps(g, lv, store_all(g, lv)), target, None)
    peak = max(p - g.nodes[t].workspace_bytes for t, p in enumerate(sa.stage_peaks)) - lv.state_bytes
    return Anchors(fixed_bytes=lv.fixed_bytes, activation_peak_bytes=peak, min_feasible_bytes=min_budget(lv),
                   store_all=sa)


@dataclass(frozen=True)
class Budget:
    text: str
    percent: float | None = None
    nbytes: int | None = None
    smallest: bool = False  # `min`
    device: bool = False  # `auto`: what the target's RAM leaves for training

    def resolve(self, a: Anchors, device_bytes: int | None = None) -> int:
        """Bytes for this budget; `device_bytes` is what `auto` means on the target (None: it has no such figure)."""
        if self.device:
            if device_bytes is None:
                raise BudgetError("--budget auto (the default) takes a microcontroller target's RAM; for this "
                                  "target give --budget: a size (2MB), a percentage of store-all's activations "
                                  "(40%) or min")
            return device_bytes
        if self.smallest:
            return a.min_feasible_bytes
        if self.nbytes is not None:
            return self.nbytes
        assert self.percent is not None
        return int(a.fixed_bytes + self.percent / 100.0 * a.activation_peak_bytes)


def parse_budget(text: str) -> Budget:
    s = str(text).strip()
    if s.lower() == "min":
        return Budget(text="min", smallest=True)
    if s.lower() == "auto":
        return Budget(text="auto", device=True)
    if s.endswith("%"):
        try:
            p = float(s[:-1])
        except ValueError:
            raise BudgetError(f"budget {text!r}: a percentage must be a number, like 40%") from None
        if not 0 <= p <= 1000:
            raise BudgetError(f"budget {text!r}: the percentage must be between 0% and 1000%")
        return Budget(text=s, percent=p)
    m = _SIZE.match(s)
    if not m or m.group(2).lower() not in _UNITS:
        raise BudgetError(f"budget {text!r} is not understood; write a size like 2MB, 512KiB, 1.5GB or 300000, "
                          "a percentage like 40%, min (the smallest feasible budget) or auto (a microcontroller's RAM)")
    n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n <= 0:
        raise BudgetError(f"budget {text!r} must be positive")
    return Budget(text=s, nbytes=n)


def parse_deadline(text: str | None, store_all_time_s: float) -> float | None:
    if text is None:
        return None
    s = str(text).strip().lower()
    try:
        if s.endswith("ms"):
            seconds = float(s[:-2]) / 1e3
        elif s.endswith("s"):
            seconds = float(s[:-1])
        else:
            seconds = None
            f = float(s)
    except ValueError:
        raise BudgetError(f"deadline {text!r} is not understood; write a multiple of the store-all time (1.2) "
                          "or seconds (0.5s, 20ms)") from None
    if seconds is not None:
        if not math.isfinite(seconds) or seconds <= 0:
            raise BudgetError(f"deadline {text!r}: a time in seconds must be a positive, finite number")
        return seconds
    if not math.isfinite(f) or f < 1.0:
        raise BudgetError(f"deadline {text!r}: a multiple of the store-all time must be a finite number of at least 1.0")
    return f * store_all_time_s
