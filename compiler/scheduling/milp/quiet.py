"""Solver libraries that print on the C stdout (HiGHS's banner, Gurobi's "Interrupt request received"): kept off
it, which `--json` keeps for its one object."""
from __future__ import annotations

import contextlib
import os
import sys


@contextlib.contextmanager
def quiet_stdout():
    """File descriptor 1 points at /dev/null inside (C code writes there directly, past sys.stdout)."""
    sys.stdout.flush()
    saved = os.dup(1)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 1)
    try:
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
