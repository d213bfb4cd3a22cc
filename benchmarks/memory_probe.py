"""Real memory of a running step: the process's high-water growth (CPU) or the allocator's peak (CUDA).

CPU: Linux keeps a resident-set high-water mark (VmHWM in /proc/self/status) that writing "5" to
/proc/self/clear_refs resets to the current resident set, so the growth over a span is VmHWM after minus
VmRSS before, to the page but for the kernel's per-CPU counting: the mark is taken from the folded total,
which lags by up to max(32, 2 x CPUs) pages per CPU the process ran on (pin it to one CPU for the least
lag). glibc malloc would blur it: a freed chunk stays mapped in its arena, and its
mmap threshold grows with every large free, so later blocks land in kept heap memory. `isolate_malloc`
fixes the threshold (every block of a page or more is its own mapping, unmapped at its free) and trims the
heap at every free, so resident memory follows the bytes torch holds. It is for measuring only, and it tells
the runtime not to set its own thresholds (which keep freed memory for the next step) over these.

CUDA: torch's caching allocator counts what it hands out; `torch.cuda.max_memory_allocated` after
`reset_peak_memory_stats` is the peak of that, which the same span arithmetic turns into a growth.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch

from edgetrain.runtime.python.heap import M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, OPT_OUT

ISOLATED_MMAP_THRESHOLD = 4096


def _libc():
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name else None


def isolate_malloc() -> bool:
    """Make freed blocks of a page or more go back to the kernel at once (glibc only). False where that cannot
    be set (another C library): growth measured there may then be hidden by reused freed memory."""
    os.environ[OPT_OUT] = "1"  # a Runtime built later in this process keeps these settings
    libc = _libc()
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    ok = libc.mallopt(M_MMAP_THRESHOLD, ISOLATED_MMAP_THRESHOLD) == 1
    ok = libc.mallopt(M_TRIM_THRESHOLD, 0) == 1 and ok
    if hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
    return ok


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"/proc/self/status has no {field}")


def cpu_probe_available() -> bool:
    """Linux with a resettable high-water mark."""
    try:
        _status_kib("VmHWM")
        return os.access("/proc/self/clear_refs", os.W_OK)
    except OSError:
        return False


@dataclass
class Span:
    """A measured span: the resident (or allocated) bytes at its start and the most at any point in it."""

    start: int
    peak: int

    @property
    def growth(self) -> int:
        return max(self.peak - self.start, 0)


class Probe:
    """Start a span, run something, read its peak. `device` "cpu" reads the process's resident set; a CUDA
    device reads the caching allocator's counters on that device."""

    def __init__(self, device="cpu") -> None:
        self.device = torch.device(device)
        if self.device.type == "cpu" and not cpu_probe_available():
            raise OSError("the resident-set high-water mark needs Linux's /proc/self/clear_refs and VmHWM")

    def start(self) -> int:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return torch.cuda.memory_allocated(self.device)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _status_kib("VmRSS") * 1024

    def peak(self) -> int:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return torch.cuda.max_memory_allocated(self.device)
        return _status_kib("VmHWM") * 1024

    @contextmanager
    def span(self) -> Iterator[Span]:
        s = Span(self.start(), 0)
        try:
            yield s
        finally:
            s.peak = self.peak()
