"""The CLI's local-learning parts: `compile --mode local`, `train`, and `inspect` of a local schedule."""
from __future__ import annotations

import argparse
import sys

from edgetrain.compiler.schedule_file.format import MODES

from .choices import Choices

# Registries whose modules import torch: read when an option is checked or help is printed, not at start-up.
METHODS = Choices("edgetrain.compiler.local.memory_lines", "METHODS")
CACHE_DTYPES = Choices("edgetrain.runtime.python.activation_cache", "CACHE_DTYPES")
DATASETS = Choices("edgetrain.compiler.workbench.data", "DATASETS")

__all__ = ["add_compile_options", "add_train_parser", "compile_local_cmd", "train_cmd", "inspect_local",
           "print_local"]


def add_compile_options(c: argparse.ArgumentParser) -> None:
    c.add_argument("--mode", default="poet", choices=MODES,
                   help="poet: one backprop step scheduled by the MILP; local: NeuroFlux block-wise local "
                        "learning (heads, memory lines, Algorithm 1; the budget must be a size like 64MB)")
    c.add_argument("--cap", type=int, default=256, help="--mode local: largest batch of a block")
    c.add_argument("--rho", type=float, default=0.40,
                   help="--mode local: neighbouring layers whose feasible batches differ by less than rho "
                        "(relative) share a block")
    c.add_argument("--cache-dtype", default="float32", choices=CACHE_DTYPES,
                   help="--mode local: dtype of the cached block outputs on storage")
    c.add_argument("--profile", default="counter", choices=METHODS,
                   help="--mode local: how layer memory is measured: counter (the tensors a step holds; CPU), "
                        "profiler (torch.profiler memory events; CPU), cuda (torch.cuda.max_memory_allocated)")


def add_train_parser(sub) -> None:
    t = sub.add_parser("train", help="train a local-learning plan on a dataset; export the early-exit model")
    t.add_argument("dir")
    t.add_argument("--data", default="fashion-mnist", metavar="SOURCE",
                   help=f"{', '.join(DATASETS)} (with its own test split), a .npz or .safetensors file with arrays "
                        "x and y, or a folder with one sub-folder of images per class")
    t.add_argument("--eval-data", metavar="SOURCE", help="with your own --data: the test set (default: a "
                   "--holdout share of --data)")
    t.add_argument("--holdout", type=float, metavar="FRACTION",
                   help="with your own --data and no --eval-data: the share kept out as the test set (default 0.1)")
    t.add_argument("--epochs", type=int, default=1, help="epochs per block (with --patience: the most per block)")
    t.add_argument("--patience", type=int, help="each block trains until its validation accuracy has not improved "
                   "for this many epochs (at most --epochs)")
    t.add_argument("--timeline", action="store_true", help="test accuracy after every epoch (untimed), for the "
                   "accuracy-over-time figure (benchmarks/local_learning.py --figure)")
    t.add_argument("--train-size", type=int, help="a seeded subset of the training split (default: all)")
    t.add_argument("--test-size", type=int, help="the first N test images (default: all)")
    t.add_argument("--device", default="cpu", help="cpu or cuda")
    t.add_argument("--work", help="working folder (checkpoints, cache); default DIR/work; rerun to resume")
    t.add_argument("--no-export", action="store_true", help="skip the ONNX/safetensors export")
    t.add_argument("--json", action="store_true")


def compile_local_cmd(a, optimizer, progress=None) -> dict:
    """`optimizer`: the OptimizerConfig `compile` made of --lr, --momentum and --weight-decay (their defaults
    filled in where they were not given); local learning trains every block with SGD."""
    from edgetrain.compiler.errors import EdgetrainError
    from edgetrain.compiler.pipeline_local import LocalOptions, compile_local

    if optimizer.name != "sgd" or optimizer.nesterov:
        raise EdgetrainError("--mode local trains every block with SGD (--lr, --momentum, --weight-decay): drop "
                             "--optimizer and --nesterov, or use --mode poet")
    shape = tuple(a.input_shape) if a.input_shape else None
    opts = LocalOptions(model=a.model, target=a.target, budget=a.budget, out=a.out, cap=a.cap, rho=a.rho,
                        input_shape=shape, lr=optimizer.lr, momentum=optimizer.momentum,
                        weight_decay=optimizer.weight_decay,
                        cache_dtype=a.cache_dtype, seed=a.seed, profile_method=a.profile)
    return compile_local(opts, progress=progress)


def train_cmd(a, console) -> dict:
    from .local_train import train_dir

    from .local_train import epoch_line

    kw = dict(data=a.data, epochs=a.epochs, work=a.work, train_size=a.train_size, test_size=a.test_size,
              device=a.device, export=not a.no_export, patience=a.patience, eval_each_epoch=a.timeline,
              eval_data=a.eval_data, holdout=a.holdout,
              on_epoch=None if a.json else lambda rec: print(epoch_line(rec), flush=True))
    if a.json or not sys.stderr.isatty():
        return train_dir(a.dir, **kw)
    from rich.progress import Progress

    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("training", total=1)
        return train_dir(a.dir, **kw, progress=lambda what, k, n: bar.update(task, description=what,
                                                                               completed=k, total=n))


def inspect_local(body: dict) -> dict:
    local = body["local"]
    return {"mode": "local", "model": body["model"]["spec"], "target": body["target"]["name"],
            "budget_bytes": body["budget"]["bytes"], "min_feasible_bytes": body["budget"]["min_feasible_bytes"],
            "full_params": local["full_params"],
            "blocks": [{"index": b["index"], "batch": b["batch"], "peak_bytes": b["peak_bytes"],
                        "layers": [lb["name"] for lb in b["layers"]]} for b in local["partition"]["blocks"]],
            "layers": [{"name": l["name"], "out_shape": l["out_shape"], "params": l["params"],
                        "slope": l["line"]["slope"], "intercept": l["line"]["intercept"], "r2": l["line"]["r2"],
                        "head_params": h["params"]} for l, h in zip(local["layers"], local["heads"])]}


def print_local(cmd: str, r: dict, con) -> None:
    from rich.table import Table

    if cmd in ("compile", "inspect"):
        t = Table(title=f"{r['model']} on {r['target']}: local learning, budget {r['budget_bytes']} B "
                        f"(smallest feasible {r['min_feasible_bytes']} B)")
        for col in ("block", "batch", "predicted peak (B)", "layers"):
            t.add_column(col)
        for b in r["blocks"]:
            t.add_row(str(b["index"]), str(b["batch"]), f"{b['peak_bytes']:.0f}", ", ".join(b["layers"]))
        con.print(t)
        if cmd == "compile":
            con.print(f"memory lines: min R2 {r['min_r2']:.5f}, held-out error <= "
                      f"{100 * r['max_held_out_rel_error']:.2f}%; wrote {r['out']}/schedule.json, plan.py, "
                      "weights.safetensors")
        return
    t = Table(title=f"{r['plan']}: {r['epochs']} epoch(s) per block on {r['data']} ({r['train_samples']} train, "
                    f"{r['val_samples']} val, {r['test_samples']} test)")
    for col in ("layer", "val acc", "test acc", "exit params"):
        t.add_column(col)
    for x in r["per_layer"]:
        mark = " <- exit" if x["layer"] == r["exit_layer"] else ""
        t.add_row(x["name"] + mark, f"{x['val_accuracy']:.2f}", f"{x['test_accuracy']:.2f}", str(x["exit_params"]))
    con.print(t)
    con.print(f"exit {r['exit_name']}: test accuracy {r['test_accuracy']:.2f}%, {r['exit_params']} params "
              f"({r['params_ratio']:.1f}x fewer than {r['full_params']}); {r['wall_s']:.1f} s training, "
              f"peak {r['peak_bytes']} B (budget {r['budget_bytes']} B), cache {r['cache_bytes']} B")
    if "onnx" in r:
        p = r["onnx_parity"]
        con.print(f"wrote {r['onnx']} (onnxruntime vs torch: max abs diff {p['max_abs_diff']:.2g}, "
                  f"same predictions {100 * p['same_predictions']:.1f}%) and {r['safetensors']}")
