"""Host costs benchmark: a `--target host` plan's predicted step time beside the measured one.

    .venv/bin/python benchmarks/host_costs.py [--models small_cnn,resnet18,mobilenetv2,gpt_tiny]
                                              [--budgets 100%,50%] [--batch-size 8] [--steps 7] [--warmup 2]
                                              [--time-limit 30] [--json build/bench/host_costs.json]

Per (model, budget): the model is compiled for the host (its nodes timed by the profiler on this machine) at
the budget, then its plan trains --warmup untimed and --steps timed steps on random batches through the
runtime's Trainer, with torch on the runtime's plan thread count (the one the profiler times with). A row
gives the schedule's predicted step time, the measured median and minimum, and predicted / measured for
both; and the median CPU time of the process over a step (every thread's: the page store's too), which
other processes' load moves far less than wall time, with predicted / that and / its minimum (the profiler's
node times are minima). Prints a table with the 1-minute load average before and after, and writes the rows as JSON.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.output import write_json  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from edgetrain.compiler.pipeline import CompileOptions, compile_model  # noqa: E402
from edgetrain.compiler.schedule_file import format as schedule_format  # noqa: E402
from edgetrain.compiler.workbench.run import schedule_batches  # noqa: E402
from edgetrain.runtime.python import Trainer  # noqa: E402
from edgetrain.runtime.python.threads import PLAN_THREADS, pinned_threads  # noqa: E402


def bench(model: str, budget: str, args, work: str) -> dict:
    out = os.path.join(work, f"{model}-{budget.replace('%', 'pct')}")
    t0 = time.perf_counter()
    compile_model(CompileOptions(model=model, target="host", budget=budget, out=out, batch_size=args.batch_size,
                                 time_limit=args.time_limit))
    compile_s = time.perf_counter() - t0
    body = schedule_format.load(out)
    row = {"model": model, "budget": budget, "batch_size": args.batch_size, "threads": PLAN_THREADS,
           "compile_s": compile_s, "predicted_s": body["predicted"]["time_s"]}
    for action, key in (("recompute", "recomputes"), ("page_in", "page_ins"), ("page_out", "page_outs")):
        row[key] = sum(st["action"] == action for st in body["steps"])
    steps, cpu = [], []
    with Trainer(out) as trainer, pinned_threads():
        for k, (x, y) in enumerate(schedule_batches(body, "random", args.warmup + args.steps, seed=1)):
            start, start_cpu = time.perf_counter(), time.process_time()
            trainer.step(x, y)
            if k >= args.warmup:
                steps.append(time.perf_counter() - start)
                cpu.append(time.process_time() - start_cpu)
    row["measured_steps_s"] = steps
    row["measured_cpu_steps_s"] = cpu
    row["measured_cpu_median_s"] = statistics.median(cpu)
    row["predicted_over_cpu"] = row["predicted_s"] / row["measured_cpu_median_s"]
    row["predicted_over_cpu_min"] = row["predicted_s"] / min(cpu)  # the profiler's nodes are minima too
    row["measured_median_s"] = statistics.median(steps)
    row["measured_min_s"] = min(steps)
    row["predicted_over_median"] = row["predicted_s"] / row["measured_median_s"]
    row["predicted_over_min"] = row["predicted_s"] / row["measured_min_s"]
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="small_cnn,resnet18,mobilenetv2,gpt_tiny")
    ap.add_argument("--budgets", default="100%,50%")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=7, help="timed steps, after the warm-up")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--time-limit", type=float, default=30.0, help="solver time limit per compile (s)")
    ap.add_argument("--json", default="build/bench/host_costs.json", metavar="PATH", help="rows written here")
    a = ap.parse_args(argv)
    rows = []
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="edgetrain-hostcosts-") as work:
        for model in a.models.split(","):
            for budget in a.budgets.split(","):
                try:
                    rows.append(bench(model, budget, a, work))
                except Exception as e:  # noqa: BLE001 - a benchmark row records the failure
                    rows.append({"model": model, "budget": budget, "error": str(e)})
    load_after = os.getloadavg()
    write_json(a.json, rows, load[0], load_after[0])
    t = Table(title=f"host plans: predicted vs measured step ({PLAN_THREADS} thread(s), batch {a.batch_size}, "
                    f"{a.steps} steps after {a.warmup}; load {load[0]:.2f} -> {load_after[0]:.2f} on "
                    f"{os.cpu_count()} cores)")
    for col in ("model", "budget", "rec/pin/pout", "predicted ms", "measured median ms", "measured min ms",
                "pred/median", "pred/min", "step CPU ms", "pred/CPU", "pred/CPU min"):
        t.add_column(col, justify="right")
    for r in rows:
        if "error" in r:
            t.add_row(r["model"], r["budget"], "-", "-", "-", "-", "error", "-", "-", "-", "-")
            continue
        t.add_row(r["model"], r["budget"], f"{r['recomputes']}/{r['page_ins']}/{r['page_outs']}",
                  f"{r['predicted_s'] * 1e3:.1f}", f"{r['measured_median_s'] * 1e3:.1f}",
                  f"{r['measured_min_s'] * 1e3:.1f}", f"{r['predicted_over_median']:.2f}x",
                  f"{r['predicted_over_min']:.2f}x", f"{r['measured_cpu_median_s'] * 1e3:.1f}",
                  f"{r['predicted_over_cpu']:.2f}x", f"{r['predicted_over_cpu_min']:.2f}x")
    Console(width=160).print(t)
    for r in rows:
        if r.get("error"):
            print(f"{r['model']} {r['budget']}: {r['error']}", file=sys.stderr)
    print(f"wrote {a.json}")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
