"""`edgetrain plot DIR`: figures of a sweep (see `sweep.py`), PNG and SVG in DIR/plots/, and DIR/report.html.

- energy_vs_budget, time_vs_budget: the overhead over store-all (plain backprop) in percent against the
  budget in percent of store-all's activation peak (MB on the top axis), one panel per deadline, every
  scheduler in every panel; a combination without a schedule is a cross in the strip under its panel and
  is listed with the reason;
- energy_vs_time: the deadline trade-off, one panel per budget: every solved combination and the Pareto
  front (no other point is both faster and cheaper);
- schedule_<key>: one solve's tensor x stage matrices (see `plot_schedule.py`);
- memory_<key>: that solve's memory stacked by category at each stage's peak against the budget
  (`--memory-steps`: one column per runtime step).
The default solve: POET's at the tightest budget it met (deadline none preferred) whose solve file exists.
Each figure's drawn data comes back in the result's `data`, so what a figure shows can be checked.
"""
from __future__ import annotations

import json
import math
import os
import textwrap

from edgetrain.compiler.errors import EdgetrainError

from .figures import budget_percent, infeasible_reason, mpl, save, scheduler_style
from .plot_schedule import plot_matrices, plot_memory, schedule_matrices
from .memory_breakdown import breakdown

STORE_ALL_KEYS = {"energy_j": "store_all_energy_j", "time_s": "store_all_time_s"}
# Legend texts, each also the label of the artists it stands for (so a figure can be checked against its legend).
GAP_LABEL = "down to the MILP's proven bound (gap)"
STORE_ALL_LABEL = "store-all (plain backprop)"
MIN_BUDGET_LABEL = "smallest feasible budget"
NO_SCHEDULE_LABEL = "no schedule (strip under the panel)"
FRONT_LABEL = "Pareto front (nothing both faster and cheaper)"
DEADLINE_LABEL = "deadline"

__all__ = ["plot_sweep", "versus_budget", "energy_vs_time", "deadline_panels", "budget_percent", "pareto_front",
           "memory_curve", "schedule_matrices", "budget_order"]


def _load(d: str):
    from .sweep import read_rows

    if not os.path.exists(os.path.join(d, "rows.jsonl")):
        raise EdgetrainError(f"{d} holds no sweep (no rows.jsonl); run `edgetrain sweep ... --out {d}` first")
    with open(os.path.join(d, "sweep.json")) as f:
        meta = json.load(f)
    return meta, read_rows(d)


def memory_curve(graph, steps: list[dict]) -> tuple[list[int], list[int]]:
    """Bytes resident after each step, and the bytes while each step runs (a node: its output and workspace),
    with the validator's accounting (see `memory_breakdown`)."""
    b = breakdown(graph, steps)
    return b.after, [max(a, sum(c.values())) for a, c in zip(b.after, b.steps)]


def deadline_panels(meta: dict, rows: list[dict]) -> list[str]:
    """The deadlines to draw, one panel each: the sweep's order, those with at least one row ("none" if no row)."""
    seen = {r["deadline"] for r in rows}
    order = [d for d in meta.get("deadlines", []) if d in seen]
    order += sorted(seen - set(order))
    return order or ["none"]


def _deadline_short(d: str) -> str:
    return d if d == "none" or d.endswith("s") else f"{d}x"


def _deadline_title(d: str) -> str:
    if d == "none":
        return "no deadline"
    return f"deadline {d}" if d.endswith("s") else f"deadline {d}x store-all time"


def _mb_of_percent(meta: dict):
    peak = meta["store_all_peak_bytes"]  # what 100% is
    return (lambda p: p / 100.0 * peak / 1e6), (lambda mb: 100.0 * mb * 1e6 / peak)


def _overhead(meta: dict, row: dict, field: str) -> float | None:
    base, v = meta.get(STORE_ALL_KEYS[field]), row.get(field)
    if v is None or not base:
        return None
    return 100.0 * (v / base - 1.0)


def _schedulers(meta: dict, rows: list[dict]) -> list[str]:
    names = [s for s in meta.get("schedulers", []) if any(r["scheduler"] == s for r in rows)]
    return names + sorted({r["scheduler"] for r in rows} - set(names))


def budget_order(meta: dict, rows: list[dict]) -> list[str]:
    """Budgets of the sweep, loosest first (by bytes)."""
    by = {}
    for r in rows:
        by.setdefault(r["budget"], r["budget_bytes"])
    return sorted(by, key=lambda b: -by[b])


def _scale(ax, values: list[float], axis: str = "y") -> str:
    """Linear, or symlog when positive overheads span more than a decade (0.05% and 300% both readable); the
    limits are set here to hold every value and 0 (autoscaling would miss the dodged series: their transform
    is offset from the data's, and matplotlib counts only data-space artists)."""
    import numpy as np
    from matplotlib.ticker import FuncFormatter

    vals = [float(v) for v in values if v is not None and math.isfinite(v)] + [0.0]
    pos = [v for v in vals if v > 0]
    ax_ = ax.yaxis if axis == "y" else ax.xaxis
    scale = "linear"
    if pos and max(pos) / min(pos) > 10:
        thresh = 10 ** math.floor(math.log10(min(pos)))
        (ax.set_yscale if axis == "y" else ax.set_xscale)("symlog", linthresh=thresh, linscale=0.5)
        scale = "symlog"
    ax_.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}%"))
    # A margin of 8% of the span, measured in the scale's own units, so a marker on the edge stays whole.
    tr = ax_.get_transform()
    lo, hi = tr.transform(np.array([min(vals), max(vals)]))
    pad = 0.08 * (hi - lo) if hi > lo else 1.0
    lo, hi = tr.inverted().transform(np.array([lo - pad, hi + pad]))
    (ax.set_ylim if axis == "y" else ax.set_xlim)(lo, hi)
    return scale


def _layers(scheds: list[str]) -> dict[str, int]:
    """A z-order per scheduler: the largest markers lowest, so a smaller one on a coinciding point shows on top."""
    sizes = sorted(range(len(scheds)), key=lambda k: (-scheduler_style(scheds[k], k)["ms"], k))
    return {scheds[k]: 3 + rank for rank, k in enumerate(sizes)}


def _dodge(ax, k: int, n: int):
    """A transform that shifts scheduler k of n sideways by a few points, so coinciding series stay apart
    (the data are unchanged: the shift is in points on the page, not in budget)."""
    from matplotlib.transforms import offset_copy

    return offset_copy(ax.transData, fig=ax.figure, x=3.0 * (k - (n - 1) / 2), y=0, units="points")


def _plain(marker_style: dict, line: bool = True) -> dict:
    """Hollow markers (coinciding points of different schedulers show through each other)."""
    st = dict(marker_style)
    if not line:
        st["ls"] = "none"
    st["markerfacecolor"] = "none"
    st["markeredgewidth"] = 1.5
    return st


def versus_budget(meta: dict, rows: list[dict], field: str, what: str):
    """Overhead of `field` over store-all against the budget, one panel per deadline. Returns (fig, data)."""
    plt = mpl()
    from matplotlib.lines import Line2D

    deadlines = deadline_panels(meta, rows)
    scheds = _schedulers(meta, rows)
    n = len(deadlines)
    fig = plt.figure(figsize=(1.2 + 4.3 * n, 5.6))
    gs = fig.add_gridspec(2, n, height_ratios=[1, 0.07 + 0.045 * len(scheds)], hspace=0.08, wspace=0.08,
                          left=0.08, right=0.97)
    mains, strips = [], []
    for k in range(n):
        ax = fig.add_subplot(gs[0, k], sharey=mains[0] if mains else None)
        mains.append(ax)
        strips.append(fig.add_subplot(gs[1, k], sharex=ax))
    to_mb, to_pct = _mb_of_percent(meta)
    data: dict = {"field": field, "panels": {}}
    values = [_overhead(meta, r, field) for r in rows if r["status"] == "ok"]
    mf = meta.get("min_feasible_bytes")
    xs_all = [budget_percent(meta, r["budget_bytes"]) for r in rows]
    layer = _layers(scheds)
    for ax, strip, dl in zip(mains, strips, deadlines):
        panel = {"points": {}, "infeasible": {}}
        for k, s in enumerate(scheds):
            st = scheduler_style(s, k)
            mine = [r for r in rows if r["scheduler"] == s and r["deadline"] == dl]
            pts = sorted((budget_percent(meta, r["budget_bytes"]), _overhead(meta, r, field), r["budget"])
                         for r in mine if r["status"] == "ok" and r.get(field) is not None)
            bad = sorted((budget_percent(meta, r["budget_bytes"]), r["budget"], infeasible_reason(r.get("error")))
                         for r in mine if r["status"] != "ok")
            panel["points"][s], panel["infeasible"][s] = pts, bad
            if field == "energy_j":  # a time-limited MILP: a whisker down to the energy it proved (its gap)
                gaps = [(budget_percent(meta, r["budget_bytes"]), _overhead(meta, r, field),
                         100.0 * (r[field] * (1 - r["solver_gap"]) / meta[STORE_ALL_KEYS[field]] - 1.0))
                        for r in mine if r["status"] == "ok" and (r.get("solver_gap") or 0) > 0]
                panel.setdefault("bounds", {})[s] = [(x, lo) for x, _, lo in gaps]
                if gaps:
                    ax.vlines([g[0] for g in gaps], [g[2] for g in gaps], [g[1] for g in gaps], color=st["color"],
                              lw=2.2, alpha=0.45, zorder=2, transform=_dodge(ax, k, len(scheds)), label=GAP_LABEL)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], zorder=layer[s], lw=1.4, label=s,
                        transform=_dodge(ax, k, len(scheds)), **_plain(st))
            if bad:
                strip.plot([b[0] for b in bad], [k] * len(bad), ls="none", marker="x", ms=7, mew=1.8,
                           color=st["color"], zorder=3, label=NO_SCHEDULE_LABEL, gid=s)
        ax.axhline(0, color="black", lw=0.9, ls=(0, (1, 1)), zorder=1, label=STORE_ALL_LABEL)
        if field == "time_s" and dl != "none":  # the panel's deadline as a line: what the time must stay under
            limit = _deadline_overhead(meta, dl)
            ax.axhline(limit, color="gray", ls=":", lw=1.2, zorder=1)
            ax.text(1.0, limit, "deadline ", transform=ax.get_yaxis_transform(), ha="right", va="bottom",
                    fontsize=7, color="gray")
            values.append(limit)
        if mf:
            for a in (ax, strip):
                a.axvline(budget_percent(meta, mf), color="red", ls="--", lw=1, zorder=1, label=MIN_BUDGET_LABEL)
        ax.set_title(_deadline_title(dl), fontsize=10, pad=28)
        ax.grid(alpha=0.3)
        sec = ax.secondary_xaxis("top", functions=(to_mb, to_pct))
        sec.set_xlabel("budget (MB)", fontsize=8)
        sec.tick_params(labelsize=7)
        ax.tick_params(labelbottom=False)
        strip.set_ylim(-0.6, len(scheds) - 0.4)
        strip.set_yticks(range(len(scheds)))
        strip.set_yticklabels(scheds if ax is mains[0] else [], fontsize=7)
        strip.invert_yaxis()
        strip.set_xlabel("budget (% of store-all's activation peak, above the fixed state)", fontsize=8)
        strip.grid(axis="x", alpha=0.3)
        lines = []
        for s in scheds:
            by_reason: dict[str, list[str]] = {}
            for b in panel["infeasible"][s]:
                by_reason.setdefault(b[2], []).append(b[1])
            if by_reason:
                lines.append(f"{s}: " + "; ".join(f"{', '.join(v)} ({why})" for why, v in by_reason.items()))
        # Under the strip's axis label, whatever the strip's height (x in the strip's width, y from the label).
        strip.annotate("no schedule:\n" + "\n".join(lines) if lines else "every combination has a schedule",
                       xy=(0.0, 0.0), xycoords=("axes fraction", strip.xaxis.label), xytext=(0, -6),
                       textcoords="offset points", va="top", fontsize=7, color="#333333")
        if not any(panel["points"].values()):
            ax.text(0.5, 0.5, "no solved combination", transform=ax.transAxes, ha="center")
        data["panels"][dl] = panel
    for ax in mains[1:]:
        ax.tick_params(labelleft=False)
    if xs_all:
        lo, hi = min(xs_all), max(xs_all)
        pad = max(2.0, 0.06 * (hi - lo))
        mains[0].set_xlim(lo - pad, hi + pad)
    values += [lo for p in data["panels"].values() for v in p.get("bounds", {}).values() for _, lo in v]
    data["yscale"] = _scale(mains[0], values)
    mains[0].set_ylabel(f"{what} over store-all (%)")
    strips[0].set_ylabel("no\nschedule", fontsize=7, rotation=0, ha="right", va="center")
    # One entry per scheduler with a point or a cross somewhere; the other entries only for what was drawn.
    handles, labels = [], []
    for k, s in enumerate(scheds):
        if any(p["points"][s] or p["infeasible"][s] for p in data["panels"].values()):
            handles.append(Line2D([], [], lw=1.4, **_plain(scheduler_style(s, k))))
            labels.append(s)
    if any(b for p in data["panels"].values() for b in p.get("bounds", {}).values()):
        handles.append(Line2D([], [], color="gray", lw=2.2, alpha=0.45))
        labels.append(GAP_LABEL)
    handles.append(Line2D([], [], color="black", lw=0.9, ls=(0, (1, 1))))
    labels.append(STORE_ALL_LABEL)
    if mf:
        handles.append(Line2D([], [], color="red", ls="--", lw=1))
        labels.append(MIN_BUDGET_LABEL)
    if any(b for p in data["panels"].values() for b in p["infeasible"].values()):
        handles.append(Line2D([], [], color="gray", ls="none", marker="x", ms=7, mew=1.8))
        labels.append(NO_SCHEDULE_LABEL)
    fig.legend(handles, labels, loc="upper left", bbox_to_anchor=(0.975, 0.92), fontsize=8, frameon=False)
    fig.suptitle(f"{what.capitalize()} vs budget: {meta['model']} on {meta['target']}, batch {meta['batch_size']}",
                 fontsize=11, y=1.02)
    return fig, data


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other point beats in both coordinates (time, energy), by increasing time."""
    front, best = [], math.inf
    for x, y in sorted(set(points)):
        if y < best:
            front.append((x, y))
            best = y
    return front


def _deadline_overhead(meta: dict, d: str) -> float | None:
    """A deadline of the sweep as time over store-all's, in percent (None: no deadline)."""
    from edgetrain.compiler.scheduling.budget import parse_deadline

    if d == "none":
        return None
    return 100.0 * (parse_deadline(d, meta["store_all_time_s"]) / meta["store_all_time_s"] - 1.0)


def energy_vs_time(meta: dict, rows: list[dict]):
    """Energy overhead against time overhead per budget, with the Pareto front. Returns (fig, data)."""
    plt = mpl()
    from matplotlib.lines import Line2D

    budgets = budget_order(meta, rows)
    scheds = _schedulers(meta, rows)
    ncol = min(3, len(budgets))
    nrow = math.ceil(len(budgets) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(1.5 + 4.0 * ncol, 0.6 + 3.6 * nrow), squeeze=False,
                             sharex=True, sharey=True)
    data: dict = {"panels": {}}
    ok = [r for r in rows if r["status"] == "ok"]
    deadlines = [d for d in deadline_panels(meta, rows) if d != "none"]
    layer = _layers(scheds)
    drawn: set[str] = set()
    for idx, b in enumerate(budgets):
        ax = axes[idx // ncol][idx % ncol]
        mine = [r for r in ok if r["budget"] == b]
        pts = []
        for k, s in enumerate(scheds):
            st = scheduler_style(s, k)
            sp = [(_overhead(meta, r, "time_s"), _overhead(meta, r, "energy_j"), r["deadline"]) for r in mine
                  if r["scheduler"] == s]
            if sp:
                ax.plot([p[0] for p in sp], [p[1] for p in sp], zorder=layer[s], label=s,
                        transform=_dodge(ax, k, len(scheds)), **_plain(st, line=False))
                drawn.add(s)
            pts += [(p[0], p[1]) for p in sp]
        front = pareto_front(pts)
        if front:
            fx, fy = [p[0] for p in front], [p[1] for p in front]
            ax.step(fx, fy, where="post", color="black", lw=2.5, alpha=0.18, zorder=1, label=FRONT_LABEL)
            ax.plot(fx, fy, ls="none", marker="o", ms=3, color="black", zorder=20, label=FRONT_LABEL)
            drawn.add(FRONT_LABEL)
        for d in deadlines:
            x = _deadline_overhead(meta, d)
            if x is not None:
                ax.axvline(x, color="gray", ls=":", lw=1, label=DEADLINE_LABEL)
                ax.text(x, 1.0, f" {d}" + ("" if d.endswith("s") else "x"), transform=ax.get_xaxis_transform(),
                        fontsize=7, color="gray", va="top")
                drawn.add(DEADLINE_LABEL)
        # What has no point here, under the panel's title: a combination without a schedule has no time to plot.
        missing = {s: [r["deadline"] for r in rows if r["budget"] == b and r["scheduler"] == s and r["status"] != "ok"]
                   for s in scheds}
        missing = {s: v for s, v in missing.items() if v}
        bb = mine[0]["budget_bytes"] if mine else next(r["budget_bytes"] for r in rows if r["budget"] == b)
        title = f"budget {b} ({bb / 1e6:.3f} MB)"
        if missing:
            said = "; ".join(f"{s} ({', '.join(_deadline_short(d) for d in v)})" for s, v in missing.items())
            title += "\n" + "\n".join(textwrap.wrap("no schedule: " + said, 58))
        ax.set_title(title, fontsize=9 if not missing else 7.5)
        ax.grid(alpha=0.3)
        if not mine:
            ax.text(0.5, 0.5, "no schedule at this budget", transform=ax.transAxes, ha="center", fontsize=8)
        data["panels"][b] = {"points": pts, "front": front, "no_schedule": missing}
    for k in range(len(budgets), nrow * ncol):
        axes[k // ncol][k % ncol].set_visible(False)
    allp = [p for v in data["panels"].values() for p in v["points"]]
    lines = [_deadline_overhead(meta, d) for d in deadlines]
    data["xscale"] = _scale(axes[0][0], [p[0] for p in allp] + lines, "x")
    data["yscale"] = _scale(axes[0][0], [p[1] for p in allp], "y")
    for ax in axes[-1]:
        ax.set_xlabel("time over store-all (%)", fontsize=9)
    for row in axes:
        row[0].set_ylabel("energy over store-all (%)", fontsize=9)
    handles = [Line2D([], [], **_plain(scheduler_style(s, k), line=False)) for k, s in enumerate(scheds) if s in drawn]
    labels = [s for s in scheds if s in drawn]
    front_key = (Line2D([], [], color="black", lw=2.5, alpha=0.18), Line2D([], [], ls="none", marker="o", ms=3,
                                                                        color="black"))
    for label, handle in ((FRONT_LABEL, front_key),
                          (DEADLINE_LABEL, Line2D([], [], color="gray", ls=":"))):
        if label in drawn:
            handles.append(handle)
            labels.append(label)
    fig.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.0, 0.9), fontsize=8, frameon=False)
    fig.suptitle(f"Energy vs time per budget: {meta['model']} on {meta['target']}, batch {meta['batch_size']} "
                 f"(every deadline's solves)", fontsize=11)
    fig.tight_layout()
    return fig, data


def _solve_choice(d: str, rows: list[dict], solve: str | None) -> dict | None:
    have = [r for r in rows if r["status"] == "ok" and r.get("solve_file")
            and os.path.exists(os.path.join(d, r["solve_file"]))]
    if solve is None:
        cands = [r for r in have if r["scheduler"] == "poet"] or have
        return min(cands, key=lambda r: (r["budget_bytes"], r["deadline"] != "none", r["key"])) if cands else None
    match = [r for r in rows if r["key"] == solve]
    if not match:
        raise EdgetrainError(f"no solve {solve!r} in {d}; keys: {', '.join(r['key'] for r in have) or 'none'}")
    if match[0]["status"] != "ok" or not match[0].get("solve_file"):
        raise EdgetrainError(f"{solve} has no schedule ({match[0]['status']}: {match[0].get('error')})")
    if match[0] not in have:
        raise EdgetrainError(f"{solve}: its solve file {match[0]['solve_file']} is missing from {d}")
    return match[0]


def plot_sweep(d: str, solve: str | None = None, memory_steps: bool = False, report: bool = True,
               plots_dir: str | None = None) -> dict:
    """Every figure of the sweep in ``d`` into ``plots_dir`` (default DIR/plots), and DIR/report.html."""
    from edgetrain.compiler.graph.ir import TrainingGraph

    plt = mpl()
    meta, rows = _load(d)
    plots = plots_dir or os.path.join(d, "plots")
    files: list[str] = []
    data: dict = {}
    figures: list[dict] = []  # for the report: name, caption
    for field, what, name in (("energy_j", "energy", "energy_vs_budget"), ("time_s", "time", "time_vs_budget")):
        fig, data[name] = versus_budget(meta, rows, field, what)
        files += save(fig, plots, name)
        plt.close(fig)
        figures.append({"name": name, "caption": f"{what.capitalize()} per training step over store-all's, against "
                        "the budget; one panel per deadline; crosses under a panel: no schedule (listed)."})
    fig, data["energy_vs_time"] = energy_vs_time(meta, rows)
    files += save(fig, plots, "energy_vs_time")
    plt.close(fig)
    figures.append({"name": "energy_vs_time", "caption": "The deadline trade-off per budget: every solved "
                    "combination and the Pareto front."})

    chosen = _solve_choice(d, rows, solve)
    if chosen is not None:
        with open(os.path.join(d, chosen["solve_file"])) as f:
            sv = json.load(f)
        with open(os.path.join(d, "graph.json")) as f:
            graph = TrainingGraph.from_json(json.load(f), recorded=True)
        steps = sv["steps"]
        pct = budget_percent(meta, chosen["budget_bytes"])
        title = (f"{chosen['key']}: {meta['model']} on {meta['target']}, budget {chosen['budget']} "
                 f"({chosen['budget_bytes'] / 1e6:.3f} MB, {pct:.0f}% of the activation peak), deadline "
                 f"{chosen['deadline']}; {chosen['recomputes']} recomputes, {chosen['page_ins']} page-ins, "
                 f"{chosen['page_outs']} page-outs")
        m = plot_matrices(graph, steps, plots, f"schedule_{chosen['key']}", title)
        files += m["files"]
        data["schedule"] = {k: v for k, v in m.items() if k != "files"}
        mem = plot_memory(graph, steps, chosen["budget_bytes"], plots, f"memory_{chosen['key']}",
                          f"Memory over time by category: {chosen['key']} ({meta['model']} on {meta['target']})",
                          per_step=memory_steps, store_all_peak=meta.get("store_all_peak_bytes"))
        files += mem["files"]
        data["memory"] = {k: v for k, v in mem.items() if k != "files"}
        data["memory"]["stage_peaks"] = sv.get("stage_peaks")
        figures.append({"name": f"schedule_{chosen['key']}", "caption": "What the schedule does with each tensor "
                        "at each stage."})
        figures.append({"name": f"memory_{chosen['key']}", "caption": "What fills the memory, against the "
                        "budget" + (" (one column per runtime step)." if memory_steps else
                                    " (each stage at its peak).")})
    out = {"dir": d, "plots": plots, "files": files, "solve": chosen["key"] if chosen else None,
           "rows": len(rows), "data": data}
    if report:
        from .sweep_report import write_report

        out["report"] = write_report(d, meta, rows, figures, plots)
    return out
