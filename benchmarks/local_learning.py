"""Local learning benchmark: backprop vs classic local learning vs NeuroFlux, side by side in one run.

    .venv/bin/python benchmarks/local_learning.py [--model vgg11] [--budget 128MB] [--epochs 2]
        [--data fashion-mnist] [--train-size 6000] [--test-size 2000] [--threads 2]
        [--methods backprop,classic,neuroflux] [--out build/bench/local_learning]

All three train the same model from the same initial weights on the same data split, under the same memory
budget (bytes by the same counter: each method's largest batch is read off its memory line). Reported per
method: training wall time for the same number of epochs (evaluation excluded, NeuroFlux's caching
included), time to reach backprop's final test accuracy, test accuracy, peak bytes (the counted real step),
output parameters, cache bytes. Prints a table and writes JSON.
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
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from edgetrain.compiler.schedule_file import format as schedule_format  # noqa: E402
from edgetrain.compiler.workbench.local_baselines import train_backprop, train_classic  # noqa: E402
from edgetrain.compiler.pipeline_local import WEIGHTS, LocalOptions, compile_local  # noqa: E402
from edgetrain.compiler.workbench.local_train import load_splits, train_dir  # noqa: E402


def _time_to(timeline: list[dict], accuracy: float) -> float | None:
    """Training seconds until some model the method has produced so far reaches ``accuracy`` on the test
    split (local learning: any trained head is an exit; backprop: the model after each epoch)."""
    key = lambda t: t.get("best_exit_test_accuracy", t["test_accuracy"])  # noqa: E731
    return next((t["wall_s"] for t in timeline if key(t) >= accuracy), None)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="vgg11")
    ap.add_argument("--target", default="jetson-agx-orin")
    ap.add_argument("--budget", default="128MB")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--data", default="fashion-mnist", choices=["fashion-mnist", "digits"])
    ap.add_argument("--train-size", type=int, default=6000)
    ap.add_argument("--test-size", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--cache-dtype", default="float32", choices=["float32", "float16"])
    ap.add_argument("--methods", default="backprop,classic,neuroflux")
    ap.add_argument("--out", default="build/bench/local_learning")
    a = ap.parse_args(argv)
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
        rows["backprop"] = train_backprop(body, splits, a.epochs)
    if "classic" in methods:
        rows["classic"] = train_classic(body, load_file(os.path.join(plan_dir, WEIGHTS)), splits, a.epochs,
                                        os.path.join(a.out, "classic"))
    if "neuroflux" in methods:
        r = train_dir(plan_dir, a.data, a.epochs, work=os.path.join(a.out, "neuroflux"), eval_each_epoch=True,
                      splits=splits)
        rows["neuroflux"] = {
            "method": "neuroflux", "batches": [b["batch"] for b in r["blocks"]], "wall_s": r["wall_s"],
            "test_accuracy": r["test_accuracy"], "timeline": r["timeline"], "peak_bytes": r["peak_bytes"],
            "params": r["exit_params"], "cache_bytes": r["cache_bytes"], "exit_layer": r["exit_layer"],
            "exit_name": r["exit_name"], "per_layer": r["per_layer"], "onnx_parity": r["onnx_parity"],
            "last_layer_test_accuracy": r["per_layer"][-1]["test_accuracy"]}
    bp = rows.get("backprop")
    full = body["local"]["full_params"]
    for row in rows.values():
        row["speedup_vs_backprop"] = bp["wall_s"] / row["wall_s"] if bp else None
        row["time_to_backprop_accuracy_s"] = _time_to(row["timeline"], bp["test_accuracy"]) if bp else None
        row["params_ratio"] = full / row["params"]
        row["accuracy_vs_backprop_points"] = row["test_accuracy"] - bp["test_accuracy"] if bp else None
    result = {"model": a.model, "target": a.target, "budget": a.budget, "budget_bytes": body["budget"]["bytes"],
              "epochs": a.epochs, "data": a.data, "train_samples": len(splits.train_y),
              "test_samples": len(splits.test_y), "threads": a.threads, "compile_s": compile_s,
              "blocks": comp["blocks"], "full_params": full, "methods": rows}
    if bp and "neuroflux" in rows:
        nf = rows["neuroflux"]
        result["targets"] = {
            "backprop_batch_smaller_than_every_block": bp["batch"] < min(nf["batches"]),
            "speedup_ge_2": nf["speedup_vs_backprop"] >= 2.0,
            "accuracy_within_2_points": nf["accuracy_vs_backprop_points"] >= -2.0,
            "params_ratio_ge_5": nf["params_ratio"] >= 5.0,
        }
    t = Table(title=f"{a.model} on {a.data} ({len(splits.train_y)} train / {len(splits.test_y)} test), "
                    f"budget {a.budget}, {a.epochs} epoch(s), {a.threads} threads")
    for col in ("method", "batch(es)", "wall s", "vs BP", "to BP acc (s)", "test acc %", "peak MB", "params",
                "cache MB"):
        t.add_column(col)
    for row in rows.values():
        tt = row["time_to_backprop_accuracy_s"]
        t.add_row(row["method"], ",".join(map(str, row["batches"])), f"{row['wall_s']:.1f}",
                  "-" if row["speedup_vs_backprop"] is None else f"{row['speedup_vs_backprop']:.2f}x",
                  "not reached" if tt is None else f"{tt:.1f}", f"{row['test_accuracy']:.2f}",
                  f"{row['peak_bytes'] / 1e6:.1f}", f"{row['params']:,}", f"{row['cache_bytes'] / 1e6:.1f}")
    Console().print(t)
    if "targets" in result:
        Console().print(result["targets"])
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "local_learning.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {os.path.join(a.out, 'local_learning.json')}")
    return result


if __name__ == "__main__":
    main()
