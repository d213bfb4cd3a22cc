"""`edgetrain plot DIR`: figures of a sweep (see `sweep.py`), PNG and SVG, in DIR/plots/.

- energy_vs_budget: energy per training step against the budget, one line per scheduler, one panel per
  deadline of the sweep;
- time_vs_budget: the same for the step's time;
- schedule_<key>: for one solve, POET-style stage x tensor matrices derived from its steps: compute /
  recompute, kept in RAM, in storage, page-in, page-out (the tensors are the decision tensors, forward order);
- memory_<key>: bytes resident after each step (and the peak while each node runs: its output and workspace)
  against the budget line.
The default solve: POET's at the tightest budget it met (deadline none preferred).
"""
from __future__ import annotations

import json
import os

from edgetrain.compiler.errors import EdgetrainError


def _mpl():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _load(d: str):
    from .sweep import read_rows

    path = os.path.join(d, "rows.jsonl")
    if not os.path.exists(path):
        raise EdgetrainError(f"{d} holds no sweep (no rows.jsonl); run `edgetrain sweep ... --out {d}` first")
    with open(os.path.join(d, "sweep.json")) as f:
        meta = json.load(f)
    return meta, read_rows(d)


def _save(fig, plots: str, name: str) -> list[str]:
    out = []
    for ext in ("png", "svg"):
        p = os.path.join(plots, f"{name}.{ext}")
        fig.savefig(p, dpi=120 if ext == "png" else None, bbox_inches="tight")
        out.append(p)
    return out


def deadline_panels(meta: dict, rows: list[dict]) -> list[str]:
    """The deadlines to draw, one panel each: the sweep's order, those with at least one row ("none" if no row)."""
    seen = {r["deadline"] for r in rows}
    order = [d for d in meta.get("deadlines", []) if d in seen]
    order += sorted(seen - set(order))
    return order or ["none"]


def _deadline_title(d: str) -> str:
    if d == "none":
        return "no deadline"
    return f"deadline {d}" if d.endswith("s") else f"deadline {d}x store-all time"


def _versus_budget(plt, meta, rows, field: str, ylabel: str, title: str, baseline: float | None):
    deadlines = deadline_panels(meta, rows)
    fig, axes = plt.subplots(1, len(deadlines), figsize=(4.2 + 3.6 * len(deadlines), 4.5), sharey=True,
                             squeeze=False)
    scheds = [s for s in meta.get("schedulers", []) if any(r["scheduler"] == s for r in rows)]
    scheds += sorted({r["scheduler"] for r in rows} - set(scheds))
    colors = {s: f"C{k % 10}" for k, s in enumerate(scheds)}  # one color per scheduler across the panels
    mf = meta.get("min_feasible_bytes")
    for ax, dl in zip(axes[0], deadlines):
        drawn = 0
        for s in scheds:
            pts = sorted((r["budget_bytes"] / 1e6, r[field]) for r in rows
                         if r["scheduler"] == s and r["deadline"] == dl and r["status"] == "ok"
                         and r.get(field) is not None)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=s, color=colors[s])
                drawn += 1
        if baseline is not None:
            ax.axhline(baseline, color="gray", ls=":", lw=1, label="store-all")
        if mf:
            ax.axvline(mf / 1e6, color="red", ls="--", lw=1, label="smallest feasible budget")
        ax.set_xlabel("memory budget (MB)")
        ax.set_title(_deadline_title(dl), fontsize=10)
        ax.grid(alpha=0.3)
        if drawn or baseline is not None:
            ax.legend(fontsize=7)
        if not drawn:
            ax.text(0.5, 0.5, "no solved combination", transform=ax.transAxes, ha="center")
    axes[0][0].set_ylabel(ylabel)
    fig.suptitle(f"{title}: {meta['model']} on {meta['target']}, batch {meta['batch_size']}", fontsize=11)
    return fig


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


def memory_curve(graph, steps: list[dict]) -> tuple[list[int], list[int]]:
    """Bytes resident after each step, and the bytes while each step runs (a node: its output and workspace),
    with the validator's accounting: state, then every tensor from the step that makes it to its free."""
    nodes = {n.name: n for n in graph.nodes}
    live = graph.state_bytes
    resident: dict[str, int] = {}
    after, during = [], []
    for st in steps:
        name, act = st["tensor"], st["action"]
        peak = live
        if act in ("compute", "recompute"):
            n = nodes[name]
            new = n.bytes + (n.aux_bytes if act == "compute" else 0)
            peak = live + new + n.workspace_bytes
            if n.bytes:
                resident[name] = n.bytes
            if act == "compute" and n.aux_bytes:
                resident[f"{name}.aux"] = n.aux_bytes
            live += new
        elif act == "page_in":
            b = nodes[name].bytes
            resident[name] = b
            live += b
            peak = live
        elif act == "free":
            live -= resident.pop(name, 0)
        after.append(live)
        during.append(max(peak, live))
    return after, during


def plot_sweep(d: str, solve: str | None = None) -> dict:
    from edgetrain.compiler.graph.ir import TrainingGraph

    plt = _mpl()
    meta, rows = _load(d)
    plots = os.path.join(d, "plots")
    os.makedirs(plots, exist_ok=True)
    files: list[str] = []
    fig = _versus_budget(plt, meta, rows, "energy_j", "energy per training step (J)", "Energy vs budget",
                         meta.get("store_all_energy_j"))
    files += _save(fig, plots, "energy_vs_budget")
    plt.close(fig)
    fig = _versus_budget(plt, meta, rows, "time_s", "time per training step (s)", "Time vs budget",
                         meta.get("store_all_time_s"))
    files += _save(fig, plots, "time_vs_budget")
    plt.close(fig)

    ok = [r for r in rows if r["status"] == "ok" and r.get("solve_file")]
    if solve is None:
        cands = [r for r in ok if r["scheduler"] == "poet"] or ok
        if cands:
            solve = min(cands, key=lambda r: (r["budget_bytes"], r["deadline"] != "none", r["key"]))["key"]
    chosen = None
    if solve is not None:
        match = [r for r in rows if r["key"] == solve]
        if not match:
            raise EdgetrainError(f"no solve {solve!r} in {d}; keys: {', '.join(r['key'] for r in ok) or 'none'}")
        if match[0]["status"] != "ok" or not match[0].get("solve_file"):
            raise EdgetrainError(f"{solve} has no schedule ({match[0]['status']}: {match[0].get('error')})")
        chosen = match[0]
        with open(os.path.join(d, chosen["solve_file"])) as f:
            sv = json.load(f)
        with open(os.path.join(d, "graph.json")) as f:
            graph = TrainingGraph.from_json(json.load(f))
        steps = sv["steps"]

        tensors, mats = schedule_matrices(graph, steps)
        from matplotlib.colors import ListedColormap

        panels = [("compute", "compute / recompute", ListedColormap(["white", "tab:blue", "tab:orange"]), 2),
                  ("ram", "kept in RAM", ListedColormap(["white", "tab:green"]), 1),
                  ("storage", "in storage", ListedColormap(["white", "tab:purple"]), 1),
                  ("page_in", "page-in", ListedColormap(["white", "tab:red"]), 1),
                  ("page_out", "page-out", ListedColormap(["white", "tab:brown"]), 1)]
        T = len(graph.nodes)
        width = max(10, min(30, 2.2 * 5 + 0.12 * len(tensors) * 5))
        fig, axes = plt.subplots(1, 5, figsize=(width, max(4, min(16, 0.08 * T + 2))), sharey=True)
        for ax, (k, title, cmap, vmax) in zip(axes, panels):
            ax.imshow(mats[k], aspect="auto", interpolation="nearest", cmap=cmap, vmin=0, vmax=vmax)
            ax.set_title(title, fontsize=9)
            ax.set_xlabel("tensor (forward order)", fontsize=8)
            ax.axhline(graph.loss_stage + 0.5, color="gray", lw=0.6, ls=":")
            if len(tensors) <= 40:
                ax.set_xticks(range(len(tensors)))
                ax.set_xticklabels(tensors, rotation=90, fontsize=5)
        axes[0].set_ylabel("stage")
        fig.suptitle(f"{chosen['key']}: {meta['model']} on {meta['target']}, budget {chosen['budget']} "
                     f"({chosen['budget_bytes'] / 1e6:.3f} MB), deadline {chosen['deadline']}; "
                     f"{chosen['recomputes']} recomputes (orange), {chosen['page_ins']} page-ins, "
                     f"{chosen['page_outs']} page-outs", fontsize=9)
        files += _save(fig, plots, f"schedule_{chosen['key']}")
        plt.close(fig)

        after, during = memory_curve(graph, steps)
        fig, ax = plt.subplots(figsize=(9, 4.5))
        xs = range(len(steps))
        ax.plot(xs, [b / 1e6 for b in during], color="tab:blue", alpha=0.35, lw=1,
                label="while the step runs (output + workspace)")
        ax.step(xs, [b / 1e6 for b in after], where="post", color="tab:blue", lw=1.5, label="resident after the step")
        ax.axhline(chosen["budget_bytes"] / 1e6, color="red", ls="--", lw=1.2, label="budget")
        ax.axhline(graph.state_bytes / 1e6, color="gray", ls=":", lw=1, label="parameters + optimizer state")
        b0 = next((k for k, s in enumerate(steps) if s["stage"] > graph.loss_stage), None)
        if b0 is not None:
            ax.axvline(b0, color="gray", lw=0.6)
            ax.text(b0, ax.get_ylim()[1], " backward", va="top", fontsize=8, color="gray")
        ax.set_xlabel("step")
        ax.set_ylabel("memory (MB)")
        ax.set_title(f"Memory over time: {chosen['key']} (peak {max(during) / 1e6:.3f} MB, "
                     f"budget {chosen['budget_bytes'] / 1e6:.3f} MB)", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
        files += _save(fig, plots, f"memory_{chosen['key']}")
        plt.close(fig)
    return {"dir": d, "plots": plots, "files": files, "solve": chosen["key"] if chosen else None,
            "rows": len(rows)}
