"""What paging small tensors beside compute costs the compute thread, per page store.

    .venv/bin/python benchmarks/page_handoff.py [--pages 14] [--page-kib 64] [--ops 420] [--rounds 40]
                                                [--compare-store DIR] [--json build/bench/page_handoff.json]

One thread computes a chain of small ops (a 64x64 matrix product and tanh, `--ops` of them: a small model's
step); every `--ops / --pages` ops it pages a `--page-kib` tensor out and, two pages later, back in, waiting
for each read one page after starting it, as a plan's read-ahead does. The same loop runs without paging,
through this checkout's page store (its threads for pages of `storage.inline_threshold()` bytes and more),
through it on the calling thread only (`background=False`), and through another checkout's store
(`--compare-store`), the variants alternating round by round in one process at one intra-op thread. Per
variant: the median and least wall time of a loop, the compute thread's median CPU time, and the median time
added over the loop without paging. Small pages are where handing work to another thread costs more than the
work: the GIL, which the compute thread takes back each time a kernel returns, and the wake-ups. Prints a table
with the load, writes the rows as JSON.
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

from benchmarks.runtime import _other_store  # noqa: E402
from edgetrain.runtime.python import heap  # noqa: E402
from edgetrain.runtime.python.storage import FileStore  # noqa: E402


def _loop(store, pages: list[torch.Tensor], ops: int) -> None:
    x, w = torch.ones(64, 64) / 64, torch.eye(64)
    every = max(1, ops // len(pages))
    reading = []
    for k in range(ops):
        x = torch.tanh(x @ w)
        if store is None or k % every or k // every >= len(pages):
            continue
        j = k // every
        store.page_out(f"p{j}", pages[j])
        if j >= 2:
            store.wait(f"p{j - 2}")
            reading.append(store.start_page_in(f"p{j - 2}"))
        if len(reading) > 1:
            reading.pop(0).result()
    for r in reading:
        r.result()
    if store is not None:
        store.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=14)
    ap.add_argument("--page-kib", type=int, default=64)
    ap.add_argument("--ops", type=int, default=420)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--compare-store", default=None, metavar="DIR", help="also page through the store at DIR")
    ap.add_argument("--json", default="build/bench/page_handoff.json", metavar="PATH")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    heap.keep_freed_memory()
    pages = [torch.randn(a.page_kib * 256) for _ in range(a.pages)]
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="edgetrain-handoff-") as work:
        variants = {"no paging": None, "this store": FileStore(os.path.join(work, "this")),
                    "this store, calling thread": FileStore(os.path.join(work, "sync"), background=False)}
        if a.compare_store:
            variants[f"store at {a.compare_store}"] = _other_store(a.compare_store)(os.path.join(work, "other"))
        for store in variants.values():  # files created, threads started, caches warm
            _loop(store, pages, a.ops)
        times: dict[str, list[tuple[float, float]]] = {k: [] for k in variants}
        for _ in range(a.rounds):
            for name, store in variants.items():
                t0, c0 = time.perf_counter(), time.thread_time()
                _loop(store, pages, a.ops)
                times[name].append((time.perf_counter() - t0, time.thread_time() - c0))
    load_after = os.getloadavg()
    base = statistics.median(w for w, _ in times["no paging"])
    rows = [{"variant": name, "pages": a.pages, "page_bytes": a.page_kib << 10, "ops": a.ops, "rounds": a.rounds,
             "median_s": statistics.median(w for w, _ in v), "min_s": min(w for w, _ in v),
             "compute_thread_cpu_s": statistics.median(c for _, c in v),
             "added_s": statistics.median(w for w, _ in v) - base,
             "loadavg_1min_before_after": [load[0], load_after[0]]} for name, v in times.items()]
    write_json(a.json, rows)
    t = Table(title=f"{a.ops} small ops, {a.pages} pages of {a.page_kib} KiB out and in beside them, {a.rounds} "
                    f"rounds (load {load[0]:.2f} -> {load_after[0]:.2f})")
    for col in ("variant", "median ms", "least ms", "compute-thread CPU ms", "added ms (median)"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(r["variant"], f"{r['median_s'] * 1e3:.2f}", f"{r['min_s'] * 1e3:.2f}",
                  f"{r['compute_thread_cpu_s'] * 1e3:.2f}", f"{r['added_s'] * 1e3:+.2f}")
    Console().print(t)
    print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
