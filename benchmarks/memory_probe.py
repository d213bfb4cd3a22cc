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


PAGE = 4096
BLOCK_OFFSET = 64  # a mapped block's data starts after glibc's header, on torch's 64-byte alignment


def mapped_bytes(nbytes: int) -> int:
    """The most resident memory a block of `nbytes` takes under `isolate_malloc`: its own mapping's pages, header
    included (a block of whole pages takes one page more); a block small enough for the heap, its bytes."""
    if nbytes + BLOCK_OFFSET < ISOLATED_MMAP_THRESHOLD:
        return nbytes
    return -(-(nbytes + BLOCK_OFFSET) // PAGE) * PAGE


def count_pages(ledger) -> None:
    """Make a runtime's ledger also keep `mapped_peak`: its peak with every tensor it holds counted as
    `mapped_bytes` (the page rounding `isolate_malloc` adds to the resident set, not the plan; a kernel's scratch,
    held as one figure, counted as it is). Measuring only."""
    cls = ledger.__class__

    class PageCounted(cls):
        def alloc(self, name, nbytes):
            super().alloc(name, nbytes)
            self._mapped[name] = mapped_bytes(int(nbytes))
            self._grow_mapped(self._mapped[name])

        def release(self, name):
            nbytes = super().release(name)
            self.mapped_live -= self._mapped.pop(name)
            return nbytes

        def hand_over(self, name, to):
            super().hand_over(name, to)
            self._mapped[to], self._mapped[name] = self._mapped[name], 0

        def enter(self, nbytes, label):
            super().enter(nbytes, label)
            self._grow_mapped(int(nbytes))

        def leave(self, nbytes):
            super().leave(nbytes)
            self.mapped_live -= int(nbytes)

        def reset_peak(self):
            super().reset_peak()
            self.mapped_peak = self.mapped_live

        def _grow_mapped(self, nbytes):
            self.mapped_live += nbytes
            self.mapped_peak = max(self.mapped_peak, self.mapped_live)

    ledger._mapped = {name: mapped_bytes(ledger.bytes_of(name)) for name in ledger.names()}
    ledger.mapped_live = ledger.live_bytes - sum(ledger.bytes_of(n) for n in ledger.names()) + sum(ledger._mapped.values())
    ledger.mapped_peak = ledger.mapped_live
    ledger.__class__ = PageCounted


def pin_to_one_cpu() -> int | None:
    """Run every thread of this process (and those it starts later) on the CPU it is on now: the resident-set
    figures then lag by one CPU's counter batch at most, not every CPU's (the high-water mark moved by -160 to +100
    KB from run to run unpinned on a 2-CPU machine). Call it just before the measured steps: a compile pinned runs
    slower. The CPU, or None where affinity cannot be set."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    try:
        with open("/proc/self/stat") as f:
            cpu = int(f.read().rsplit(")", 1)[1].split()[36])  # field 39, `processor`: where it last ran
        if cpu not in os.sched_getaffinity(0):
            cpu = min(os.sched_getaffinity(0))
        for tid in os.listdir("/proc/self/task"):
            os.sched_setaffinity(int(tid), {cpu})
    except (OSError, ValueError, IndexError):
        return None
    return cpu
