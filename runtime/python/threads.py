"""The intra-op thread count a host plan trains with: the one place that owns it.

The host profiler times every node with it, the compiler counts every plan's kernel scratch for it (oneDNN holds
about a weight-sized buffer more per extra thread), and `edgetrain run` trains a plan on the CPU with it. One thread: a step's time then depends little
on what else a shared machine runs, and a device core is what the plan is a stand-in for.
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
