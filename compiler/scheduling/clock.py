"""One compile's deadline: `--time-limit` bounds the whole compile, not each solve in it.

The compile sets it once (`deadline(seconds)`, from the start: capture counts); every solve asks `clamp` for its
own limit (what it wanted, at most what is left), and the greedy loops ask `expired`. The scheduler `reserve`s
its share first: a capture that took more than the rest of the limit moves the deadline so that the solve still
gets that share (a large model's trace would otherwise leave it a second). Scoped to the compile's
context: a solve outside one (a sweep's worker, a benchmark) runs for the limit it was given.

`stop()` (Ctrl-C during the solves, scheduling/interrupt.py) makes the deadline now: every solve and greedy loop
then ends with what it has, and no solve starts.
"""
from __future__ import annotations

import contextlib
import contextvars
import time
from dataclasses import dataclass

MIN_SOLVE_S = 1.0  # a solve that starts at or past the deadline still gets this long (or less, if it asked less)


@dataclass
class Clock:
    end: float  # time.monotonic() of the deadline
    stopped: bool = False  # the user stopped the solves: nothing more is solved


_NOW: contextvars.ContextVar[Clock | None] = contextvars.ContextVar("edgetrain_deadline", default=None)


@contextlib.contextmanager
def deadline(seconds: float):
    """Everything inside must finish within `seconds` from now."""
    token = _NOW.set(Clock(time.monotonic() + float(seconds)))
    try:
        yield
    finally:
        _NOW.reset(token)


def current() -> Clock | None:
    """The compile's clock (None outside a compile): what a signal handler or another thread holds on to."""
    return _NOW.get()


def stop() -> None:
    """The user asked to stop: the solves end with what they have found, and no more start."""
    c = _NOW.get()
    if c is not None:
        c.stopped = True


def stopped() -> bool:
    c = _NOW.get()
    return c is not None and c.stopped


def left() -> float | None:
    """Seconds to the deadline (negative past it, 0 once stopped); None outside a compile."""
    c = _NOW.get()
    if c is None:
        return None
    return min(c.end - time.monotonic(), 0.0) if c.stopped else c.end - time.monotonic()


def reserve(seconds: float) -> None:
    """The solves from now get at least `seconds`, the deadline moved later if need be (not once stopped)."""
    c = _NOW.get()
    if c is not None and not c.stopped:
        c.end = max(c.end, time.monotonic() + float(seconds))


def clamp(seconds: float) -> float:
    """A solve's limit: `seconds`, at most what is left, and at least MIN_SOLVE_S (when it asked that much);
    0 once stopped."""
    rest = left()
    if rest is None:
        return seconds
    if stopped():
        return 0.0
    return max(min(seconds, rest), min(seconds, MIN_SOLVE_S))


def expired() -> bool:
    rest = left()
    return rest is not None and rest <= 0
