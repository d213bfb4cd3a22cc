"""Runtime benchmark: a compiled plan's training step against a plain PyTorch step of the same model.

    .venv/bin/python benchmarks/runtime.py [--models resnet18,mobilenetv2,gpt_small] [--budgets 100%,50%]
                                           [--threads 1] [--overlap on,off] [--target rpi4] [--batch-size 8]
                                           [--steps 5] [--warmup 2] [--time-limit 30] [--compare-store DIR]
                                           [--compare-runtime DIR] [--json build/bench/runtime.json]

Per (model, budget, threads): the model is compiled for the target at the budget (POET, Python plan); the
runtime (edgetrain.runtime, pages on local disk) and plain PyTorch (the model as written, loss.backward(),
torch.optim.SGD with the plan's hyper-parameters) start from the same weights and train on the same random
batches. Their steps alternate in one process, so both see the same machine load; after --warmup steps of
each, --steps steps of each are timed, and the row gives both medians and their ratio (runtime / PyTorch),
the median of each runtime step's time over the PyTorch step of the same rotation ("paired": a load that
drifts between rotations cancels), and the same ratio of the process's CPU time per step (every thread's:
the page store's too), which other processes' load moves far less than wall time.
torch runs with --threads intra-op threads (both sides alike; a plan's kernel scratch is counted for its target's
own count, 4 on rpi4, which this benchmark does not measure: benchmarks/memory.py does). Rows also carry the
schedule's predicted step time (with `--target host`, measured by the profiler on the machine that compiles:
compare it with the runtime's) and the time the runtime's step stood still for the page store
(`Runtime.paging_wait_s`: page-outs handed to the writer, waits for writes before frees, page-in headers, waits for
read-ahead bytes and their checksums), as a median per step and as a share of the step. `--overlap on,off` compiles
each plan twice, with paging overlapped (page-ins read ahead, frees of paged-out tensors written behind: the
default of compile) and without, one row each, their steps alternating with PyTorch's in one loop. `--compare-store
DIR` adds, per plan, a row whose runtime pages through another checkout's page store
(DIR/runtime/python/storage.py, e.g. the main branch's) instead of this one's, its steps in the same loop: a
before/after of the page store under one load. `--compare-runtime DIR` likewise adds a row run by another
checkout's whole runtime package (DIR/runtime/python: executor, op calls, ledger, page store) on the same schedule,
its plan.py rendered by that checkout's own codegen (in DIR/.venv): a before/after of the runtime and the plan. Prints a table and writes JSON rows with at least model, budget (as given), threads
and ratio.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from benchmarks.output import write_json  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from edgetrain.compiler.frontend.modelspec import resolve  # noqa: E402
from edgetrain.compiler.schedule_file import format as schedule_format  # noqa: E402
from edgetrain.compiler.workbench.run import schedule_batches  # noqa: E402
from edgetrain.compiler.workbench.reference import load_weights  # noqa: E402
from edgetrain.runtime.python import Runtime, load_plan  # noqa: E402
from edgetrain.runtime.python.integrity import file_table, json_checksum  # noqa: E402
from edgetrain.runtime.python.storage import PendingRead  # noqa: E402


def _torch_step(model, opt, x, y) -> None:
    opt.zero_grad(set_to_none=True)
    logits = model(x)
    if logits.dim() > 2:  # a language model: one label per position
        logits, y = logits.reshape(-1, logits.shape[-1]), y.reshape(-1)
    F.cross_entropy(logits, y).backward()
    opt.step()


def plan_runtime(body: dict, out: str, pages: str, runtime=Runtime) -> Runtime:
    """A CPU runtime for the compiled plan in `out` (its weights and the schedule's SGD), paging into `pages`."""
    opt_cfg = body["graph"]["optimizer"]
    return runtime(os.path.join(out, "weights.safetensors"), pages, device="cpu", lr=opt_cfg["lr"],
                   momentum=opt_cfg["momentum"], weight_decay=opt_cfg["weight_decay"], seed=body["seed"])


def pytorch_side(body: dict, out: str):
    """(the model as written with the plan's weights, in training mode; torch.optim.SGD with the plan's settings)."""
    torch.manual_seed(body["seed"])
    spec, opt_cfg = body["model"], body["graph"]["optimizer"]
    ref = resolve(spec["spec"], **spec["kwargs"]).module
    load_weights(ref, os.path.join(out, "weights.safetensors"))
    ref.train()
    return ref, torch.optim.SGD(ref.parameters(), lr=opt_cfg["lr"], momentum=opt_cfg["momentum"],
                                weight_decay=opt_cfg["weight_decay"])


def _plan(model: str, budget: str, overlap: str, args, work: str) -> tuple[dict, str]:
    out = os.path.join(work, f"{model}-{budget.replace('%', 'pct')}-{overlap}")
    if not os.path.exists(os.path.join(out, "plan.py")):  # one compile per (model, budget, overlap)
        # imported here: the PyTorch side below also serves a GPU machine's benchmark, where no solver is installed
        from edgetrain.compiler.pipeline import CompileOptions, compile_model

        compile_model(CompileOptions(model=model, target=args.target, budget=budget, out=out,
                                     batch_size=args.batch_size, time_limit=args.time_limit,
                                     overlap_paging=overlap == "on"))
    return schedule_format.load(out), out


def _other_store(checkout: str):
    """The FileStore class of another checkout's runtime/python/storage.py (it imports torch and the stdlib)."""
    path = os.path.join(checkout, "runtime", "python", "storage.py")
    package = types.ModuleType("edgetrain_compared")  # its relative imports resolve in its own folder
    package.__path__ = [os.path.dirname(path)]
    sys.modules["edgetrain_compared"] = package
    spec = importlib.util.spec_from_file_location("edgetrain_compared.storage", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # The runtime knows a read-ahead page-in by this checkout's class: the other's reads are made that too.
    module.PendingRead = type("PendingRead", (module.PendingRead, PendingRead), {})
    return module.FileStore


def _other_runtime(checkout: str):
    """Another checkout's runtime/python package, imported under a name of its own (it imports torch, safetensors
    and the stdlib only)."""
    path = os.path.join(checkout, "runtime", "python")
    name = "edgetrain_compared_runtime"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(path, "__init__.py"),
                                                      submodule_search_locations=[path])
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # its relative imports resolve under that name
        spec.loader.exec_module(module)
    return sys.modules[name]


def _other_plan(checkout: str, out: str) -> str:
    """A copy of the compiled folder `out` whose plan.py the other checkout's codegen rendered from the same
    schedule (in its own virtual environment, checkout/.venv), its file hashes recorded as compile records them:
    the plan that checkout's runtime runs."""
    other = f"{out}-{hashlib.sha1(os.path.abspath(checkout).encode()).hexdigest()[:8]}"
    if not os.path.exists(os.path.join(other, "plan.py")):
        shutil.copytree(out, other, ignore=shutil.ignore_patterns("pages*", "__pycache__"))
        render = ("import json, sys; from edgetrain.codegen.python_plan import render_python_plan; "
                  "render_python_plan(json.load(open(sys.argv[1] + '/schedule.json')), sys.argv[1])")
        subprocess.run([os.path.join(checkout, ".venv", "bin", "python"), "-c", render, other], check=True)
        body = json.loads(open(os.path.join(other, "schedule.json")).read())
        body["outputs"]["files"] = file_table(other)
        body["checksum"] = json_checksum(body)
        with open(os.path.join(other, "schedule.json"), "w") as f:
            f.write(json.dumps(body, indent=1, sort_keys=True) + "\n")
    return other


def bench(model: str, budget: str, threads: int, overlaps: list[str], args, work: str) -> list[dict]:
    """One row per overlap setting (and page store); their runtime steps and the PyTorch step alternate in one
    loop (the order rotating each step), so every row sees the same load."""
    torch.set_num_threads(threads)
    rows, runs = [], []
    variants = [("this", "this")]  # (page store, runtime)
    variants += [(args.compare_store, "this")] if args.compare_store else []
    variants += [("this", args.compare_runtime)] if args.compare_runtime else []
    for overlap in overlaps:
        body, out = _plan(model, budget, overlap, args, work)
        for store, runtime in variants:
            row = {"model": model, "budget": budget, "threads": threads, "overlap": overlap, "target": args.target,
                   "batch_size": args.batch_size, "store": store, "runtime": runtime}
            for action, key in (("recompute", "recomputes"), ("page_in", "page_ins"), ("page_out", "page_outs")):
                row[key] = sum(st["action"] == action for st in body["steps"])
            row["predicted_s"] = body["predicted"]["time_s"]  # the target's figure: a step's time on that device
            pages = os.path.join(work, f"pages-{overlap}-{len(runs)}")
            rt = plan_runtime(body, out, pages, _other_runtime(runtime).Runtime if runtime != "this" else Runtime)
            if store != "this":
                rt.store = _other_store(store)(pages)
            rows.append(row)
            plan = load_plan(out) if runtime == "this" else _other_runtime(runtime).load_plan(_other_plan(runtime, out))
            runs.append((plan, rt, [], [], []))
    ref, opt = pytorch_side(body, out)
    t_pt, c_pt = [], []
    for k, (x, y) in enumerate(schedule_batches(body, "random", args.warmup + args.steps, seed=1)):
        turn = [*range(len(runs)), None]
        for which in turn[k % len(turn):] + turn[:k % len(turn)]:
            t0, c0 = time.perf_counter(), time.process_time()
            if which is None:
                _torch_step(ref, opt, x, y)
                if k >= args.warmup:
                    t_pt.append(time.perf_counter() - t0)
                    c_pt.append(time.process_time() - c0)
                continue
            plan, rt, times, cpus, waits = runs[which]
            w0 = rt.paging_wait_s
            rt.begin_step(x, y)
            plan.train_step(rt)
            if k >= args.warmup:
                times.append(time.perf_counter() - t0)
                cpus.append(time.process_time() - c0)
                waits.append(rt.paging_wait_s - w0)
    for row, (_, rt, times, cpus, waits) in zip(rows, runs):
        row["runtime_s"] = statistics.median(times)
        row["pytorch_s"] = statistics.median(t_pt)
        row["ratio"] = row["runtime_s"] / row["pytorch_s"]
        # each runtime step over the PyTorch step of the same rotation (seconds apart): load that drifts cancels
        row["paired_ratio"] = statistics.median(t / p for t, p in zip(times, t_pt))
        row["runtime_cpu_s"] = statistics.median(cpus)
        row["pytorch_cpu_s"] = statistics.median(c_pt)
        row["cpu_ratio"] = row["runtime_cpu_s"] / row["pytorch_cpu_s"]
        row["paging_wait_s"] = statistics.median(waits)
        row["paging_share"] = row["paging_wait_s"] / row["runtime_s"]
        row["predicted_over_measured"] = row["predicted_s"] / row["runtime_s"]  # meaningful for --target host
        row["paged_bytes_per_step"] = rt.paged_bytes // (args.warmup + args.steps)
        row["runtime_steps_s"], row["pytorch_steps_s"] = times, t_pt
        row["runtime_cpu_steps_s"], row["pytorch_cpu_steps_s"] = cpus, c_pt
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet18,mobilenetv2,gpt_small")
    ap.add_argument("--budgets", default="100%,50%")
    ap.add_argument("--threads", default="1", help="comma-separated intra-op thread counts")
    ap.add_argument("--overlap", default="on", help="on, off or on,off: paging overlapped with compute (one row each)")
    ap.add_argument("--target", default="rpi4")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5, help="timed steps of each, after the warm-up")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--time-limit", type=float, default=30.0, help="solver time limit per compile (s)")
    ap.add_argument("--compare-store", default=None, metavar="DIR",
                    help="also run each plan on the page store of the checkout at DIR (a before/after in one loop)")
    ap.add_argument("--compare-runtime", default=None, metavar="DIR",
                    help="also run each plan on the runtime package of the checkout at DIR (a before/after in one loop)")
    ap.add_argument("--json", default="build/bench/runtime.json", metavar="PATH", help="rows written here")
    a = ap.parse_args(argv)
    rows = []
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="edgetrain-runtime-") as work:
        for model in a.models.split(","):
            for budget in a.budgets.split(","):
                for threads in (int(t) for t in a.threads.split(",")):
                    try:
                        rows += bench(model, budget, threads, a.overlap.split(","), a, work)
                    except Exception as e:  # noqa: BLE001 - a benchmark row records the failure
                        rows.append({"model": model, "budget": budget, "threads": threads, "overlap": a.overlap,
                                     "error": str(e)})
    load_after = os.getloadavg()
    write_json(a.json, rows, load[0], load_after[0])
    t = Table(title=f"runtime step vs plain PyTorch step ({a.target} plans, batch {a.batch_size}, medians of "
                    f"{a.steps} steps after {a.warmup}; load {load[0]:.2f} -> {load_after[0]:.2f})")
    for col in ("model", "budget", "threads", "overlap", "store", "runtime", "rec/pin/pout", "runtime ms", "PyTorch ms", "ratio",
                "paired", "CPU ratio", "paged MB/step", "paging wait ms", "paging share", "predicted ms"):
        t.add_column(col, justify="right")
    for r in rows:
        if "ratio" not in r:
            t.add_row(r["model"], r["budget"], str(r["threads"]), r["overlap"], "-", "-", "-", "-", "-", "error", "-",
                      "-", "-", "-", "-", "-")
            continue
        t.add_row(r["model"], r["budget"], str(r["threads"]), r["overlap"], "this" if r["store"] == "this" else "compared",
                  "this" if r["runtime"] == "this" else "compared",
                  f"{r['recomputes']}/{r['page_ins']}/{r['page_outs']}", f"{r['runtime_s'] * 1e3:.1f}",
                  f"{r['pytorch_s'] * 1e3:.1f}", f"{r['ratio']:.2f}x", f"{r['paired_ratio']:.2f}x", f"{r['cpu_ratio']:.2f}x",
                  f"{r['paged_bytes_per_step'] / 1e6:.1f}",
                  f"{r['paging_wait_s'] * 1e3:.1f}", f"{r['paging_share']:.1%}", f"{r['predicted_s'] * 1e3:.1f}")
    Console(width=180).print(t)
    for r in rows:
        if r.get("error"):
            print(f"{r['model']} {r['budget']} {r['threads']} overlap {r['overlap']}: {r['error']}", file=sys.stderr)
    print(f"wrote {a.json}")
    return 0 if all("ratio" in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
