"""Figures of one solve: its schedule matrices (tensor x stage) and its memory over time by category.

Stage t of a schedule runs node t of the training graph: stages 0..L are the forward pass and the loss (L),
L+1..T-1 the backward pass. The matrices' rows are the decision tensors (forward tensors that the backward
pass reads, in forward order); up to MAX_ROWS they are named one by one, beyond that consecutive tensors are
drawn as blocks (and stages too beyond MAX_STAGES), each cell shaded by the share of its (stage, tensor)
cells with the event, so a ResNet-50 or BERT-base schedule reads like a small one.
"""
from __future__ import annotations

import math

from .figures import mpl, save
from .memory_breakdown import CATEGORIES, breakdown

MAX_ROWS = 40  # tensors named one by one up to this many
MAX_STAGES = 150  # stages drawn one by one up to this many
PANELS = (("compute", "computed / recomputed"), ("ram", "held in RAM"), ("storage", "held in storage"),
          ("page_in", "paged in"), ("page_out", "paged out"))
COLORS = {"compute": "tab:blue", "recompute": "tab:orange", "ram": "tab:green", "storage": "tab:purple",
          "page_in": "tab:red", "page_out": "tab:brown"}
CATEGORY_COLORS = {"state": "#9e9e9e", "activations": "tab:blue", "gradients": "tab:orange",
                   "paging": "tab:red", "workspace": "tab:olive"}
CATEGORY_LABELS = {"state": "fixed state (parameters, optimizer, buffers)",
                   "activations": "activations (input, labels, forward, BN statistics)",
                   "gradients": "gradients", "paging": "pages in flight (paged out, RAM held until freed; "
                   "paged in for this stage)", "workspace": "workspace of the running node"}


def schedule_matrices(graph, steps: list[dict]) -> tuple[list[str], dict[str, list[list[int]]]]:
    """Stage x tensor matrices of a schedule, from its steps. Values: compute 1 / recompute 2 in `compute`;
    0/1 elsewhere. `ram`: resident at some point of the stage; `storage`: a stored copy exists during it."""
    from edgetrain.compiler.graph.liveness import analyze

    lv = analyze(graph)
    tensors = list(lv.decision)
    col = {t: j for j, t in enumerate(tensors)}
    T = len(graph.nodes)
    mats = {k: [[0] * len(tensors) for _ in range(T)] for k in ("compute", "ram", "storage", "page_in", "page_out")}
    resident: set[str] = set()
    stored_from: dict[str, int] = {}
    last_use: dict[str, int] = {}
    by_stage: dict[int, list[dict]] = {}
    for st in steps:
        by_stage.setdefault(st["stage"], []).append(st)
        if st["tensor"] in col:
            last_use[st["tensor"]] = st["stage"]
    for t in range(T):
        seen = set(resident)
        for st in by_stage.get(t, []):
            name, act = st["tensor"], st["action"]
            if name not in col:
                continue
            j = col[name]
            if act in ("compute", "recompute"):
                mats["compute"][t][j] = 1 if act == "compute" else 2
                resident.add(name)
                seen.add(name)
            elif act == "page_in":
                mats["page_in"][t][j] = 1
                resident.add(name)
                seen.add(name)
            elif act == "page_out":
                mats["page_out"][t][j] = 1
                stored_from.setdefault(name, t)
            elif act == "free":
                resident.discard(name)
        for name in seen:
            mats["ram"][t][col[name]] = 1
        for name, s in stored_from.items():
            if s <= t <= last_use.get(name, s):
                mats["storage"][t][col[name]] = 1
    return tensors, mats


def _groups(n: int, most: int) -> list[tuple[int, int]]:
    """[start, stop) ranges of consecutive items: one each up to `most`, else equal blocks, at most `most`."""
    size = 1 if n <= most else math.ceil(n / most)
    return [(a, min(n, a + size)) for a in range(0, n, size)]


def _short(name: str, width: int = 22) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def aggregate(tensors: list[str], mats: dict, T: int) -> dict:
    """Tensor x stage shares per event, block-aggregated beyond MAX_ROWS tensors / MAX_STAGES stages."""
    rows, cols = _groups(len(tensors), MAX_ROWS), _groups(T, MAX_STAGES)
    events = {"compute": lambda v: v == 1, "recompute": lambda v: v == 2, "ram": bool, "storage": bool,
              "page_in": bool, "page_out": bool}
    out = {}
    for ev, test in events.items():
        m = mats["compute" if ev in ("compute", "recompute") else ev]
        grid = []
        for r0, r1 in rows:
            line = []
            for c0, c1 in cols:
                hits = sum(1 for t in range(c0, c1) for j in range(r0, r1) if test(m[t][j]))
                line.append(hits / ((r1 - r0) * (c1 - c0)))
            grid.append(line)
        out[ev] = grid
    labels = [tensors[a] if b - a == 1 else f"{_short(tensors[a], 16)} … {_short(tensors[b - 1], 16)} ({b - a})"
              for a, b in rows]
    return {"rows": rows, "cols": cols, "labels": labels, "shares": out,
            "aggregated": len(rows) < len(tensors) or len(cols) < T}


def _rgba(shares: list[list[float]], color: str, aggregated: bool, under=None):
    import numpy as np
    from matplotlib.colors import to_rgb

    a = np.array(shares, dtype=float)
    # Any event in an aggregated cell is at least a light shade: a single page-in among 400 cells stays visible.
    alpha = np.where(a > 0, (0.3 + 0.7 * a) if aggregated else 1.0, 0.0)
    img = np.ones(a.shape + (3,)) if under is None else under
    rgb = np.array(to_rgb(color))
    return img * (1 - alpha[..., None]) + rgb * alpha[..., None]


def plot_matrices(graph, steps: list[dict], out_dir: str, name: str, title: str) -> dict:
    """Five tensor x stage panels; returns the files and the drawn data (labels, shares, aggregation)."""
    from matplotlib.patches import Patch

    plt = mpl()
    tensors, mats = schedule_matrices(graph, steps)
    T, L = len(graph.nodes), graph.loss_stage
    agg = aggregate(tensors, mats, T)
    nrows, ncols = len(agg["rows"]), len(agg["cols"])
    panel_w = min(3.8, max(2.4, 0.025 * ncols + 1.2))
    height = min(12.0, max(3.8, 0.22 * nrows + 2.0))
    fig, axes = plt.subplots(1, len(PANELS), figsize=(2.6 + panel_w * len(PANELS), height), sharey=True)
    extent = (-0.5, agg["cols"][-1][1] - 0.5, nrows - 0.5, -0.5)  # x in stage numbers, whatever the blocks
    sh = agg["shares"]
    for ax, (key, label) in zip(axes, PANELS):
        if key == "compute":
            img = _rgba(sh["compute"], COLORS["compute"], agg["aggregated"])
            img = _rgba(sh["recompute"], COLORS["recompute"], agg["aggregated"], under=img)
        else:
            img = _rgba(sh[key], COLORS[key], agg["aggregated"])
        ax.imshow(img, aspect="auto", interpolation="nearest", extent=extent)
        ax.set_title(label, fontsize=10, pad=14)
        ax.axvline(L + 0.5, color="black", lw=0.8, ls="--")
        ax.text(L + 0.5, -0.5, "forward | backward", ha="center", va="bottom", fontsize=7,
                transform=ax.transData, clip_on=False)
        ax.set_xlabel("stage t (runs node t)", fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
        ax.set_xlim(extent[0], extent[1])
        for r in range(1, nrows):  # faint row rules make long rows easy to follow across the panels
            ax.axhline(r - 0.5, color="#eeeeee", lw=0.4, zorder=0)
    axes[0].set_yticks(range(nrows))
    axes[0].set_yticklabels(agg["labels"], fontsize=7 if nrows <= MAX_ROWS else 6)
    axes[0].set_ylabel("decision tensor (forward order)" + (", blocks of consecutive tensors" if
                                                                len(agg["rows"]) < len(tensors) else ""))
    handles = [Patch(color=COLORS[k], label=k.replace("_", "-")) for k in ("compute", "recompute", "ram",
                                                                            "storage", "page_in", "page_out")]
    note = (f"stage t runs node t of the training graph: 0..{L} forward (the loss at {L}), {L + 1}..{T - 1} backward")
    if agg["aggregated"]:
        size_r = agg["rows"][0][1] - agg["rows"][0][0]
        size_c = agg["cols"][0][1] - agg["cols"][0][0]
        note += (f"; each cell a block of up to {size_r} tensors x {size_c} stages, shaded by the share of its "
                 "cells with the event (any at all is at least a light shade)")
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, -0.01))
    fig.suptitle(title, fontsize=10)
    fig.text(0.5, 0.045, note, ha="center", fontsize=8, color="#444444")
    fig.tight_layout(rect=(0, 0.08, 1, 0.97))
    files = save(fig, out_dir, name)
    plt.close(fig)
    return {"files": files, "tensors": tensors, "labels": agg["labels"], "aggregated": agg["aggregated"],
            "rows": agg["rows"], "cols": agg["cols"], "shares": sh}


def plot_memory(graph, steps: list[dict], budget_bytes: int, out_dir: str, name: str, title: str,
                per_step: bool = False, store_all_peak: int | None = None) -> dict:
    """Memory stacked by category against the budget: one bar per stage at its peak (default), or one column
    per runtime step while it runs (``per_step``). Returns the files and the stacked series."""
    import numpy as np

    plt = mpl()
    b = breakdown(graph, steps)
    T, L = len(graph.nodes), graph.loss_stage
    fig, ax = plt.subplots(figsize=(min(16, max(9, 0.06 * (len(steps) if per_step else T) + 6)), 4.8))
    if per_step:
        comps, xs = b.steps, np.arange(len(steps))
        first_bwd = next((k for k, s in enumerate(b.stage) if s > L), len(steps))
        span = (first_bwd - 0.5, len(steps) - 0.5)
        xlabel = "runtime step (page-ins, recomputes, the stage's node, page-outs, frees, stage by stage)"
    else:
        comps, xs = b.stage_peaks, np.arange(T)
        span = (L + 0.5, T - 0.5)
        xlabel = "stage t (runs node t; each bar: the moment of the stage's peak, as the validator counts it)"
    series = {c: np.array([x[c] for x in comps], dtype=float) / 1e6 for c in CATEGORIES}
    bottom = np.zeros(len(xs))
    for c in CATEGORIES:
        ax.bar(xs, series[c], width=1.0, bottom=bottom, color=CATEGORY_COLORS[c], label=CATEGORY_LABELS[c],
               linewidth=0, align="center")
        bottom += series[c]
    ax.axvspan(*span, color="black", alpha=0.06, lw=0)
    ax.axhline(budget_bytes / 1e6, color="red", ls="--", lw=1.3, label=f"budget {budget_bytes / 1e6:.3f} MB")
    if store_all_peak:
        ax.axhline(store_all_peak / 1e6, color="black", ls=":", lw=1,
                   label=f"store-all peak {store_all_peak / 1e6:.3f} MB")
    high = max(float(bottom.max()), budget_bytes / 1e6, (store_all_peak or 0) / 1e6)
    state = graph.state_bytes / 1e6
    low = 0.0
    if state > 0.5 * high:  # the fixed state would flatten the rest: start the axis just below its top
        low = max(0.0, state - 0.12 * (high - state))
        ax.text(0.005, 0.02, f"axis starts at {low:.1f} MB; the fixed state is {state:.1f} MB", fontsize=8,
                transform=ax.transAxes, color="white", va="bottom")
    top = high + 0.12 * (high - low)
    ax.set_ylim(low, top)
    ax.text(span[0] - 0.5, 0.985, "forward ", ha="right", va="top", fontsize=8, color="#444444",
            transform=ax.get_xaxis_transform())
    ax.text(span[0] + 0.5, 0.985, " backward (shaded)", ha="left", va="top", fontsize=8, color="#444444",
            transform=ax.get_xaxis_transform())
    ax.set_xlim(xs[0] - 0.5, xs[-1] + 0.5)
    if per_step:  # stage numbers on top, at the first step of every few stages
        every = max(1, round(T / 12))
        first = {}
        for k, t in enumerate(b.stage):
            first.setdefault(t, k)
        top_ax = ax.secondary_xaxis("top")
        marks = [t for t in sorted(first) if t % every == 0]
        top_ax.set_xticks([first[t] for t in marks])
        top_ax.set_xticklabels([str(t) for t in marks], fontsize=7)
        top_ax.set_xlabel("stage", fontsize=8)
    ax.set_xlabel(xlabel, fontsize=9)
    ax.set_ylabel("memory (MB)")
    peak = float(bottom.max())
    ax.set_title(f"{title}\npeak {peak:.3f} MB of a {budget_bytes / 1e6:.3f} MB budget", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    files = save(fig, out_dir, name)
    plt.close(fig)
    return {"files": files, "per_step": per_step, "series": {c: [int(x[c]) for x in comps] for c in CATEGORIES},
            "totals": [int(sum(x.values())) for x in comps], "stage_peak_step": b.stage_peak_step}


__all__ = ["schedule_matrices", "aggregate", "plot_matrices", "plot_memory", "MAX_ROWS", "MAX_STAGES"]
