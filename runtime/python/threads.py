"""The intra-op thread count a plan trains with on the CPU, where its target names none (the host's).

A target profile may name its own (`cpu_threads`: a Raspberry Pi 4's four cores). The compiler counts a plan's
kernel scratch for that count (on small maps oneDNN holds a weight-sized buffer per thread), the host profiler
times every node with it, the plan records it (`PLAN["threads"]`) and the runtime pins it while each step trains.
One thread for the host: a step's time then depends little on what else a shared machine runs, and a device core
is what the plan is a stand-in for.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

PLAN_THREADS = 1


@contextmanager
def pinned_threads(threads: int = PLAN_THREADS):
    """torch's intra-op thread count set to `threads` inside the block, and set back to its own after."""
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        torch.set_num_threads(saved)
