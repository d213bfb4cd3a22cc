"""What every workbench figure shares: matplotlib without a display, and atomic, reproducible PNG + SVG files."""
from __future__ import annotations

import os

DPI = 130


def mpl():
    """pyplot on the Agg backend; SVG ids salted so that a figure redrawn from the same data is the same file."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    matplotlib.rcParams["svg.hashsalt"] = "edgetrain"
    return plt


def save(fig, out_dir: str, name: str) -> list[str]:
    """`name`.png and `name`.svg in ``out_dir``, each written to a temporary file and renamed over the old one."""
    os.makedirs(out_dir, exist_ok=True)
    out = []
    for ext in ("png", "svg"):
        path = os.path.join(out_dir, f"{name}.{ext}")
        tmp = f"{path}.{os.getpid()}.tmp"
        meta = {"Date": None} if ext == "svg" else {}  # no timestamp: regenerated figures diff only when they change
        fig.savefig(tmp, format=ext, dpi=DPI if ext == "png" else None, bbox_inches="tight", metadata=meta)
        os.replace(tmp, path)
        out.append(path)
    return out


# One look per scheduler in every figure: color, marker and line style all differ, so coinciding series stay
# visible (hollow markers of different shapes and sizes, the largest lowest, show through each other).
SCHEDULER_STYLES = {
    "poet": dict(color="tab:blue", marker="o", ls="-", ms=11),
    "checkmate": dict(color="tab:orange", marker="s", ls="--", ms=8),
    "paging": dict(color="tab:green", marker="^", ls="-.", ms=8),
    "dtr": dict(color="tab:red", marker="D", ls=":", ms=5.5),
    "checkpoint": dict(color="tab:purple", marker="v", ls=(0, (5, 1, 1, 1)), ms=6.5),
    "store-all": dict(color="tab:gray", marker="*", ls=(0, (1, 2)), ms=8),
}
# No "x" look-alike (a cross marks a combination without a schedule) and no star (store-all's).
_SPARE = [dict(color=f"C{k}", marker=m, ls="-", ms=6) for k, m in enumerate("Php<>d8")]


def scheduler_style(name: str, k: int = 0) -> dict:
    """Line and marker keywords for a scheduler (an unknown one gets a spare look by its rank k)."""
    return dict(SCHEDULER_STYLES.get(name) or _SPARE[k % len(_SPARE)])


def budget_percent(meta: dict, budget_bytes: float) -> float:
    """A budget in percent of store-all's (plain backprop's) peak, the `B%` of `--budget`, from a sweep's
    sweep.json figures."""
    return 100.0 * budget_bytes / meta["store_all_peak_bytes"]


def infeasible_reason(message: str | None) -> str:
    """Why a combination has no schedule, in a word or three (from the sweep row's message)."""
    m = (message or "").lower()
    if "with deadline" in m:
        return "budget + deadline"
    if "deadline" in m:
        return "deadline"
    if "budget" in m or "fits" in m or "within" in m:
        return "budget"
    return "error" if m else "no schedule"
