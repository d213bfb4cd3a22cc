"""Measure the page store on the machine that compiles: the paging figures of a measured (`host`) target.

A page-out on the host is the runtime's own page store at work (the checksum and the file write), a page-in its
read and check; no datasheet gives those. So a plan compiled for a measured target gets paging figures
measured with the runtime's `FileStore`: float32 tensors of the plan's sizes (powers of 4 from its smallest
tensor to its largest, within 4 KiB-16 MiB) paged out and in on one thread, in the temporary directory (whose
free bytes are the profile's storage), a few times each, timed like the profiler's nodes: in the CPU time of
that thread (the store's work is checksums and copies into and out of the page cache; other processes' load
stays out). `latency + bytes / bandwidth` is fitted to the fastest run of each size, in relative error, so
small pages' fixed costs count as much as large pages' bytes. Each size is measured once per process, like
the rest of the profile: about a second in all.
"""
from __future__ import annotations

import dataclasses
import functools
import tempfile
import time

import torch

from .ir import TrainingGraph

MIN_BYTES, MAX_BYTES = 4 << 10, 16 << 20
REPEATS = 5
_SOURCE = ("Measured: the runtime's page store on the compiling machine ({what}), fastest of {n} runs at each of "
           "{sizes}, in CPU time, latency + bytes / bandwidth fitted; once per process")


@functools.cache
def page_times(nbytes: int, repeats: int = REPEATS) -> tuple[float, float]:
    """The fastest (page-out, page-in) CPU seconds of `repeats` runs of a float32 tensor of `nbytes` through a
    FileStore that writes and reads on the calling thread (a first, untimed run creates the file)."""
    from edgetrain.runtime.python import heap
    from edgetrain.runtime.python.storage import FileStore

    heap.keep_freed_memory()  # the allocator as the runtime sets it: a page-in's tensor reuses freed memory
    t = torch.randn(max(1, nbytes // 4))
    outs, ins = [], []
    with tempfile.TemporaryDirectory(prefix="edgetrain-paging-") as tmp:
        store = FileStore(tmp, background=False)
        for k in range(repeats + 1):
            t0 = time.thread_time()
            store.page_out("probe", t)
            t1 = time.thread_time()
            store.page_in("probe")
            t2 = time.thread_time()
            if k:
                outs.append(t1 - t0)
                ins.append(t2 - t1)
    return min(outs), min(ins)


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
