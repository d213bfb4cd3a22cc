"""POET solve benchmark: per model, target and budget, the MILP's size against the reference
formulation's, the solve (status, incumbent, proven bound, gap, seconds) and every baseline's energy at the
same budget.

    .venv/bin/python benchmarks/solve.py [--models resnet18,vgg16] [--targets rpi4,nrf52840]
        [--budgets 100%,70%,50%,40%,min] [--batch-size 8] [--time-limit 30,resnet50=120]
        [--mip-gap 1e-3,resnet50=1e-2] [--threads 1] [--lns 0.45] [--cuts 0.15]
        [--baselines checkmate,paging,dtr,checkpoint,store-all]
        [--out build/bench/solve.json]

`--models` takes any zoo name. `--time-limit` and `--mip-gap` take a default and optional per-model values.
`min` is the smallest feasible budget (`budget.min_budget`). Prints one table per target and writes JSON.
"ref vars" is the size of the reference POET formulation, 5T^2 + T|E| binaries, for the same graph.
"gap" is relative to the whole energy (what the solver stops at); "extra gap" is the same absolute gap
relative to the energy the schedule adds over computing every node once (recomputes and paging), a stricter
view of the same proof. A baseline that cannot meet the budget is "infeasible".
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.output import write_json  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from edgetrain.compiler.scheduling.budget import anchors, parse_budget  # noqa: E402
from edgetrain.compiler.pipeline import CompileOptions, build_graph  # noqa: E402
from edgetrain.compiler.errors import BudgetError  # noqa: E402
from edgetrain.compiler.graph.liveness import analyze  # noqa: E402
from edgetrain.compiler.scheduling.poet import build as build_poet  # noqa: E402
from edgetrain.compiler.scheduling.schedulers import run_scheduler  # noqa: E402
from edgetrain.compiler.workbench.report import percent  # noqa: E402
from edgetrain.targets import load_target  # noqa: E402

BASELINES = ("checkmate", "paging", "dtr", "checkpoint", "store-all")


def per_model(text: str, cast=float) -> dict[str, float]:
    """`30,resnet50=120` -> {"": 30, "resnet50": 120}: a default and per-model values."""
    out = {}
    for part in str(text).split(","):
        if part.strip():
            name, _, value = part.rpartition("=")
            out[name.strip()] = cast(value)
    if "" not in out:
        raise SystemExit(f"{text!r} needs a default value (e.g. 30,resnet50=120)")
    return out


def training_graph(model: str, target_name: str, batch: int):
    """(graph, liveness, target, the budget anchors) of a zoo model."""
    target = load_target(target_name)
    _, _, g = build_graph(CompileOptions(model=model, target=target_name, budget="100%", out="", batch_size=batch),
                          target)
    lv = analyze(g)
    return g, lv, target, anchors(g, lv, target)


def bench_model(model: str, target_name: str, budgets: list[str], batch: int, time_limit: float,
                mip_gap: float, threads: int | None = None, baselines: tuple[str, ...] = BASELINES,
                lns: float = 0.45, cuts: float = 0.15) -> list[dict]:
    g, lv, target, anchor = training_graph(model, target_name, batch)
    sa = anchor.store_all
    T, E = len(g.nodes), sum(len(n.inputs) for n in g.nodes)
    base_energy = sum(n.energy_j for n in g.nodes)  # every node computed once: no schedule spends less
    rows = []
    for b in budgets:
        budget = parse_budget(b).resolve(anchor)
        size = build_poet(g, lv, target, budget).milp
        t0 = time.perf_counter()
        try:
            s = run_scheduler(g, lv, target, budget, time_limit=time_limit, mip_gap=mip_gap, threads=threads,
                              lns=lns, cuts=cuts)
            err = None
        except Exception as e:  # noqa: BLE001 - a benchmark row records the failure
            s, err = None, f"{type(e).__name__}: {e}"
        wall = time.perf_counter() - t0
        sol = s.solver if s else {}
        extra_gap = None
        if sol.get("objective") is not None and sol.get("bound") is not None:
            extra = sol["objective"] - base_energy
            extra_gap = 0.0 if extra <= 0 else max(0.0, sol["objective"] - sol["bound"]) / extra
        base = {}
        for name in baselines:
            try:
                r = run_scheduler(g, lv, target, budget, scheduler=name, time_limit=time_limit, mip_gap=mip_gap,
                                  threads=threads)
                base[name] = {"energy_j": r.report.energy_j, "status": r.solver.get("status"),
                              "gap": r.solver.get("gap")}
            except BudgetError as e:
                base[name] = {"energy_j": None, "status": "infeasible", "error": str(e)}
        rows.append({
            "model": model, "target": target_name, "batch": batch, "budget": b, "budget_bytes": budget,
            "min_feasible_bytes": anchor.min_feasible_bytes, "nodes": T, "edges": E, "ref_vars": 5 * T * T + T * E,
            "vars": size.n_vars, "constraints": size.n_rows, "time_limit": time_limit, "mip_gap": mip_gap,
            "schedule": s.name if s else None, "status": sol.get("status", "error"),
            "solver": sol.get("name"), "objective": sol.get("objective"), "bound": sol.get("bound"),
            "gap": sol.get("gap"), "extra_gap": extra_gap, "solve_s": sol.get("seconds"), "wall_s": wall,
            "solver_vars": sol.get("variables"), "solver_rows": sol.get("constraints"),
            "warm_start": sol.get("warm_start"), "greedy_starts": sol.get("greedy_starts"), "lns": lns, "cuts": sol.get("cuts"), "notice": sol.get("notice"),
            "energy_j": s.report.energy_j if s else None, "base_energy_j": base_energy,
            "added_energy_j": s.report.energy_j - base_energy if s else None,
            "store_all_energy_j": sa.energy_j, "peak_bytes": s.report.peak_bytes if s else None,
            "store_all_peak_bytes": sa.peak_bytes, "recomputes": s.report.recomputes if s else None,
            "page_ins": s.report.page_ins if s else None, "baselines": base, "error": err,
        })
    return rows



def table(rows: list[dict], title: str) -> Table:
    names = list(rows[0]["baselines"]) if rows else []
    t = Table(title=title)
    for col in ("model", "budget", "MB", "ref vars", "vars", "rows", "solve s", "status", "gap", "extra gap",
                "POET J", *[f"{n} vs POET" for n in names]):
        t.add_column(col, justify="right")
    for r in rows:
        cells = []
        for n in names:
            b = r["baselines"][n]
            if b["energy_j"] is None:
                cells.append(b["status"])
            elif r["energy_j"]:
                cells.append(f"{100 * (b['energy_j'] / r['energy_j'] - 1):+.2f}%")  # < 0: within POET's gap
            else:
                cells.append(f"{b['energy_j']:.4g} J")
        t.add_row(r["model"], r["budget"], f"{r['budget_bytes'] / 1e6:.2f}", f"{r['ref_vars']:,}", f"{r['vars']:,}",
                  f"{r['constraints']:,}", f"{r['solve_s'] or 0:.2f}", r["status"], percent(r["gap"]),
                  percent(r["extra_gap"]), "-" if r["energy_j"] is None else f"{r['energy_j']:.4f}", *cells)
    return t


def graph_arguments(doc: str, models: str, targets: str, budgets: str) -> argparse.ArgumentParser:
    """A benchmark's parser with the options every benchmark over zoo graphs takes."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--models", default=models, help="zoo names, comma-separated")
    ap.add_argument("--targets", "--target", default=targets)
    ap.add_argument("--budgets", default=budgets, help="comma-separated; min is the smallest feasible budget")
    ap.add_argument("--batch-size", type=int, default=8)
    return ap


def main() -> None:
    ap = graph_arguments(__doc__, "resnet18,vgg16", "rpi4,nrf52840", "100%,70%,50%,40%,min")
    ap.add_argument("--time-limit", default="30,resnet50=120", help="seconds per solve: default[,model=s...]")
    ap.add_argument("--mip-gap", default="1e-3,resnet50=1e-2",
                    help="relative gap at which a solve stops, proven: default[,model=gap...]")
    ap.add_argument("--threads", type=int, default=None, help="solver threads (default: the solver's own)")
    ap.add_argument("--lns", type=float, default=0.45,
                    help="share of the time limit for large-neighbourhood search when 20%% of it does not prove "
                         "the gap (0: one plain solve)")
    ap.add_argument("--cuts", type=float, default=0.15,
                    help="most share of the time limit spent adding window and memory cuts before a phased solve's "
                         "last solve (0: none)")
    ap.add_argument("--baselines", default=",".join(BASELINES), help="schedulers to compare ('' for none)")
    ap.add_argument("--out", default="build/bench/solve.json")
    a = ap.parse_args()
    limits, gaps = per_model(a.time_limit), per_model(a.mip_gap)
    baselines = tuple(n for n in a.baselines.split(",") if n)
    rows = []
    for tn in a.targets.split(","):
        mine = []
        for m in a.models.split(","):
            mine += bench_model(m, tn, a.budgets.split(","), a.batch_size, limits.get(m, limits[""]),
                                gaps.get(m, gaps[""]), a.threads, baselines, a.lns, a.cuts)
        Console(width=max(200, Console().width)).print(
            table(mine, f"POET solves on {tn}, batch {a.batch_size} (baselines: extra energy over POET's)"))
        rows += mine
    write_json(a.out, rows)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
