"""`edgetrain train DIR`: run a local-learning plan on a real dataset, pick the early exit, export it.

Data: the split's training images (optionally a seeded subset) minus a stratified validation part, which
only the early-exit choice sees; the test split reports the accuracy. The plan's ``train`` (the runtime's
Controller/Worker) does the training in ``DIR/work`` and resumes there after a kill. Then every head is a
candidate exit (:func:`~edgetrain.compiler.workbench.local_export.select_exit`); the exit model (trunk up to the exit + its head)
is written as safetensors and ONNX, and the ONNX file is checked against torch with onnxruntime.
"""
from __future__ import annotations

import json
import os
import time

import torch

from edgetrain.runtime.python import load_plan
from edgetrain.runtime.python.local_trainer import Splits

from edgetrain.compiler.schedule_file import format as schedule_format
from .data import DATASETS, adapt_images, load_dataset, train_val_split
from .run_data import HOLDOUT, check_labels, held_out, open_source, plan_facts
from edgetrain.compiler.errors import EdgetrainError
from .local_export import (check_onnx, count_params, exit_model, export_onnx, export_safetensors, select_exit)

__all__ = ["load_splits", "train_dir", "exit_candidates", "epoch_line"]


class _Tee(list):
    """The epochs' records, each also handed on as it arrives."""

    def __init__(self, on_epoch) -> None:
        super().__init__()
        self.on_epoch = on_epoch

    def append(self, rec: dict) -> None:
        super().append(rec)
        self.on_epoch(rec)


def load_splits(data: str, input_shape, *, val_fraction: float, seed: int = 0, train_size: int | None = None,
                test_size: int | None = None, body: dict | None = None, eval_data: str | None = None,
                holdout: float | None = None) -> Splits:
    """Training, validation (the early exit's choice) and test splits. `data`: a named dataset (its own test
    split), or with the schedule `body` a .npz/.safetensors file or an image folder, read and checked as `run`
    reads them, whose test split is `eval_data` or a seeded `holdout` share (default 0.1)."""
    if body is not None:
        facts = plan_facts(body)
        if data in DATASETS:
            for split in ("train", "test"):  # its class ids against the heads' classes, before any training
                check_labels(load_dataset(data, split)[1].numpy(), facts, data)
        else:
            return _own_splits(data, body, val_fraction=val_fraction, seed=seed, eval_data=eval_data,
                               holdout=holdout)
    if eval_data or holdout:
        raise EdgetrainError(f"--data {data} has a test split of its own; --eval-data and --holdout are for your "
                             "own data")
    # Native images first, subset, then resized: a 10k-image subset never costs the 60k resized split.
    try:
        x, y = load_dataset(data, "train")
        xt, yt = load_dataset(data, "test")
    except ValueError as e:
        raise EdgetrainError(str(e)) from None
    if train_size is not None and train_size < len(y):
        keep = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))[:train_size].sort().values
        x, y = x[keep], y[keep]
    if test_size is not None and test_size < len(yt):
        xt, yt = xt[:test_size], yt[:test_size]
    c, h, w = input_shape
    x, xt = (adapt_images(v, channels=c, size=(h, w)) for v in (x, xt))
    xtr, ytr, xv, yv = train_val_split(x, y, val_fraction, seed)
    return Splits(xtr, ytr, xv, yv, xt, yt)


def _own_splits(data: str, body: dict, *, val_fraction: float, seed: int, eval_data: str | None,
                holdout: float | None) -> Splits:
    ds = open_source(data, body)
    if ds is None:
        raise EdgetrainError("`train` needs data to learn from: a dataset, a .npz/.safetensors file or a folder")
    if eval_data:
        test = open_source(eval_data, body)
    else:
        ds, test = held_out(ds, HOLDOUT if holdout is None else holdout, seed)
    x, y = ds.all()
    xt, yt = test.all()
    xtr, ytr, xv, yv = train_val_split(x, y, val_fraction, seed)
    return Splits(xtr, ytr, xv, yv, xt, yt)


def epoch_line(rec: dict) -> str:
    """One line a user reads as an epoch of a block ends."""
    acc = rec["val_accuracy"]
    best = max(acc, key=lambda k: acc[k]) if acc else None
    loss = "-" if rec["loss"] is None else f"{rec['loss']:.4f}"
    return (f"block {rec['block'] + 1}/{rec['blocks']} epoch {rec['epoch']}/{rec['epochs']}: loss {loss} "
            f"(layer {rec['layer']}'s head)" + (f", held-out accuracy {acc[best]:.1f}% (layer {best}'s head)"
                                                  if best is not None else "") + f", {rec['wall_s']:.1f} s")


def exit_candidates(local: dict, blocks: list[dict]) -> tuple[list[float], list[float], list[int]]:
    """Per layer: validation accuracy, test accuracy, and the parameters of the exit model ending there."""
    val, test = {}, {}
    for b in blocks:
        val.update({int(k): v for k, v in b["val_accuracy"].items()})
        test.update({int(k): v for k, v in b["test_accuracy"].items()})
    n = len(local["layers"])
    trunk, params = 0, []
    for i in range(n):
        trunk += local["layers"][i]["params"]
        params.append(trunk + local["heads"][i]["params"])
    return [val[i] for i in range(n)], [test[i] for i in range(n)], params


def train_dir(plan_dir: str, data: str = "fashion-mnist", epochs: int = 1, *, work: str | None = None,
              train_size: int | None = None, test_size: int | None = None, device: str = "cpu",
              cache: bool = True, eval_each_epoch: bool = False, export: bool = True, progress=None,
              splits: Splits | None = None, patience: int | None = None, eval_data: str | None = None,
              holdout: float | None = None, on_epoch=None) -> dict:
    """``splits``: data already loaded by :func:`load_splits` (a benchmark shares it between methods).
    ``patience``: each block trains until its validation accuracy has not improved for that many epochs
    (``epochs`` is then the cap per block)."""
    body = schedule_format.load(plan_dir)
    if body.get("mode") != "local":
        raise EdgetrainError(f"{plan_dir} holds a {body.get('mode')} schedule; `edgetrain train` runs "
                             "local-learning plans: compile with `edgetrain compile MODEL --mode local ...` "
                             "(use `edgetrain run` for POET plans)")
    if epochs < 1:
        raise EdgetrainError(f"--epochs must be >= 1, got {epochs}")
    local = body["local"]
    plan = load_plan(plan_dir)
    if plan.PLAN.get("schedule_content") != schedule_format.content_hash(body):
        raise EdgetrainError(f"{plan_dir}/plan.py was not generated from this schedule.json; recompile")
    if splits is None:
        splits = load_splits(data, tuple(body["model"]["input_shape"]),
                             val_fraction=local["training"]["val_fraction"], seed=body["seed"],
                             train_size=train_size, test_size=test_size, body=body, eval_data=eval_data,
                             holdout=holdout)
    work = work or os.path.join(plan_dir, "work")
    epochs_seen: list[dict] = []
    if on_epoch is not None:
        epochs_seen = _Tee(on_epoch)
    t0 = time.perf_counter()
    res = plan.train(splits, work, epochs, cache=cache, device=device, progress=progress,
                     eval_each_epoch=eval_each_epoch, patience=patience, on_epoch=epochs_seen.append)
    process_s = time.perf_counter() - t0
    val, test, params = exit_candidates(local, res["blocks"])
    k = select_exit(val, params, local["training"]["exit_tolerance_points"])
    out = {
        "plan": plan_dir, "data": data, "epochs": epochs, "patience": patience, "device": device, "cache": cache,
        "train_samples": len(splits.train_y), "val_samples": len(splits.val_y), "test_samples": len(splits.test_y),
        "test_accuracy": test[k], "val_accuracy": val[k], "exit_layer": k, "exit_name": local["layers"][k]["name"],
        "exit_params": params[k], "full_params": local["full_params"],
        "params_ratio": local["full_params"] / params[k],
        "wall_s": res["wall_s"], "process_wall_s": process_s, "resumed": res["resumed"],
        "peak_bytes": max(b["counted_bytes"] for b in res["blocks"]),
        "cuda_peak_bytes": max((b["cuda_max_allocated"] or 0) for b in res["blocks"]) if device != "cpu" else None,
        "budget_bytes": body["budget"]["bytes"], "cache_bytes": res["cache_bytes"],
        "cache_dtype": local["training"]["cache_dtype"],
        "per_layer": [{"layer": i, "name": local["layers"][i]["name"], "val_accuracy": val[i],
                       "test_accuracy": test[i], "exit_params": params[i]} for i in range(len(val))],
        "blocks": [{kk: v for kk, v in b.items() if kk not in ("val_accuracy", "test_accuracy")}
                   for b in res["blocks"]],
        "timeline": res["timeline"], "epoch_log": list(epochs_seen),
    }
    if export:
        model = exit_model(res["layers"], res["heads"], k).cpu().eval()
        if count_params(model) != params[k]:
            raise EdgetrainError(f"exit model has {count_params(model)} parameters, the schedule says {params[k]}: "
                                 "plan.py and schedule.json disagree; recompile")
        meta = {"edgetrain.exit_layer": str(k), "edgetrain.schedule": schedule_format.content_hash(body),
                "edgetrain.specs": json.dumps({"layers": [l["spec"] for l in local["layers"][:k + 1]],
                                               "head": local["heads"][k]["spec"]}, sort_keys=True)}
        exp = os.path.join(plan_dir, "export")
        st = export_safetensors(model, os.path.join(exp, "exit.safetensors"), meta)
        onnx_path = export_onnx(model, splits.test_x[:2], os.path.join(exp, "exit.onnx"))
        parity = check_onnx(model, onnx_path, splits.test_x[:256])
        out.update({"safetensors": str(st), "onnx": str(onnx_path), "onnx_parity": parity})
    return out
