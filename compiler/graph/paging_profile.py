"""Measure the page store on the machine that compiles: the paging figures of a measured (`host`) target.

A page-out on the host is the runtime's own page store at work (the checksum and the file write), a page-in its
read and check; no datasheet gives those. So a plan compiled for a measured target gets paging figures
measured with the runtime's `FileStore`: float32 tensors of the plan's sizes (powers of 4 from its smallest
tensor to its largest, within 4 KiB-16 MiB) paged out and in on the calling thread, in the temporary directory
(whose free bytes are the profile's storage), as the compute thread pays for them: a slice of small ops with
a few page ops spread through it, less the same slice alone, per page op, in the CPU time of that thread (other
processes' load stays out). Timed in a loop of page ops instead, a 4-64 KiB page cost 0.55-0.8 of what it costs
beside compute (the call runs slower there, and so do the ops after it: caches, and the system calls' wake). A
figure is never below the page ops' own time.
`latency + bytes / bandwidth` is fitted to the fastest run of each size, in relative error, so small pages'
fixed costs count as much as large pages' bytes. A page at or above the store's inline size
(`storage.inline_threshold()`) is done on its threads in a plan, so its figure (work on the calling thread) is
what the serial time model charges it for anyway: it does not count the overlap. Each size is measured once per
process, like the rest of the profile: under two seconds in all.
"""
from __future__ import annotations

import dataclasses
import functools
import tempfile
import time

import torch

from .ir import TrainingGraph

MIN_BYTES, MAX_BYTES = 4 << 10, 16 << 20
REPEATS = 20
SLICE_OPS = 40  # small ops in the compute slice the page ops are timed in: ~1 ms
PAGES_PER_SLICE = 4  # page ops spread through a slice: their cost is the slice's extra time over this many
_SOURCE = ("Measured: the runtime's page store on the compiling machine ({what}), as the compute thread pays it: a "
           "slice of small ops with page ops in it less the slice alone, fastest of {n} runs at each of "
           "{sizes}, in CPU time, latency + bytes / bandwidth fitted; once per process")


def _small_op(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """One op of the compute slice: a small matrix product, as a plan's step runs hundreds of."""
    return torch.mm(a, b).tanh_()


def _slice(a: torch.Tensor, b: torch.Tensor, page=None) -> tuple[float, float]:
    """(thread CPU s of the whole slice, of the `page()` calls alone): SLICE_OPS small ops, `page()` after every
    SLICE_OPS / PAGES_PER_SLICE of them from the first."""
    t0 = time.thread_time()
    own = 0.0
    for k in range(SLICE_OPS):
        a = _small_op(a, b)
        if k % (SLICE_OPS // PAGES_PER_SLICE) == 0 and page is not None:
            p0 = time.thread_time()
            page()
            own += time.thread_time() - p0
    return time.thread_time() - t0, own


@functools.cache
def page_times(nbytes: int, repeats: int = REPEATS) -> tuple[float, float]:
    """The (page-out, page-in) CPU seconds of a float32 tensor of `nbytes` as the compute thread pays them: a
    slice of small ops with PAGES_PER_SLICE page ops in it, less the same slice alone (the fastest of `repeats`
    each; at least the page ops' own time), per page op, through a FileStore that writes and reads on the
    calling thread."""
    from edgetrain.runtime.python import heap
    from edgetrain.runtime.python.storage import FileStore

    heap.keep_freed_memory()  # the allocator as the runtime sets it: a page-in's tensor reuses freed memory
    t = torch.randn(max(1, nbytes // 4))
    a, b = torch.randn(64, 64), torch.randn(64, 64) * 0.1
    runs: dict[str, list[tuple[float, float]]] = {"alone": [], "out": [], "in": []}
    with tempfile.TemporaryDirectory(prefix="edgetrain-paging-") as tmp:
        store = FileStore(tmp, background=False)
        store.page_out("probe", t)  # creates the file: every timed write overwrites it, as a plan's step does
        ops = {"alone": None, "out": lambda: store.page_out("probe", t),
               "in": lambda: store.start_page_in("probe").result()}
        for k in range(repeats + 1):
            for what, page in ops.items():
                got = _slice(a, b, page)
                if k:  # the first round warms the allocator and the page cache
                    runs[what].append(got)
    alone = min(w for w, _ in runs["alone"])
    return tuple(max(min(w for w, _ in runs[what]) - alone, min(o for _, o in runs[what])) / PAGES_PER_SLICE
                 for what in ("out", "in"))


def probe_sizes(graph: TrainingGraph) -> list[int]:
    """Powers of 4 bytes from the graph's smallest tensor to its largest (at least two), within MIN/MAX_BYTES."""
    sizes = [n.bytes for n in graph.nodes if n.bytes > 0] or [MIN_BYTES]
    lo = MIN_BYTES
    while lo * 4 <= min(min(sizes), MAX_BYTES):
        lo *= 4
    out = [lo]
    while out[-1] < min(max(sizes), MAX_BYTES) or len(out) < 2:
        out.append(out[-1] * 4)
    return out


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(latency s, bandwidth B/s) of `t = latency + bytes / bandwidth` over (bytes, seconds) points, least squares
    in relative error; latency >= 0."""
    # Each point divided by its time: [1/t, b/t] . [latency, 1/bandwidth] = 1.
    a11 = sum(1 / t ** 2 for _, t in points)
    a12 = sum(b / t ** 2 for b, t in points)
    a22 = sum(b * b / t ** 2 for b, t in points)
    r1 = sum(1 / t for _, t in points)
    r2 = sum(b / t for b, t in points)
    det = a11 * a22 - a12 * a12
    latency, inv_bw = (a22 * r1 - a12 * r2) / det, (a11 * r2 - a12 * r1) / det
    if latency < 0 or inv_bw <= 0:  # no fixed cost to speak of: bandwidth alone, through the origin
        latency, inv_bw = 0.0, r2 / a22
    return latency, 1 / inv_bw


def with_measured_paging(target, graph: TrainingGraph):
    """`target` with its four paging figures measured here at `graph`'s sizes, their sources saying so; a target
    that is not measured comes back as it is."""
    if not getattr(target, "measured", False):
        return target
    sizes = probe_sizes(graph)
    times = [page_times(b) for b in sizes]
    out_lat, out_bw = fit([(b, t[0]) for b, t in zip(sizes, times)])
    in_lat, in_bw = fit([(b, t[1]) for b, t in zip(sizes, times)])
    span = f"{len(sizes)} sizes, {_kib(sizes[0])}-{_kib(sizes[-1])}"
    from edgetrain.runtime.python.storage import CHECKSUM

    write = _SOURCE.format(what=f"{CHECKSUM} checksum and file write", n=REPEATS, sizes=span)
    read = _SOURCE.format(what=f"file read into the tensor and {CHECKSUM} check", n=REPEATS, sizes=span)
    sources = {**target.sources, "page_out_latency_s": write, "page_out_bandwidth_bytes_per_s": write,
               "page_in_latency_s": read, "page_in_bandwidth_bytes_per_s": read}
    return dataclasses.replace(target, page_out_latency_s=out_lat, page_out_bandwidth_bytes_per_s=out_bw,
                               page_in_latency_s=in_lat, page_in_bandwidth_bytes_per_s=in_bw, sources=sources)


def _kib(b: int) -> str:
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
