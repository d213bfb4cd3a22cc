"""Bound ladder: how far each step lifts the POET MILP's proven lower bound, per model, target, budget.

    .venv/bin/python benchmarks/relaxation.py [--models resnet10,resnet18] [--targets nrf52840]
        [--budgets min,40%] [--batch-size 8] [--cut-seconds 60] [--mip-seconds 60] [--threads 1]
        [--out build/bench/relaxation.json]

Every figure is energy added over computing every node once (J), the part a schedule can change:
"LP" the plain LP relaxation; "+window" with window cuts separated until two rounds lift it by less than
0.1% (or `--cut-seconds`); "+memory" with window and memory cuts (cuts.py); "MIP plain" and "MIP cuts" the
bound HiGHS proves in `--mip-seconds` on the plain model and on the model with both cut families; "best" the
cheapest schedule either solve found ("*" when one of them proved it optimal). "closed" is the share of the
LP's gap to the best schedule that the best bound closes. It shows where the smallest budgets stand: what
the relaxation misses, not what the phased solve (benchmarks/solve.py) reaches in its time limit.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from edgetrain.compiler.scheduling.cuts import strengthen  # noqa: E402
from edgetrain.compiler.scheduling.milp import highs  # noqa: E402
from edgetrain.compiler.scheduling.poet import build as build_poet  # noqa: E402
from edgetrain.compiler.scheduling.budget import parse_budget  # noqa: E402
from benchmarks.output import write_json  # noqa: E402
from solve import graph_arguments, training_graph  # noqa: E402


def ladder(model: str, target_name: str, budget_text: str, batch: int, cut_seconds: float, mip_seconds: float,
           threads: int | None = 1) -> dict:
    g, lv, target, anchor = training_graph(model, target_name, batch)
    budget = parse_budget(budget_text).resolve(anchor)
    pm = build_poet(g, lv, target, budget)
    base = pm.base_energy_j
    added = lambda v: None if v is None else v - base  # noqa: E731
    _, window = strengthen(pm, lv, seconds=cut_seconds, max_rounds=1000, threads=threads, memory_cuts=False)
    cut, both = strengthen(pm, lv, seconds=cut_seconds, max_rounds=1000, threads=threads)
    solves = {name: highs.solve(m, time_limit=mip_seconds, mip_gap=1e-6, threads=threads)
              for name, m in (("plain", pm.milp), ("cuts", cut.milp))}
    found = [r for r in solves.values() if r.objective is not None]
    best = min(found, key=lambda r: r.objective) if found else None
    bound = max((r.bound for r in solves.values() if r.bound is not None), default=None)
    lp = added(window.lp_before)  # the plain LP: each cut loop's first round
    closed = None
    if best is not None and lp is not None and bound is not None and added(best.objective) > lp:
        closed = (added(bound) - lp) / (added(best.objective) - lp)
    return {
        "model": model, "target": target_name, "batch": batch, "budget": budget_text, "budget_bytes": budget,
        "vars": pm.milp.n_vars, "rows": pm.milp.n_rows, "base_energy_j": base, "lp": lp,
        "window": added(window.lp_after), "window_cuts": window.cuts, "window_rounds": window.rounds,
        "both": added(both.lp_after), "both_cuts": both.cuts, "memory_cuts": both.memory, "both_rounds": both.rounds,
        "mip_seconds": mip_seconds,
        **{f"mip_{n}": {"status": r.status, "objective": added(r.objective), "bound": added(r.bound),
                        "seconds": round(r.seconds, 2)} for n, r in solves.items()},
        "best": added(best.objective) if best else None,
        "proven": any(r.status == "optimal" for r in solves.values()), "closed": closed,
    }


def _j(v: float | None) -> str:
    return "-" if v is None else f"{v:.4f}"


def table(rows: list[dict]) -> Table:
    t = Table(title="POET bound ladder: energy added over computing every node once (J)")
    for col in ("model", "target", "budget", "vars", "LP", "+window", "+memory", "MIP plain", "MIP cuts", "best",
                "closed"):
        t.add_column(col, justify="right")
    for r in rows:
        best = _j(r["best"]) + ("*" if r["proven"] else "")
        t.add_row(r["model"], r["target"], r["budget"], f"{r['vars']:,}", _j(r["lp"]), _j(r["window"]),
                  _j(r["both"]), _j(r["mip_plain"]["bound"]), _j(r["mip_cuts"]["bound"]), best,
                  "-" if r["closed"] is None else f"{100 * r['closed']:.1f}%")
    return t


def main() -> None:
    ap = graph_arguments(__doc__, "resnet10,resnet18", "nrf52840", "min,40%")
    ap.add_argument("--cut-seconds", type=float, default=60.0, help="most seconds of cut rounds per cut family")
    ap.add_argument("--mip-seconds", type=float, default=60.0, help="seconds of HiGHS per MIP solve")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="build/bench/relaxation.json")
    a = ap.parse_args()
    rows = []
    for tn in a.targets.split(","):
        for m in a.models.split(","):
            for b in a.budgets.split(","):
                rows.append(ladder(m, tn, b, a.batch_size, a.cut_seconds, a.mip_seconds, a.threads))
    Console(width=max(160, Console().width)).print(table(rows))
    write_json(a.out, rows)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
