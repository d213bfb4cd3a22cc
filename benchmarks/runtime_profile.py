"""Where a plan's step and a plain PyTorch step differ, op by op (torch.profiler, self CPU time per aten op).

    .venv/bin/python benchmarks/runtime_profile.py [--models resnet18,mobilenetv2] [--budget 100%] [--steps 8]
                                                   [--warmup 2] [--rows 25] [--json build/bench/runtime_profile.json]

Per model: compiled at the budget (POET, rpi4, batch 8), then the runtime's step and a plain PyTorch step (same
weights, batches and SGD, as in benchmarks/runtime.py) alternate in one process at one thread, each timed step
under torch.profiler. Per aten op (by name) the table gives the smallest total self time it took in any one
step on each side (other processes' load only ever adds time, so the minimum is the steadiest figure), its
calls per step, and the difference; a step's time outside aten ops (Python: the executor, modules, autograd's
engine, the optimizer loop) is its profiled wall time less the self time of every aten op in it (median).
The profiler adds a few microseconds per op to both sides. Prints the table, writes the rows as JSON.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from benchmarks.output import write_json  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from benchmarks.runtime import _torch_step, plan_runtime, pytorch_side  # noqa: E402
from edgetrain.compiler.pipeline import CompileOptions, compile_model  # noqa: E402
from edgetrain.compiler.schedule_file import format as schedule_format  # noqa: E402
from edgetrain.compiler.workbench.run import schedule_batches  # noqa: E402
from edgetrain.runtime.python import load_plan  # noqa: E402


def _profiled(fn) -> tuple[float, dict[str, tuple[float, int]]]:
    """(wall seconds, {aten op: (self seconds, calls)}) of one call of fn under the profiler."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        fn()
        wall = time.perf_counter() - t0
    return wall, {e.key: (e.self_cpu_time_total / 1e6, e.count) for e in prof.key_averages()
                  if e.key.startswith("aten::")}


def profile_model(model: str, budget: str, args, work: str) -> dict:
    out = os.path.join(work, f"{model}-{budget.replace('%', 'pct')}")
    compile_model(CompileOptions(model=model, target="rpi4", budget=budget, out=out, batch_size=8,
                                 time_limit=args.time_limit))
    body = schedule_format.load(out)
    rt = plan_runtime(body, out, os.path.join(work, "pages"))
    plan = load_plan(out)
    ref, opt = pytorch_side(body, out)

    def runtime_step(x, y):
        rt.begin_step(x, y)
        plan.train_step(rt)

    sides = {"runtime": runtime_step, "pytorch": lambda x, y: _torch_step(ref, opt, x, y)}
    least: dict[str, dict[str, float]] = {s: {} for s in sides}
    calls: dict[str, Counter] = {s: Counter() for s in sides}
    walls: dict[str, list[float]] = {s: [] for s in sides}
    outside: dict[str, list[float]] = {s: [] for s in sides}
    for k, (x, y) in enumerate(schedule_batches(body, "random", args.warmup + args.steps, seed=1)):
        for side in (list(sides) if k % 2 == 0 else list(sides)[::-1]):  # alternate who goes first
            if k < args.warmup:
                sides[side](x, y)
                continue
            wall, ops = _profiled(lambda: sides[side](x, y))
            walls[side].append(wall)
            outside[side].append(wall - sum(s for s, _ in ops.values()))
            for op, (s, n) in ops.items():
                least[side][op] = min(least[side].get(op, float("inf")), s)
                calls[side][op] = n
    ops = sorted(set(least["runtime"]) | set(least["pytorch"]),
                 key=lambda o: -abs(least["runtime"].get(o, 0.0) - least["pytorch"].get(o, 0.0)))
    return {
        "model": model, "budget": budget, "steps": args.steps,
        "wall_s": {s: statistics.median(v) for s, v in walls.items()},
        "outside_aten_s": {s: statistics.median(v) for s, v in outside.items()},
        "least_aten_sum_s": {s: sum(v.values()) for s, v in least.items()},
        "in_place_ops_per_step": rt.in_place_ops / (args.warmup + args.steps),
        "ops": [{"op": o, "runtime_s": least["runtime"].get(o, 0.0), "pytorch_s": least["pytorch"].get(o, 0.0),
                 "runtime_calls": calls["runtime"][o], "pytorch_calls": calls["pytorch"][o]} for o in ops],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet18,mobilenetv2")
    ap.add_argument("--budget", default="100%")
    ap.add_argument("--steps", type=int, default=8, help="profiled steps of each side, after the warm-up")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rows", type=int, default=25, help="ops shown per model (largest differences first)")
    ap.add_argument("--time-limit", type=float, default=30.0, help="solver time limit per compile (s)")
    ap.add_argument("--json", default="build/bench/runtime_profile.json", metavar="PATH", help="rows written here")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="edgetrain-profile-") as work:
        results = [profile_model(m, a.budget, a, work) for m in a.models.split(",")]
    load_after = os.getloadavg()[0]
    con = Console(width=140)
    for r in results:
        t = Table(title=f"{r['model']} at {r['budget']}: least self time per step, ms (of {r['steps']} profiled steps "
                        f"each; load {load:.2f} -> {load_after:.2f})")
        for col in ("aten op", "runtime", "PyTorch", "difference", "calls (runtime / PyTorch)"):
            t.add_column(col, justify="right")
        for o in r["ops"][:a.rows]:
            t.add_row(o["op"], f"{o['runtime_s'] * 1e3:.2f}", f"{o['pytorch_s'] * 1e3:.2f}",
                      f"{(o['runtime_s'] - o['pytorch_s']) * 1e3:+.2f}", f"{o['runtime_calls']} / {o['pytorch_calls']}")
        con.print(t)
        w, o, s = r["wall_s"], r["outside_aten_s"], r["least_aten_sum_s"]
        con.print(f"profiled step (median): runtime {w['runtime'] * 1e3:.1f} ms, PyTorch {w['pytorch'] * 1e3:.1f} ms; "
                  f"outside aten ops {o['runtime'] * 1e3:.1f} vs {o['pytorch'] * 1e3:.1f} ms; sum of the ops' least "
                  f"times {s['runtime'] * 1e3:.1f} vs {s['pytorch'] * 1e3:.1f} ms; ops run in place per step "
                  f"{r['in_place_ops_per_step']:.0f}")
    write_json(a.json, results, load, load_after)
    print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
