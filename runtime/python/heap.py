"""The C heap a plan's steps allocate from: freed tensor memory kept for the next step, not handed back.

glibc serves a block above its mmap threshold with a fresh mapping and returns the heap's free top above its
trim threshold to the system; both start small and glibc raises them only on some frees. A plan step frees
and reallocates the same large activations every step, so with the defaults it page-faults tens of
thousands of pages back in per step (ResNet-18 at batch 8: about 22,000 per step, 0 for PyTorch's own step
in the same process), a tenth of the step or more. Fixed thresholds above any tensor the step holds let the
heap reuse that memory instead. The process's resident memory then stays at its high-water mark between
steps (the memory a step needs is the budget either way). Set EDGETRAIN_SYSTEM_MALLOC=1 to keep glibc's own
settings; on a C library other than glibc nothing changes.
"""
from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameter numbers
KEEP_BYTES = 1 << 30  # blocks up to this size come from (and go back to) the heap; the free top is kept up to it
OPT_OUT = "EDGETRAIN_SYSTEM_MALLOC"

_state: dict[str, bool] = {}


def keep_freed_memory() -> bool:
    """Set glibc's thresholds once per process (see the module's docstring); True where they are set."""
    if "kept" not in _state:
        _state["kept"] = _set_thresholds()
    return _state["kept"]


def _set_thresholds() -> bool:
    if os.environ.get(OPT_OUT, "") not in ("", "0") or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        if not hasattr(libc, "gnu_get_libc_version"):  # musl and others: their malloc has no such knobs
            return False
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, KEEP_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, KEEP_BYTES))
