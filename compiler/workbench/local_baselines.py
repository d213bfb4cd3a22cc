"""The baselines NeuroFlux is measured against, in the same harness and under the same memory budget.

* **backprop**: the whole zoo model (same initial weights as the local plan's layers) trained end to end with
  SGD at the largest batch whose memory line (the same byte counter, whole model) fits the budget.
* **classic local learning**: every layer gets the same fixed head (not sized to its layer), all layers
  train at one fixed batch (the largest that every layer + fixed head fits under the budget), layer by
  layer, with no cache: each batch is re-run through the already trained layers. It runs on the same
  Controller/Worker as NeuroFlux (one block per layer, ``cache=False``).
Both record the validation and test accuracy after every epoch, outside the timed training, for
time-to-accuracy; with ``patience`` both stop when validation accuracy has not improved for that many epochs.
"""
from __future__ import annotations

import copy
import time

import torch
from torch import nn

from edgetrain.runtime.python.local_layers import build
from edgetrain.runtime.python.local_trainer import Splits, scaled_lr, train_local

from edgetrain.compiler.schedule_file import format as schedule_format
from edgetrain.compiler.frontend.modelspec import resolve
from edgetrain.compiler.local.memory_lines import (max_batch_under, measure_model_step_bytes, measure_step_bytes, model_memory_line, fit_line)
from edgetrain.compiler.local.partition import DEFAULT_CAP

__all__ = ["FIXED_HEAD_CHANNELS", "fixed_head_spec", "train_backprop", "train_classic"]

FIXED_HEAD_CHANNELS = 128  # one head for all layers, wide enough for the deepest (DGL/InfoPro-style fixed width)
FIXED_HEAD_POOL = 2


def fixed_head_spec(in_channels: int, classes: int) -> list[dict]:
    h, s = FIXED_HEAD_CHANNELS, FIXED_HEAD_POOL
    return [
        {"op": "conv2d", "in": in_channels, "out": h, "kernel": 3, "stride": 1, "padding": 1, "groups": 1,
         "bias": True},
        {"op": "relu"}, {"op": "adaptive_avgpool2d", "size": s}, {"op": "flatten"},
        {"op": "linear", "in": h * s * s, "out": classes, "bias": True},
    ]


@torch.no_grad()
def _test_accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, dev) -> float:
    model.eval()
    correct = 0
    for start in range(0, len(y), 256):
        correct += int((model(x[start:start + 256].to(dev)).argmax(1) == y[start:start + 256].to(dev)).sum())
    return 100.0 * correct / max(len(y), 1)


def train_backprop(body: dict, splits: Splits, epochs: int, *, cap: int = DEFAULT_CAP,
                   line_batches=(2, 4, 8, 16), device: str = "cpu", patience: int | None = None) -> dict:
    """End-to-end SGD of the schedule's model under its budget (``body`` is a local schedule); ``epochs``
    epochs, or with ``patience`` until validation accuracy has not improved for that many (``epochs``: cap)."""
    m, local = body["model"], body["local"]
    in_shape = tuple(m["input_shape"])
    torch.manual_seed(body["seed"])  # the same initial weights as compile_local's layers
    model = resolve(m["spec"], **m["kwargs"]).module
    line = model_memory_line(model, in_shape, line_batches, m["num_classes"])
    batch = max_batch_under(line, body["budget"]["bytes"], cap)
    peak = measure_model_step_bytes(copy.deepcopy(model), in_shape, batch, m["num_classes"]).peak
    dev = torch.device(device)
    model.to(dev)
    tr = local["training"]
    opt = torch.optim.SGD(model.parameters(), lr=scaled_lr(tr, batch), momentum=tr["momentum"], weight_decay=tr["weight_decay"])
    n, wall, timeline = len(splits.train_y), 0.0, []
    best_val, since_best = None, 0
    for epoch in range(epochs):
        t0 = time.perf_counter()
        model.train()
        order = torch.randperm(n, generator=torch.Generator().manual_seed(body["seed"] * 7919 + epoch))
        for start in range(0, n, batch):
            sel = order[start:start + batch]
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(splits.train_x[sel].to(dev)), splits.train_y[sel].to(dev)).backward()
            opt.step()
        wall += time.perf_counter() - t0
        val = _test_accuracy(model, splits.val_x, splits.val_y, dev)
        timeline.append({"epoch": epoch + 1, "wall_s": wall, "val_accuracy": val,
                         "test_accuracy": _test_accuracy(model, splits.test_x, splits.test_y, dev)})
        if best_val is None or val > best_val:
            best_val, since_best = val, 0
        else:
            since_best += 1
        if patience is not None and since_best >= patience:
            break
    return {"method": "backprop", "batch": batch, "batches": [batch], "epochs": len(timeline),
            "wall_s": wall, "lr": scaled_lr(tr, batch),
            "test_accuracy": timeline[-1]["test_accuracy"], "timeline": timeline, "peak_bytes": peak,
            "params": sum(p.numel() for p in model.parameters()), "cache_bytes": 0,
            "line": {"slope": line.slope, "intercept": line.intercept, "r2": line.r2}}


def train_classic(body: dict, weights: dict[str, torch.Tensor], splits: Splits, epochs: int, workdir: str, *,
                  cap: int = DEFAULT_CAP, line_batches=(2, 4, 8, 16), device: str = "cpu",
                  patience: int | None = None) -> dict:
    """Classic local learning: fixed heads, one fixed batch, no cache (``weights``: the plan's initial ones)."""
    local, classes = body["local"], body["model"]["num_classes"]
    budget = body["budget"]["bytes"]
    heads = [fixed_head_spec(l["out_shape"][0], classes) for l in local["layers"]]
    batches = []
    for l, h in zip(local["layers"], heads):
        peaks = []
        for b in line_batches:
            torch.manual_seed(0)
            peaks.append(measure_step_bytes(build(l["spec"]), build(h), tuple(l["in_shape"]), b, classes).peak)
        batches.append(max_batch_under(fit_line(line_batches, peaks), budget, cap, name=l["name"]))
    batch = min(batches)
    torch.manual_seed(body["seed"] + 1)
    initial = {k: v for k, v in weights.items() if k.startswith("layer.")}
    for i, h in enumerate(heads):
        initial.update({f"head.{i}.{k}": v for k, v in build(h).state_dict().items()})
    tr = local["training"]
    plan = {"schedule_content": "classic:" + schedule_format.content_hash(body), "seed": body["seed"], "cache_dtype": "float32",
            "optimizer": {"lr": tr["lr"], "momentum": tr["momentum"], "weight_decay": tr["weight_decay"],
                          "lr_reference_batch": tr.get("lr_reference_batch")},
            "layers": local["layers"], "heads": heads,
            "blocks": [{"index": i, "layers": [i], "batch": batch} for i in range(len(heads))]}
    res = train_local(plan, splits, workdir, epochs, cache=False, device=device, eval_each_epoch=True,
                      initial=initial, patience=patience)
    last = len(heads) - 1
    acc = res["blocks"][-1]["test_accuracy"][str(last)]
    params = sum(l["params"] for l in local["layers"]) + sum(p.numel() for p in res["heads"][last].parameters())
    return {"method": "classic-ll", "batch": batch, "batches": [batch] * len(heads), "wall_s": res["wall_s"],
            "epochs": [bl["epochs"] for bl in res["blocks"]],
            "test_accuracy": acc, "timeline": res["timeline"],
            "peak_bytes": max(b["counted_bytes"] for b in res["blocks"]), "params": params, "cache_bytes": 0,
            "block_peak_bytes": [b["counted_bytes"] for b in res["blocks"]],
            "per_layer_test_accuracy": [b["test_accuracy"][str(b["index"])] for b in res["blocks"]]}
