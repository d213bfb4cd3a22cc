"""POET solve benchmark: per model and budget, graph size, MILP size, solve time, status, gap, energy.

    .venv/bin/python benchmarks/solve.py [--models resnet18,vgg16] [--target rpi4] [--budgets 100%,70%,50%,40%]
                                         [--batch-size 8] [--time-limit 60] [--out build/bench/solve.json]

Prints a table and writes JSON. "ref vars" is the size of the reference POET formulation,
5T^2 + T|E| binaries, for the same training graph.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from compiler.budget import parse_budget  # noqa: E402
from compiler.compile import CompileOptions, build_graph  # noqa: E402
from compiler.decisions import build_steps  # noqa: E402
from compiler.liveness import analyze  # noqa: E402
from compiler.poet import build as build_poet  # noqa: E402
from compiler.schedulers import min_budget, run_scheduler, store_all  # noqa: E402
from compiler.validator import validate  # noqa: E402
from targets import load_target  # noqa: E402


def bench_model(model: str, target_name: str, budgets: list[str], batch: int, time_limit: float) -> list[dict]:
    target = load_target(target_name)
    _, _, g = build_graph(CompileOptions(model=model, target=target_name, budget="100%", out="", batch_size=batch),
                          target)
    lv = analyze(g)
    sa = validate(g, build_steps(g, lv, store_all(g, lv)), target, None)
    act = max(p - g.nodes[t].workspace_bytes for t, p in enumerate(sa.stage_peaks)) - lv.state_bytes
    T, E = len(g.nodes), sum(len(n.inputs) for n in g.nodes)
    rows = []
    for b in budgets:
        budget = parse_budget(b).resolve(lv.fixed_bytes, act)
        model_size = build_poet(g, lv, target, budget).milp
        t0 = time.perf_counter()
        try:
            s = run_scheduler(g, lv, target, budget, time_limit=time_limit)
            err = None
        except Exception as e:  # noqa: BLE001 - a benchmark row records the failure
            s, err = None, str(e)
        wall = time.perf_counter() - t0
        rows.append({
            "model": model, "target": target_name, "batch": batch, "budget": b, "budget_bytes": budget,
            "min_feasible_bytes": min_budget(lv), "nodes": T, "edges": E, "ref_vars": 5 * T * T + T * E,
            "vars": model_size.n_vars, "constraints": model_size.n_rows,
            "schedule": s.name if s else None, "status": s.solver.get("status") if s else "error",
            "solver": s.solver.get("name") if s else None, "gap": s.solver.get("gap") if s else None,
            "solve_s": s.solver.get("seconds") if s else None, "wall_s": wall,
            "energy_j": s.report.energy_j if s else None, "store_all_energy_j": sa.energy_j,
            "energy_vs_store_all": (s.report.energy_j / sa.energy_j - 1) if s else None,
            "peak_bytes": s.report.peak_bytes if s else None, "store_all_peak_bytes": sa.peak_bytes,
            "recomputes": s.report.recomputes if s else None, "page_ins": s.report.page_ins if s else None,
            "error": err,
        })
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet18,vgg16")
    ap.add_argument("--target", default="rpi4")
    ap.add_argument("--budgets", default="100%,70%,50%,40%")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--out", default="build/bench/solve.json")
    a = ap.parse_args()
    rows = []
    for m in a.models.split(","):
        rows += bench_model(m, a.target, a.budgets.split(","), a.batch_size, a.time_limit)
    t = Table(title=f"POET solves on {a.target}, batch {a.batch_size}, time limit {a.time_limit:g} s")
    for col in ("model", "budget", "MB", "nodes", "ref vars", "vars", "rows", "solve s", "status", "gap",
                "kept", "energy vs store-all", "recomp", "page-in"):
        t.add_column(col, justify="right")
    for r in rows:
        gap = "-" if r["gap"] is None else f"{100 * r['gap']:.3f}%"
        ev = "-" if r["energy_vs_store_all"] is None else f"+{100 * r['energy_vs_store_all']:.3f}%"
        t.add_row(r["model"], r["budget"], f"{r['budget_bytes'] / 1e6:.2f}", str(r["nodes"]), f"{r['ref_vars']:,}",
                  f"{r['vars']:,}", f"{r['constraints']:,}", f"{r['solve_s'] or 0:.2f}", r["status"], gap,
                  str(r["schedule"]), ev, str(r["recomputes"]), str(r["page_ins"]))
    Console(width=max(160, Console().width)).print(t)
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(rows, f, indent=1)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
