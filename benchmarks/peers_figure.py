"""The peers benchmark's figure: per model, every configuration's real peak against its step time over eager's,
and the configurations no other beats on both (the Pareto front), from the rows of benchmarks/peers.py --json."""
from __future__ import annotations

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from edgetrain.compiler.workbench.figures import mpl, save  # noqa: E402

STYLES = {"eager": dict(color="black", marker="o"), "eager-optim-hook": dict(color="tab:gray", marker="s"),
          "checkpoint": dict(color="tab:purple", marker="v"), "compile": dict(color="tab:orange", marker="D"),
          "edgetrain": dict(color="tab:blue", marker="^"), "edgetrain-fused": dict(color="tab:green", marker="P"),
          "edgetrain-fused-recompute": dict(color="tab:olive", marker="X")}


def points(rows: list[dict], model: str) -> list[dict]:
    """The model's measured configurations: both a real peak and a time ratio."""
    return [r for r in rows if r["model"] == model and r.get("real_peak_bytes") and r.get("time_ratio")]


def pareto(pts: list[dict]) -> list[dict]:
    """The configurations no other one beats on both memory and time (ties kept), by time."""
    front = [p for p in pts if not any(
        q["real_peak_bytes"] <= p["real_peak_bytes"] and q["time_ratio"] <= p["time_ratio"]
        and (q["real_peak_bytes"], q["time_ratio"]) != (p["real_peak_bytes"], p["time_ratio"]) for q in pts)]
    return sorted(front, key=lambda p: p["time_ratio"])


def plot_peers(rows: list[dict], out_dir: str) -> list[str]:
    """peers_<model>.png/.svg in `out_dir` for every model with measured rows; the files written."""
    plt = mpl()
    files = []
    load = next((r["loadavg_1min_before_after"] for r in rows if "loadavg_1min_before_after" in r), None)
    for model in dict.fromkeys(r["model"] for r in rows):
        pts = points(rows, model)
        if not pts:
            continue
        fig, ax = plt.subplots(figsize=(7.5, 5))
        front = pareto(pts)
        ax.plot([p["time_ratio"] for p in front], [p["real_peak_bytes"] / 1e6 for p in front], color="tab:green",
                ls="--", lw=1, zorder=1, label="Pareto front")
        for method, style in STYLES.items():
            mine = [p for p in pts if p["method"] == method]
            if not mine:
                continue
            ax.scatter([p["time_ratio"] for p in mine], [p["real_peak_bytes"] / 1e6 for p in mine], s=55,
                       facecolors="none", edgecolors=style["color"], marker=style["marker"], label=method, zorder=2)
            for p in mine:
                if p["setting"] != "-":
                    ax.annotate(p["setting"], (p["time_ratio"], p["real_peak_bytes"] / 1e6), fontsize=7,
                                xytext=(4, 3), textcoords="offset points", color=style["color"])
        ax.set_xlabel("step time / eager's (paired median)")
        ax.set_ylabel("real peak (MB, resident-set high-water)")
        where = f"load {load[0]:.1f} -> {load[1]:.1f}" if load else "load not recorded"
        ax.set_title(f"{model}: memory vs time, batch {pts[0].get('batch_size')}, "
                     f"{pts[0].get('threads')} thread(s); {where}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        files += save(fig, out_dir, "peers_" + re.sub(r"[^A-Za-z0-9_.-]+", "_", model))
        plt.close(fig)
    return files
