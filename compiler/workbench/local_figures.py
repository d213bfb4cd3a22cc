"""Local learning at a glance: accuracy against training time per method, and each block's batch and memory.

Input: the JSON of `benchmarks/local_learning.py` (a `methods` map: backprop, classic, neuroflux) or of
`edgetrain train --timeline --json` (one local-learning run). A method's curve is the test accuracy of the
model it would hand over at that moment: backprop's network after each epoch; for local learning the exit
(any head trained so far) that the validation split picks, after each epoch of each block.
"""
from __future__ import annotations

from .figures import mpl, save

__all__ = ["curve", "time_to", "summarize", "plot_local_learning", "markdown_table"]

LABELS = {"backprop": "backprop (end to end)", "classic": "classic local learning", "neuroflux": "NeuroFlux"}
STYLES = {"backprop": dict(color="black", marker="o", ls="-"),
          "classic": dict(color="tab:orange", marker="s", ls="--"),
          "neuroflux": dict(color="tab:blue", marker="^", ls="-.")}


def curve(row: dict) -> list[tuple[float, float]]:
    """(training seconds, test accuracy %) after every epoch: the model the method would hand over then."""
    pts = []
    for t in row["timeline"]:
        acc = t.get("exit_test_accuracy", t.get("best_exit_test_accuracy", t["test_accuracy"]))
        pts.append((float(t["wall_s"]), float(acc)))
    return pts


def time_to(pts: list[tuple[float, float]], accuracy: float) -> float | None:
    """Training seconds until the curve first reaches ``accuracy`` (None: never)."""
    return next((s for s, a in pts if a >= accuracy - 1e-9), None)


def summarize(methods: dict[str, dict]) -> dict[str, dict]:
    """Per method: peak test accuracy, seconds to reach it, seconds to reach backprop's peak, epochs."""
    out = {}
    bp_peak = None
    if "backprop" in methods and methods["backprop"]["timeline"]:
        bp_peak = max(a for _, a in curve(methods["backprop"]))
    for name, row in methods.items():
        pts = curve(row)
        if not pts:
            continue
        peak = max(a for _, a in pts)
        ep = row.get("epochs_per_block") or row.get("epochs")  # a summarized row keeps the list apart
        out[name] = {
            "peak_test_accuracy": peak, "time_to_peak_s": time_to(pts, peak),
            "time_to_backprop_peak_s": None if bp_peak is None else time_to(pts, bp_peak),
            "final_test_accuracy": pts[-1][1], "wall_s": row["wall_s"],
            "epochs": sum(ep) if isinstance(ep, list) else ep,
            "epochs_per_block": ep if isinstance(ep, list) else None,
        }
    return out


def _methods(result: dict) -> dict[str, dict]:
    if "methods" in result:
        return result["methods"]
    # `edgetrain train --timeline --json`: one NeuroFlux run
    return {"neuroflux": {"timeline": result["timeline"], "wall_s": result["wall_s"],
                          "batches": [b["batch"] for b in result["blocks"]],
                          "block_peak_bytes": [b["counted_bytes"] for b in result["blocks"]],
                          "epochs": [b.get("epochs") for b in result["blocks"]]}}


def plot_local_learning(result: dict, out_dir: str, name: str = "local_learning") -> dict:
    """Draw `name`.png/.svg in ``out_dir``; returns the files and the plotted data (curves, bars)."""
    plt = mpl()
    methods = _methods(result)
    summary = summarize(methods)
    budget = result.get("budget_bytes")
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6), gridspec_kw={"width_ratios": [2.2, 1, 1]})
    ax = axes[0]
    data: dict = {"curves": {}, "batches": {}, "block_peak_bytes": {}, "summary": summary}
    bp_peak = summary.get("backprop", {}).get("peak_test_accuracy")
    for m, row in methods.items():
        pts = curve(row)
        if not pts:
            continue
        data["curves"][m] = pts
        st = STYLES.get(m, {})
        ax.plot([s / 60 for s, _ in pts], [a for _, a in pts], label=LABELS.get(m, m), ms=4, lw=1.4, **st)
        s = summary[m]
        ax.plot(s["time_to_peak_s"] / 60, s["peak_test_accuracy"], marker="*", ms=13, color=st.get("color"),
                ls="none", markeredgecolor="white")
        blocks = [k for k, t in enumerate(row["timeline"][1:], 1) if t.get("block") != row["timeline"][k - 1].get("block")]
        for k in blocks:  # a new block starts: its first epoch's point gets a tick
            ax.plot(pts[k][0] / 60, pts[k][1], marker="|", ms=12, color=st.get("color"), ls="none")
    if bp_peak is not None:
        ax.axhline(bp_peak, color="gray", ls=":", lw=1)
        ax.annotate(f"backprop's peak {bp_peak:.1f}%", (0, bp_peak), xycoords=("axes fraction", "data"),
                    xytext=(4, 3), textcoords="offset points", fontsize=8, color="gray")
    ax.plot([], [], marker="*", ms=11, color="gray", ls="none", label="peak (first reached)")
    ax.plot([], [], marker="|", ms=10, color="gray", ls="none", label="next block starts")
    ax.set_xlabel("training wall time (min; evaluation excluded, caching included)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("accuracy of the model each method would hand over", fontsize=10)
    ax.grid(alpha=0.3)
    ax.set_xlim(left=0)

    bx, mx = axes[1], axes[2]
    order = [m for m in ("backprop", "classic", "neuroflux") if m in methods] + \
            [m for m in methods if m not in ("backprop", "classic", "neuroflux")]
    xpos = 0.0
    ticks, labels = [], []
    for m in order:
        row = methods[m]
        batches = list(row.get("batches") or [])
        peaks = list(row.get("block_peak_bytes") or ([row["peak_bytes"]] * len(batches) if "peak_bytes" in row else []))
        if m == "classic" and len(set(batches)) == 1:
            batches, peaks = batches[:1], [max(peaks)] if peaks else []  # one batch for every layer: one bar
        data["batches"][m], data["block_peak_bytes"][m] = batches, peaks
        st = STYLES.get(m, {})
        xs = [xpos + k for k in range(len(batches))]
        bx.bar(xs, batches, color=st.get("color", "gray"), alpha=0.8)
        for x, b in zip(xs, batches):
            bx.text(x, b, str(b), ha="center", va="bottom", fontsize=7)
        if peaks:
            mx.bar(xs, [p / 1e6 for p in peaks], color=st.get("color", "gray"), alpha=0.8)
        if m == "classic" and len(batches) == 1:
            labels += ["classic\n(every layer)"]
        elif len(batches) == 1:
            labels += [m]
        else:
            labels += [f"{'NF' if m == 'neuroflux' else m} b{k}" for k in range(len(batches))]
        ticks += xs
        xpos += len(batches) + 0.8
    for a in (bx, mx):
        a.set_xticks(ticks)
        a.set_xticklabels(labels, rotation=45, ha="right", fontsize=8)
        a.grid(axis="y", alpha=0.3)
    bx.set_ylabel("batch size")
    bx.set_title("batch per block (largest under the budget)", fontsize=10)
    mx.set_ylabel("counted training peak (MB)")
    mx.set_title("memory per block", fontsize=10)
    if budget:
        mx.axhline(budget / 1e6, color="red", ls="--", lw=1.2, label=f"budget {budget / 1e6:.0f} MB")
    handles, labs = ax.get_legend_handles_labels()
    h2, l2 = mx.get_legend_handles_labels()
    fig.legend(handles + h2, labs + l2, loc="lower center", ncol=len(labs + l2), fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, -0.04))
    what = (f"{result.get('model', '?')} on {result.get('data', '?')}, {result.get('train_samples', '?')} training "
            f"images, budget {result.get('budget', '?')}")
    if result.get("patience"):
        what += f", patience {result['patience']} (cap {result.get('epochs')} epochs)"
    fig.suptitle(what, fontsize=11)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    files = save(fig, out_dir, name)
    plt.close(fig)
    return {"files": files, "data": data}


def markdown_table(result: dict) -> str:
    """The table of docs/local-learning.md for one benchmark result."""
    s = summarize(result["methods"])
    lines = ["| method | peak test acc. | time to peak | time to backprop's peak | epochs | training images |",
             "|---|---|---|---|---|---|"]

    def t(x):
        return "not reached" if x is None else f"{x / 60:.1f} min"

    for m, x in s.items():
        ep = x["epochs"] if x["epochs_per_block"] is None else (
            f"{x['epochs']} ({'+'.join(map(str, x['epochs_per_block']))})")
        lines.append(f"| {LABELS.get(m, m)} | {x['peak_test_accuracy']:.2f}% | {t(x['time_to_peak_s'])} | "
                     f"{t(x['time_to_backprop_peak_s'])} | {ep} | {result['train_samples']:,} |")
    return "\n".join(lines)


