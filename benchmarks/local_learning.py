"""Local learning benchmark: backprop vs classic local learning vs NeuroFlux, side by side in one run.

    .venv/bin/python benchmarks/local_learning.py [--model vgg11] [--budget 128MB] [--epochs 30]
        [--patience 2] [--data fashion-mnist] [--train-size 6000] [--test-size 2000] [--threads 1]
        [--methods backprop,classic,neuroflux] [--out build/bench/local_learning] [--json FILE]
    .venv/bin/python benchmarks/local_learning.py --figure-only FILE.json --out DIR   # redraw from JSON

All three train the same model from the same initial weights on the same data split, under the same memory
budget (bytes by the same counter: each method's largest batch is read off its memory line). Each trains until
its validation accuracy stops improving: backprop when `--patience` epochs bring no new best, local learning
block by block with the same rule per block; `--epochs` caps each (`--patience 0`: exactly `--epochs`).
Reported per method: its peak test accuracy and the training wall time to reach it, the time to reach
backprop's peak (evaluation excluded, NeuroFlux's caching included), epochs, peak bytes (the counted real
step), output parameters, cache bytes. Prints a table, writes JSON and the figure (accuracy against time,
batch and memory per block).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from benchmarks.output import write_json  # noqa: E402
from rich.table import Table  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from edgetrain.compiler.schedule_file import format as schedule_format  # noqa: E402
from edgetrain.compiler.workbench.local_baselines import train_backprop, train_classic  # noqa: E402
from edgetrain.compiler.pipeline_local import WEIGHTS, LocalOptions, compile_local  # noqa: E402
from edgetrain.compiler.workbench.local_figures import markdown_table, plot_local_learning, summarize  # noqa: E402
from edgetrain.compiler.workbench.local_train import load_splits, train_dir  # noqa: E402
from edgetrain.compiler.workbench.report import console  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="vgg11")
    ap.add_argument("--target", default="jetson-agx-orin")
    ap.add_argument("--budget", default="128MB")
    ap.add_argument("--epochs", type=int, default=30, help="the most epochs (backprop) or epochs per block")
    ap.add_argument("--patience", type=int, default=2,
                    help="stop after this many epochs without a new best validation accuracy (0: train --epochs)")
    ap.add_argument("--data", default="fashion-mnist", choices=["fashion-mnist", "digits"])
    ap.add_argument("--train-size", type=int, default=6000)
    ap.add_argument("--test-size", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--cache-dtype", default="float32", choices=["float32", "float16"])
    ap.add_argument("--methods", default="backprop,classic,neuroflux")
    ap.add_argument("--out", default="build/bench/local_learning")
    ap.add_argument("--json", help="also write the result here (e.g. docs/data/local_learning_vgg11.json)")
    ap.add_argument("--figure-only", metavar="JSON", help="only redraw the figure of an earlier result (this "
                    "benchmark's, or `edgetrain train --timeline --json`'s) into --out")
    a = ap.parse_args(argv)
    if a.figure_only:
        with open(a.figure_only) as f:
            result = json.load(f)
        fig = plot_local_learning(result, a.out, f"local_learning_{result.get('model', 'train')}")
        print("wrote " + ", ".join(fig["files"]))
        return result
    patience = a.patience or None
    torch.set_num_threads(a.threads)
    methods = a.methods.split(",")
    if os.path.exists(a.out):
        shutil.rmtree(a.out)
    plan_dir = os.path.join(a.out, "plan")
    t0 = time.perf_counter()
    comp = compile_local(LocalOptions(model=a.model, target=a.target, budget=a.budget, out=plan_dir, lr=a.lr,
                                      cache_dtype=a.cache_dtype))
    compile_s = time.perf_counter() - t0
    body = schedule_format.load(plan_dir)
    tr = body["local"]["training"]
    splits = load_splits(a.data, tuple(body["model"]["input_shape"]), val_fraction=tr["val_fraction"],
                         seed=body["seed"], train_size=a.train_size, test_size=a.test_size)
    rows = {}
    if "backprop" in methods:
        rows["backprop"] = train_backprop(body, splits, a.epochs, patience=patience)
    if "classic" in methods:
        rows["classic"] = train_classic(body, load_file(os.path.join(plan_dir, WEIGHTS)), splits, a.epochs,
                                        os.path.join(a.out, "classic"), patience=patience)
    if "neuroflux" in methods:
        r = train_dir(plan_dir, a.data, a.epochs, work=os.path.join(a.out, "neuroflux"), eval_each_epoch=True,
                      splits=splits, patience=patience)
        rows["neuroflux"] = {
            "method": "neuroflux", "batches": [b["batch"] for b in r["blocks"]], "wall_s": r["wall_s"],
            "epochs": [b["epochs"] for b in r["blocks"]],
            "block_peak_bytes": [b["counted_bytes"] for b in r["blocks"]],
            "test_accuracy": r["test_accuracy"], "timeline": r["timeline"], "peak_bytes": r["peak_bytes"],
            "params": r["exit_params"], "cache_bytes": r["cache_bytes"], "exit_layer": r["exit_layer"],
            "exit_name": r["exit_name"], "per_layer": r["per_layer"], "onnx_parity": r["onnx_parity"],
            "last_layer_test_accuracy": r["per_layer"][-1]["test_accuracy"]}
    bp = rows.get("backprop")
    full = body["local"]["full_params"]
    summary = summarize(rows)
    for name, row in rows.items():
        row.update(summary[name])
        row["params_ratio"] = full / row["params"]
        row["speedup_vs_backprop"] = bp["wall_s"] / row["wall_s"] if bp else None
        row["peak_vs_backprop_points"] = (row["peak_test_accuracy"] - bp["peak_test_accuracy"]) if bp else None
    result = {"model": a.model, "target": a.target, "budget": a.budget, "budget_bytes": body["budget"]["bytes"],
              "epochs": a.epochs, "patience": patience, "data": a.data, "train_samples": len(splits.train_y),
              "val_samples": len(splits.val_y), "test_samples": len(splits.test_y), "threads": a.threads,
              "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "compile_s": compile_s,
              "blocks": comp["blocks"], "full_params": full, "methods": rows}
    con = console()
    t = Table(title=f"{a.model} on {a.data} ({len(splits.train_y)} train / {len(splits.val_y)} val / "
                    f"{len(splits.test_y)} test), budget {a.budget}, patience {patience} (cap {a.epochs} epochs), "
                    f"{a.threads} thread(s)")
    for col in ("method", "batch(es)", "epochs", "wall s", "peak test %", "to peak (s)", "to BP peak (s)",
                "peak MB", "params", "cache MB"):
        t.add_column(col)
    for row in rows.values():
        tt, ep = row["time_to_backprop_peak_s"], row["epochs"]
        t.add_row(row["method"], ",".join(map(str, row["batches"])),
                  str(ep) if row.get("epochs_per_block") is None else "+".join(map(str, row["epochs_per_block"])),
                  f"{row['wall_s']:.1f}", f"{row['peak_test_accuracy']:.2f}", f"{row['time_to_peak_s']:.1f}",
                  "not reached" if tt is None else f"{tt:.1f}", f"{row['peak_bytes'] / 1e6:.1f}",
                  f"{row['params']:,}", f"{row['cache_bytes'] / 1e6:.1f}")
    con.print(t)
    os.makedirs(a.out, exist_ok=True)
    paths = [os.path.join(a.out, "local_learning.json")] + ([a.json] if a.json else [])
    for p in paths:
        write_json(p, result)
    fig = plot_local_learning(result, a.out, f"local_learning_{a.model}")
    if bp:
        print(markdown_table(result))
    print("wrote " + ", ".join(paths + fig["files"]))
    return result


if __name__ == "__main__":
    main()
