"""Budget and deadline syntax.

Budget: an absolute size for the whole RAM the step may use (`2MB`, `512KiB`, `1.5GB`, `300000` bytes), or
`B%`: the fixed state plus B% of store-all's (plain backprop's) activation peak. The fixed state is what
no schedule can avoid: parameters, optimizer state, buffers, and the gradients of the largest layer, which
fused SGD holds while it applies them (the other layers' gradients never exist at the same time). The
activation peak is the most store-all holds at once besides the state and the running node's workspace.
So 100% always fits store-all, and 0% is below any feasible budget.
Deadline: a multiple of the store-all time (`1.2`), or seconds (`0.5s`, `20ms`).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from edgetrain.compiler.errors import BudgetError

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


@dataclass(frozen=True)
class Budget:
    text: str
    percent: float | None = None
    nbytes: int | None = None

    def resolve(self, fixed_bytes: int, activation_peak_bytes: int) -> int:
        if self.nbytes is not None:
            return self.nbytes
        assert self.percent is not None
        return int(fixed_bytes + self.percent / 100.0 * activation_peak_bytes)


def parse_budget(text: str) -> Budget:
    s = str(text).strip()
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
                          "or a percentage like 40%")
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
