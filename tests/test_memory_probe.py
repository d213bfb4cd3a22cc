"""The measuring harness (benchmarks/memory_probe.py) reads a known allocation to within the kernel's counting:
the peak of a span, not its end, and nothing of what was freed before it. Run in a child process, since it
changes malloc."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.memory_probe import Probe, Span, cpu_probe_available  # noqa: E402

CHILD = r"""
import json
from benchmarks.memory_probe import Probe, isolate_malloc
isolated = isolate_malloc()
import torch
probe = Probe("cpu")
n = 4 * 1024 * 1024
torch.ones(n) + 1  # warm-up: torch's thread pool and first-use allocations
with probe.span() as held:
    a = torch.ones(n)  # 16 MiB, kept
with probe.span() as transient:
    b = torch.ones(n) + 1  # two 16 MiB blocks at once, both freed before the span ends
    del b
del a
with probe.span() as after:  # a's and b's pages went back: nothing to reuse, nothing grows
    c = torch.ones(1024)
print(json.dumps({"isolated": isolated, "held": held.growth, "transient": transient.growth,
                  "after": after.growth}))
"""


def _tolerance() -> int:
    """Small blocks torch and Python free or take meanwhile (256 KiB), and what the kernel has not yet counted.
    Linux keeps a process's resident pages in per-CPU counters, folded into the total once a CPU's share
    passes max(32, 2 x CPUs) pages, and records the high-water mark from the total alone (at the unmap of a
    freed block): a peak reads low by the shares not yet folded. Under load a process's threads move between
    CPUs and leave a share on each (32 MiB read up to 324 KiB low on a 2-core x86-64 VM with both cores busy);
    pinned to one CPU only that CPU's share, for anonymous and for file pages, is outstanding (176 KiB at most
    in 20 runs there)."""
    batch = max(32, 2 * (os.cpu_count() or 1))
    return 256 * 1024 + 2 * batch * os.sysconf("SC_PAGE_SIZE")


def _one_cpu():
    cpu = min(os.sched_getaffinity(0))
    return lambda: os.sched_setaffinity(0, {cpu})  # in the child, before it runs anything


@pytest.mark.skipif(not cpu_probe_available(), reason="needs Linux's resettable resident-set high-water mark")
def test_cpu_probe_reads_a_known_allocation_to_the_page():
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, cwd=ROOT,
                       preexec_fn=_one_cpu(), timeout=120)  # cwd: the child imports benchmarks/ from the checkout
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    mib16, tol = 16 * 1024 * 1024, _tolerance()
    assert got["isolated"]
    assert abs(got["held"] - mib16) <= tol, got
    assert abs(got["transient"] - 2 * mib16) <= tol, got  # the peak, though both were freed by the end
    assert got["after"] <= tol, got


def test_a_span_that_shrinks_grew_nothing():
    assert Span(start=5 << 20, peak=3 << 20).growth == 0
    assert Span(start=3 << 20, peak=5 << 20).growth == 2 << 20


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_probe_reads_the_allocators_peak():
    probe = Probe("cuda")
    with probe.span() as s:
        t = torch.empty(1 << 20, device="cuda")
        u = t + 1
        del u
    assert s.growth >= 2 * 4 * (1 << 20)
    del t
