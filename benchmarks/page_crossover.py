"""Page crossover benchmark: from what size a page is cheaper on the store's threads than on the compute thread.

    .venv/bin/python benchmarks/page_crossover.py [--sizes 4K,16K,64K,256K,1M,4M,16M] [--repeats 30]
                                                  [--ops 60] [--json build/bench/page_crossover.json]

A compute slice stands in for a plan's step: small torch ops called from Python, one after the other (each
releases and takes back the GIL, as the runtime's ops do): --ops of them, or more for a large page, enough to
cover twice the page's own time between page-out and free and again between page-in and use. Per page size,
three variants alternate in one loop, so they see the same machine load: the slice alone; the slice with a
page-out after its first op, a wait for that write after its middle op (where a plan frees the tensor), a
page-in and its bytes collected at the end, all on the calling thread (a `FileStore` without threads); and the
same on the store's writer and reader threads (every page handed off, whatever its size). A row gives the
medians of the wall time each variant adds to the slice alone, and of the compute thread's CPU time, and which
is cheaper: the smallest size where the threads win is the crossover that `storage.inline_threshold()` keeps
(`INLINE_PAGE_BYTES` where torch's threads take every core, `INLINE_PAGE_BYTES_FREE_CORE` where one is free).
Prints a table with the 1-minute load average before and after, and writes the rows as JSON.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from benchmarks.output import write_json  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from edgetrain.runtime.python import heap  # noqa: E402
from edgetrain.runtime.python.storage import FileStore, inline_threshold  # noqa: E402
from edgetrain.runtime.python.threads import pinned_threads  # noqa: E402


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def _slice(ops: int, a: torch.Tensor, b: torch.Tensor, store: FileStore | None, page: torch.Tensor | None) -> tuple:
    """(wall s, thread CPU s) of `ops` small matrix products, with one page out and back in beside them."""
    t0, c0 = time.perf_counter(), time.thread_time()
    pending = None
    for k in range(ops):
        a = torch.mm(a, b).tanh_()
        if store is None:
            continue
        if k == 0:
            store.page_out("probe", page)
        if k == ops // 2:
            store.wait("probe")  # where a plan frees the paged-out tensor
            pending = store.start_page_in("probe")
    if pending is not None:
        pending.result()  # where a plan first uses the paged-in tensor
    return time.perf_counter() - t0, time.thread_time() - c0


def bench(size: int, args, tmp: str) -> dict:
    page = torch.randn(max(1, size // 4))
    a, b = torch.randn(64, 64), torch.randn(64, 64) * 0.1
    stores = {"inline": FileStore(os.path.join(tmp, "inline"), background=False),
              "threads": FileStore(os.path.join(tmp, "threads"), inline_below=0)}
    # Enough compute between the page-out and the free, and between the page-in and the use, to cover twice
    # the page's own time: the threads get the overlap a plan gives them.
    op_s = statistics.median(_slice(args.ops, a, b, None, None)[0] for _ in range(5)) / args.ops
    t0 = time.perf_counter()
    _slice(1, a, b, stores["inline"], page)
    ops = max(args.ops, 2 * int(2 * (time.perf_counter() - t0) / op_s))
    runs: dict[str, list[tuple[float, float]]] = {"alone": [], "inline": [], "threads": []}
    for k in range(args.repeats + 2):
        for variant in runs:
            store = stores.get(variant)
            got = _slice(ops, a, b, store, page if store is not None else None)
            if k >= 2:  # the first two rounds create the files and warm the allocator
                runs[variant].append(got)
    stores.clear()  # the threads end with their store
    alone = statistics.median(w for w, _ in runs["alone"])
    alone_cpu = statistics.median(c for _, c in runs["alone"])
    row = {"bytes": size, "ops": ops, "alone_s": alone}
    for variant in ("inline", "threads"):
        row[f"{variant}_added_s"] = statistics.median(w for w, _ in runs[variant]) - alone
        row[f"{variant}_added_cpu_s"] = statistics.median(c for _, c in runs[variant]) - alone_cpu
    row["cheaper"] = "inline" if row["inline_added_s"] <= row["threads_added_s"] else "threads"
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4K,16K,64K,256K,1M,4M,16M")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--ops", type=int, default=60, help="small ops in a compute slice")
    ap.add_argument("--json", default="build/bench/page_crossover.json", metavar="PATH", help="rows written here")
    a = ap.parse_args(argv)
    heap.keep_freed_memory()  # the allocator as the runtime sets it
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="edgetrain-crossover-") as tmp, pinned_threads():
        rows = [bench(_size(s), a, tmp) for s in a.sizes.split(",")]
        inline = inline_threshold()  # at the benchmark's one thread
    load_after = os.getloadavg()
    write_json(a.json, rows, load[0], load_after[0])
    t = Table(title=f"one page out and in beside {a.ops} small ops: time added to the compute thread "
                    f"(median of {a.repeats}; load {load[0]:.2f} -> {load_after[0]:.2f} on {os.cpu_count()} cores; "
                    f"the store's inline size at one thread {inline} B)")
    for col in ("page", "ops", "slice alone ms", "inline +ms", "threads +ms", "inline +CPU ms", "threads +CPU ms",
                "cheaper"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(f"{r['bytes'] >> 10} KiB", str(r["ops"]), f"{r['alone_s'] * 1e3:.2f}",
                  f"{r['inline_added_s'] * 1e3:.3f}", f"{r['threads_added_s'] * 1e3:.3f}",
                  f"{r['inline_added_cpu_s'] * 1e3:.3f}", f"{r['threads_added_cpu_s'] * 1e3:.3f}", r["cheaper"])
    Console(width=160).print(t)
    print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
