"""Budgets and deadlines: their syntax, and the figures of a model every budget is relative to.

Budget: an absolute size for the whole RAM the step may use (`2MB`, `512KiB`, `1.5GB`, `300000` bytes),
`B%`: B% of store-all's (plain backprop's) predicted peak, so `100%` is exactly what plain backprop needs and
`50%` half of it, or `min`: the smallest feasible budget, or `auto`: a microcontroller's RAM less what its
firmware needs besides the training state (stack, runtime statics), given by the compile driver for the target.
A percentage below the smallest feasible budget is refused (`check_feasible`), naming that budget in bytes and
in percent. The fixed state is what no schedule can avoid: parameters, optimizer state, buffers, and the
gradients of the largest layer, which fused SGD holds while it applies them (the other layers' gradients never
exist at the same time); the activation peak is the most store-all holds at once besides them and the running
node's workspace (both reported, neither is what a percentage is of).
Deadline: a multiple of the store-all time (`1.2`), or seconds (`0.5s`, `20ms`).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from edgetrain.compiler.errors import BudgetError, DeviceFitError
from edgetrain.compiler.graph.ir import TrainingGraph
from edgetrain.compiler.graph.liveness import Liveness

from .bound import bound_text
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
    """What a budget is relative to: store-all's peak (what `100%` is), the fixed state, store-all's activation
    peak, the smallest feasible budget, and store-all's own schedule as the validator counts it (its peak, time
    and energy)."""

    fixed_bytes: int
    activation_peak_bytes: int
    min_feasible_bytes: int
    store_all: Report | None
    store_all_peak_bytes: int = 0

    def percent_of_store_all(self, nbytes: int) -> float:
        """`nbytes` as the `B%` that names it."""
        return 100.0 * nbytes / self.store_all_peak_bytes if self.store_all_peak_bytes else math.inf


def anchors(g: TrainingGraph, lv: Liveness, target) -> Anchors:
    sa = validate(g, build_steps(g, lv, store_all(g, lv)), target, None)
    peak = max(p - g.nodes[t].transient_bytes for t, p in enumerate(sa.stage_peaks)) - lv.state_bytes
    return Anchors(fixed_bytes=lv.fixed_bytes, activation_peak_bytes=peak, min_feasible_bytes=min_budget(lv),
                   store_all=sa, store_all_peak_bytes=sa.peak_bytes)


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
                                  "target give --budget: a size (2MB), a percentage of plain backprop's peak "
                                  "(80%) or min")
            return device_bytes
        if self.smallest:
            return a.min_feasible_bytes
        if self.nbytes is not None:
            return self.nbytes
        assert self.percent is not None
        return math.floor(self.percent * a.store_all_peak_bytes / 100.0)  # 100%: store-all's peak exactly


def smallest_percent(a: Anchors) -> float:
    """The smallest whole-tenth percentage that resolves to a feasible budget."""
    p = math.ceil(10.0 * a.percent_of_store_all(a.min_feasible_bytes)) / 10.0
    while math.floor(p * a.store_all_peak_bytes / 100.0) < a.min_feasible_bytes:
        p = round(p + 0.1, 1)  # float rounding of the product; one more tenth is enough
    return p


def check_feasible(budget: "Budget", budget_bytes: int, a: Anchors, graph: TrainingGraph | None = None) -> None:
    """Refuse a budget below the smallest feasible one, in bytes and as a percentage of plain backprop's peak
    (with `graph`: and which op's working set bounds it)."""
    if budget_bytes >= a.min_feasible_bytes:
        return
    given = f"budget {budget.text} = {budget_bytes} B"
    if budget.percent is None:
        given += f" ({a.percent_of_store_all(budget_bytes):.1f}% of plain backprop's peak)"
    raise BudgetError(
        f"{given} is below the smallest feasible budget for this model and batch: {a.min_feasible_bytes} B "
        f"({a.min_feasible_bytes / 1e6:.3f} MB), {a.percent_of_store_all(a.min_feasible_bytes):.1f}% of plain "
        f"backprop's peak of {a.store_all_peak_bytes} B ({a.store_all_peak_bytes / 1e6:.3f} MB; 100% = plain "
        f"backprop). Give --budget {smallest_percent(a):g}% or more (at least {a.min_feasible_bytes}B, or "
        f"--budget min), or lower --batch-size, or freeze layers with --train."
        + (f" {bound_text(graph)}" if graph is not None else ""))


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
            raise BudgetError(f"budget {text!r}: a percentage must be a number, like 80%") from None
        if not 0 <= p <= 1000:
            raise BudgetError(f"budget {text!r}: the percentage must be between 0% and 1000%")
        return Budget(text=s, percent=p)
    m = _SIZE.match(s)
    if not m or m.group(2).lower() not in _UNITS:
        raise BudgetError(f"budget {text!r} is not understood; write a size like 2MB, 512KiB, 1.5GB or 300000, "
                          "a percentage of plain backprop's peak like 80%, min (the smallest feasible budget) or auto (a microcontroller's RAM)")
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



def device_memory_bytes(target) -> int | None:
    """The memory a plan's training step may use on `target`: its RAM (a Jetson's memory shared by CPU and GPU; the
    host's measured when its profile loads), from the target's profile. None for a microcontroller: its firmware
    is held against RAM and flash by codegen/c/device_fit.py, with the stack and runtime it needs, and a Python
    plan for its profile is a study of its costs that no such device runs."""
    return None if target.family == "mcu" else int(target.ram_bytes)


def _at_most(room: int) -> str:
    """A --budget no larger than `room` bytes, as a user would type it."""
    return f"{room // 10**6}MB" if room >= 10**7 else str(room)


def _mb(n: int) -> str:
    return f"{n} B ({n / 1e6:.3f} MB)"


def check_budget_size(budget: Budget, target) -> None:
    """Before tracing: a budget given in bytes that the device's memory cannot hold."""
    room = device_memory_bytes(target)
    if room is not None and budget.nbytes is not None and budget.nbytes > room:
        raise DeviceFitError(f"budget {budget.text} = {_mb(budget.nbytes)} is more than {target.name}'s memory, "
                             f"{_mb(room)}. Give --budget {_at_most(room)} or less, a percentage of plain "
                             f"backprop's peak (80%) or min.")


def budget_for_device(budget: Budget, a: Anchors, graph: TrainingGraph, target,
                      device_bytes: int | None = None) -> int:
    """The bytes of `budget` for this model on `target`, checked before any solve: the model's fixed state and its
    smallest feasible budget must fit the device's memory, the budget must too, and it must be feasible.
    `device_bytes`: what `auto` means on the target (see Budget.resolve)."""
    room, name = device_memory_bytes(target), target.name
    if room is None:
        budget_bytes = budget.resolve(a, device_bytes)
        check_feasible(budget, budget_bytes, a, graph)
        return budget_bytes
    state = graph.state_bytes
    if state > room:
        raise DeviceFitError(
            f"the model's fixed state is {_mb(state)} (weights {graph.param_bytes} B, optimizer state "
            f"{graph.optimizer_bytes} B, buffers {graph.buffer_bytes} B), more than {name}'s memory, {_mb(room)}, "
            "before any activation. Use a smaller model, freeze layers with --train, or an optimizer with less "
            "state (sgd without momentum keeps none).")
    if a.min_feasible_bytes > room:
        raise DeviceFitError(
            f"the model needs at least {_mb(a.min_feasible_bytes)} to train (its smallest feasible budget: the "
            f"fixed state, {_mb(a.fixed_bytes)}, then what the largest backward step reads), more than {name}'s "
            f"memory, {_mb(room)}. Lower --batch-size, freeze layers with --train, or use a smaller model. "
            f"{bound_text(graph)}")
    budget_bytes = budget.resolve(a, device_bytes)
    if budget_bytes > room:
        most = math.floor(10.0 * a.percent_of_store_all(room)) / 10.0
        raise DeviceFitError(
            f"budget {budget.text} = {_mb(budget_bytes)} is more than {name}'s memory, {_mb(room)}. Give at most "
            f"{_at_most(room)} ({most:g}% of plain backprop's peak of {_mb(a.store_all_peak_bytes)}), or min.")
    check_feasible(budget, budget_bytes, a, graph)
    return budget_bytes
