"""The measuring harness (benchmarks/memory_probe.py) reads a known allocation to the page: the peak of
a span, not its end, and nothing of what was freed before it. Run in a child process, since it changes malloc."""
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


@pytest.mark.skipif(not cpu_probe_available(), reason="needs Linux's resettable resident-set high-water mark")
def test_cpu_probe_reads_a_known_allocation_to_the_page():
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, cwd=ROOT,
                       timeout=120)  # cwd: the child imports benchmarks/ from the checkout
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    mib16, tol = 16 * 1024 * 1024, 256 * 1024  # tol: small blocks torch and Python free or take meanwhile
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
