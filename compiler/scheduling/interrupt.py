"""Ctrl-C during a compile's solves: the first stops them and the compile goes on with the best schedule found
(validated as usual); a second one, or one outside the solves (tracing, writing), aborts the compile as
KeyboardInterrupt does.

The solvers run in C and do not return to Python while they search, and Python runs a signal handler only
between bytecodes of the main thread: a solve in the main thread would hear Ctrl-C when it ends (minutes later at
a large --time-limit). So each solve runs in a thread (`run`) while the main thread waits for it, where the
handler runs at once. A stop asks the solver to end (HiGHS's interrupt callback, Gurobi's terminate, CP-SAT's
StopSearch) and waits at most GRACE_S for it: a solver still busy then (HiGHS checks its callback between nodes,
not inside its root LP or heuristics, which take seconds on a large model; scipy cannot be asked at all) is left
to end by itself, and the solve returns what the solver had handed over before (HiGHS's improving solutions).
"""
from __future__ import annotations

import atexit
import contextlib
import signal
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from . import clock

GRACE_S = 0.5  # after a stop, how long a solve is waited for before it is left to end alone
POLL_S = 0.05  # how often the waiting main thread looks for a stop
SETTLE_S = 30.0  # how long a new solve (or the interpreter's exit) waits for solvers left running

T = TypeVar("T")
_left_running: list[threading.Thread] = []


@contextlib.contextmanager
def stoppable():
    """Within: the first SIGINT stops the compile's solves (clock.stop) and the compile goes on; a second raises
    KeyboardInterrupt. Unchanged outside a compile, off the main thread, or where the program set its own handler."""
    c = clock.current()
    if (c is None or threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return

    def on_sigint(signum, frame):
        if c.stopped:
            raise KeyboardInterrupt
        c.stopped = True

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def run(work: Callable[[], T], stop: Callable[[], None] | None, grace: float | None = GRACE_S) -> tuple[bool, T | None]:
    """`work()` (a solver's blocking call) in a thread, the main thread waiting; on a stop, `stop()` (what asks the
    solver to end; None: it cannot be asked) and at most `grace` seconds more (None: until it ends). (True, its
    value) when it returned; (False, None) when it is left running. Off the main thread (no signal reaches it)
    `work()` runs there."""
    if threading.current_thread() is not threading.main_thread() or clock.current() is None:
        return True, work()
    box: dict = {}

    def target():
        try:
            box["value"] = work()
        except BaseException as e:  # handed to the caller below
            box["error"] = e

    t = threading.Thread(target=target, name="edgetrain-solve", daemon=True)
    t.start()
    asked = None
    try:
        while t.is_alive():
            t.join(POLL_S)
            if asked is None and clock.stopped():
                if stop is not None:
                    stop()
                asked = time.monotonic()
            if asked is not None and grace is not None and t.is_alive() and time.monotonic() - asked >= grace:
                _left_running.append(t)
                return False, None
    except KeyboardInterrupt:  # a second Ctrl-C: abort now; the solver is asked to end and left to it
        if stop is not None:
            stop()
        _left_running.append(t)
        raise
    if "error" in box:
        raise box["error"]
    return True, box["value"]


def solvers_running() -> bool:
    """Whether a solve left running after a stop is still running (the process should not wait for it)."""
    _left_running[:] = [t for t in _left_running if t.is_alive()]
    return bool(_left_running)


def settle(seconds: float = SETTLE_S) -> None:
    """Wait for the solves left running (each was asked to end) before a new one shares their solver's threads."""
    end = time.monotonic() + seconds
    for t in list(_left_running):
        t.join(max(end - time.monotonic(), 0.0))
    solvers_running()


atexit.register(settle)  # a solver's C++ threads must not outlive the interpreter's teardown
