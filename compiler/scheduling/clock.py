"""One compile's deadline: `--time-limit` bounds the whole compile, not each solve in it.

The compile sets it once (`deadline(seconds)`, from the start: capture counts); every solve asks `clamp` for its
own limit (what it wanted, at most what is left), and the greedy loops ask `expired`. Scoped to the compile's
context: a solve outside one (a sweep's worker, a benchmark) runs for the limit it was given.
"""
from __future__ import annotations

import contextlib
import contextvars
import time

MIN_SOLVE_S = 1.0  # a solve that starts at or past the deadline still gets this long (or less, if it asked less)

_END: contextvars.ContextVar[float | None] = contextvars.ContextVar("edgetrain_deadline", default=None)


@contextlib.contextmanager
def deadline(seconds: float):
    """Everything inside must finish within `seconds` from now."""
    token = _END.set(time.monotonic() + float(seconds))
    try:
        yield
    finally:
        _END.reset(token)


def left() -> float | None:
    """Seconds to the deadline (negative past it); None outside a compile."""
    end = _END.get()
    return None if end is None else end - time.monotonic()


def clamp(seconds: float) -> float:
    """A solve's limit: `seconds`, at most what is left, and at least MIN_SOLVE_S (when it asked that much)."""
    rest = left()
    if rest is None:
        return seconds
    return max(min(seconds, rest), min(seconds, MIN_SOLVE_S))


def expired() -> bool:
    rest = left()
    return rest is not None and rest <= 0
