"""Memory benchmark: a plan's budget and predicted peak against the process's real memory over a training step.

    .venv/bin/python benchmarks/memory.py [--models resnet18,mobilenetv2,vgg11,gpt_tiny] [--budgets 100%,50%]
                                          [--target rpi4] [--batch-size 8] [--before main] [--threads N]
                                          [--time-limit 20] [--json build/bench/memory.json]

Per (model, budget, version): a fresh process makes glibc malloc return every freed block of a page or more at
once (benchmarks/memory_probe.py: then the resident set follows what torch holds), compiles the model
for the target at the budget (POET, Python plan), runs 3 steps on random batches and measures each step's
resident-set high-water growth (VmHWM after, VmRSS before, the mark reset at the step's start). `real` is the
ledger's bytes before the step (parameters, optimizer state, buffers) plus that growth: the figure the budget
promises to bound. The first step of a process also pays torch's one-time allocations (oneDNN's kernels and
caches): it is shown apart, and `ok` is for the steady steps (the most of steps 2 and 3). `--before REF` runs
the same rows with the compiler and runtime of git REF (extracted by `git archive`, imported ahead of this
tree) beside this tree's, so both columns come from one run; `--before none` skips it. Prints a table and
writes JSON rows.

`--child MODEL BUDGET` is one row in this process (JSON on stdout), used by the rows and the tests.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
STEPS = 3

from benchmarks.output import write_json  # noqa: E402


def _probe_module():
    """This tree's probe, by path: a `--before` tree has none."""
    path = os.path.join(ROOT, "benchmarks", "memory_probe.py")
    spec = importlib.util.spec_from_file_location("edgetrain_memory_probe", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def child(model: str, budget: str, target: str, batch_size: int, threads: int, time_limit: float,
          work: str, fuse: bool = False) -> dict:
    """One row, measured in this process (malloc is changed for the rest of it)."""
    probe_mod = _probe_module()
    isolated = probe_mod.isolate_malloc()
    import torch

    from edgetrain.compiler.pipeline import CompileOptions, compile_model
    from edgetrain.compiler.schedule_file import format as schedule_format
    from edgetrain.compiler.workbench.run import schedule_batches
    from edgetrain.runtime.python import load_plan, runtime_for
    from edgetrain.runtime.python.threads import PLAN_THREADS

    out = os.path.join(work, "plan")
    c = compile_model(CompileOptions(model=model, target=target, budget=budget, out=out, batch_size=batch_size,
                                     time_limit=time_limit, fuse=fuse))
    body = schedule_format.load(out)
    plan = load_plan(out)
    # As `edgetrain run` sets it up (its optimizer, seed and which tensors train: a frozen weight is no state).
    rt = runtime_for(plan, os.path.join(work, "pages"), device="cpu")
    # The plan's own thread count (its kernel scratch was counted for it) unless one is given; set here rather
    # than through the runtime, which an older tree measured beside this one does not pin.
    threads = threads or plan.PLAN.get("threads", PLAN_THREADS)
    torch.set_num_threads(threads)
    probe = probe_mod.Probe("cpu")
    probe_mod.count_pages(rt.ledger)
    pinned = probe_mod.pin_to_one_cpu()
    reals, ledgers, mapped = [], [], []
    for x, y in schedule_batches(body, "random", STEPS, seed=1):
        state = rt.ledger.live_bytes
        rt.ledger.reset_peak()
        with probe.span() as s:
            rt.begin_step(x, y)
            plan.train_step(rt)
        reals.append(state + s.growth)
        ledgers.append(rt.ledger.peak_bytes)
        mapped.append(rt.ledger.mapped_peak - rt.ledger.peak_bytes)
    steady = max(reals[1:])
    return {"model": model, "budget": budget, "target": target, "batch_size": batch_size, "threads": threads,
            "malloc_isolated": isolated, "budget_bytes": c["budget_bytes"], "schedule_peak_bytes": c["peak_bytes"],
            "ledger_peak_bytes": max(ledgers), "state_bytes": c["state_bytes"], "real_first_step_bytes": reals[0],
            "real_bytes": steady, "real_steps_bytes": reals, "ok": steady <= c["budget_bytes"],
            "cpu_pinned": pinned, "page_rounding_bytes": max(mapped[1:]),
            "recomputes": c["recomputes"], "page_ins": c["page_ins"], "page_outs": c["page_outs"]}


def run_child(model: str, budget: str, args, tree: str | None) -> dict:
    """A row in a fresh process; `tree`: a folder holding another version's `edgetrain` package, imported first."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = tree + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", model, budget, "--target", args.target,
           "--batch-size", str(args.batch_size), "--threads", str(args.threads), "--time-limit", str(args.time_limit)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        lines = (r.stderr or r.stdout).strip().splitlines()
        return {"model": model, "budget": budget, "error": lines[-1] if lines else f"exit {r.returncode}"}
    return json.loads(r.stdout.strip().splitlines()[-1])


def _extract(ref: str, into: str) -> str:
    """git `ref`'s tree as an importable `edgetrain` package under `into`."""
    pkg = os.path.join(into, "edgetrain")
    os.makedirs(pkg)
    archive = subprocess.run(["git", "-C", ROOT, "archive", ref], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", pkg], input=archive, check=True)
    return into


def _mb(b) -> str:
    return f"{b / 1e6:.2f}" if isinstance(b, (int, float)) else "-"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet18,mobilenetv2,vgg11,gpt_tiny")
    ap.add_argument("--budgets", default="100%,50%")
    ap.add_argument("--target", default="rpi4")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=0,
                    help="torch intra-op threads (default: the plan's own, its target's cpu_threads)")
    ap.add_argument("--time-limit", type=float, default=20.0, help="solver time limit per compile (s)")
    ap.add_argument("--before", default="main", help="git ref measured beside this tree, or none")
    ap.add_argument("--json", default="build/bench/memory.json", metavar="PATH", help="rows written here")
    ap.add_argument("--child", nargs=2, metavar=("MODEL", "BUDGET"), help=argparse.SUPPRESS)
    ap.add_argument("--fuse", action="store_true", help="--child: a fused plan (compile --fuse)")
    a = ap.parse_args(argv)
    if a.child:
        with tempfile.TemporaryDirectory(prefix="edgetrain-memory-") as work:
            row = child(a.child[0], a.child[1], a.target, a.batch_size, a.threads, a.time_limit, work, a.fuse)
        print(json.dumps(row))
        return 0
    load = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgetrain-memory-before-") as tmp:
        versions = [("this tree", None)]
        if a.before != "none":
            versions.insert(0, (a.before, _extract(a.before, tmp)))
        for model in a.models.split(","):
            for budget in a.budgets.split(","):
                for label, tree in versions:
                    row = run_child(model, budget, a, tree)
                    row["version"] = label
                    rows.append(row)
                    print(f"{model} {budget} {label}: {_mb(row.get('real_bytes'))} MB real, "
                          f"{_mb(row.get('budget_bytes'))} MB budget {row.get('error', '')}", file=sys.stderr)
    load_after = os.getloadavg()
    write_json(a.json, rows, load[0], load_after[0])
    from rich.console import Console
    from rich.table import Table

    threads = a.threads or "each plan's own"
    t = Table(title=f"budget, predicted and real memory of a step ({a.target} plans, batch {a.batch_size}, "
                    f"threads: {threads}; MB = 1e6 B; load {load[0]:.2f} -> {load_after[0]:.2f})")
    for col in ("model", "budget", "version", "budget MB", "schedule peak", "ledger peak", "real (steady)",
                "real - budget", "real <= budget", "real (1st step)"):
        t.add_column(col, justify="right")
    for r in rows:
        if "error" in r:
            t.add_row(r["model"], r["budget"], r["version"], *["-"] * 4, "error", "-")
            continue
        t.add_row(r["model"], r["budget"], r["version"], _mb(r["budget_bytes"]), _mb(r["schedule_peak_bytes"]),
                  _mb(r["ledger_peak_bytes"]), _mb(r["real_bytes"]), _mb(r["real_bytes"] - r["budget_bytes"]),
                  "yes" if r["ok"] else "NO", _mb(r["real_first_step_bytes"]))
    Console(width=170).print(t)
    for r in rows:
        if "error" in r:
            print(f"{r['model']} {r['budget']} {r['version']}: {r['error']}", file=sys.stderr)
    print(f"wrote {a.json}")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
