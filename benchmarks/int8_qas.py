"""Fine-tuning the last block's biases in int8 (QAS) beside the same training in float32, on Fashion-MNIST.

    .venv/bin/python benchmarks/int8_qas.py [--steps 300] [--eval 1000] [--pretrain-steps 400]
        [--headroom 1] [--json docs/data/int8_qas.json]

mcu_mbv2_40 is first trained whole in float32 on Fashion-MNIST (benchmarks/int8_finetune.py's `pretrain`: Adam,
batch 64), its head (batch norm, classifier) reset to a fresh initialisation. Both runs then train the same set,
`--train 'features.3.*bias,head.1.*,classifier.*'` (the last block's three biases and the head), for --steps steps
of batch 1 on the same Fashion-MNIST images with SGD (momentum 0.9, weight decay 5e-4):

- float32: torch autograd on the float model;
- int8: the backbone int8 (calibrated on Fashion-MNIST), the last block's biases int32 trained by the integer step of
  runtime/python/int8_qas.py (the bits the C kernels compute), the head float32 fed the dequantised boundary;
- and, for reference, float32 training the head alone (the biases frozen).

Each is measured on the first --eval test images: batch norm in eval mode (its running statistics), and on each image's
own statistics (batch norm in training mode at batch 1, as it trained). Needs `make data`.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.int8_finetune import pretrain  # noqa: E402
from benchmarks.output import write_json  # noqa: E402
from edgetrain.compiler.graph.ir import OptimizerConfig  # noqa: E402
from edgetrain.compiler.graph.quantize import (calibrate, prefix_program, qas_biases, qas_or_error,  # noqa: E402
                                               quantize_region)
from edgetrain.compiler.pipeline import CompileOptions, build_graph  # noqa: E402
from edgetrain.compiler.workbench.calibration import calibration_of  # noqa: E402
from edgetrain.compiler.workbench.data import fashion_mnist, fashion_mnist_batches  # noqa: E402
from edgetrain.runtime.python import int8_qas as qas  # noqa: E402
from edgetrain.targets import load_target  # noqa: E402

TRAIN = "features.3.*bias,head.1.*,classifier.*"
BOUNDARY_MODULE = "head.0"  # the region's last node, the head's 1x1 conv: its output is the dequantised boundary


def _hooked(model):
    m, cur = copy.deepcopy(model), {}

    def hook(mod, args, out):
        cur["t"] = torch.from_numpy(cur["b"]).reshape(out.shape).requires_grad_(m.training)
        return cur["t"]
    m.get_submodule(BOUNDARY_MODULE).register_forward_hook(hook)
    return m, cur


def run(steps: int, n_eval: int, lr: float, momentum: float, pretrain_steps: int, work: str | None,
        headroom: float = 1.0) -> list[dict]:
    work = work or tempfile.mkdtemp(prefix="int8_qas_")
    os.makedirs(work, exist_ok=True)
    shape = (3, 40, 40)
    spec = os.path.join(work, "pretrained_model.py") + ":make"
    if not os.path.exists(spec.rsplit(":", 1)[0]):
        spec = pretrain("mcu_mbv2_40", shape, pretrain_steps, work)
    opt_cfg = OptimizerConfig.of("sgd", lr=lr, momentum=momentum)
    _, model, g = build_graph(CompileOptions(model=spec, target="nrf52840", budget="auto", out="unused", batch_size=1,
                                             emit="c", train=TRAIN, input_shape=shape, optimizer=opt_cfg),
                              load_target("nrf52840"))
    prefix, tail = qas_or_error(g)
    weights = dict(model.named_parameters())
    ranges = calibrate(g, prefix + tail, weights, calibration_of("fashion-mnist")((1, *shape), 0, 4))
    ranges.update({t: (lo * headroom, hi * headroom) for t, (lo, hi) in ranges.items() if t in tail})  # room to drift
    q = quantize_region(g, prefix + tail, ranges, weights)
    program, values, trained = json.loads(prefix_program(q)), q.values, qas_biases(g, tail)
    opt = qas.sgd_of(g.optimizer.to_json())
    state = qas.initial_state(program, values, trained)
    boundary = next(s["name"] for s in program if s["op"] == "q8_dequantize")

    head, cur = _hooked(model)
    head_opt = torch.optim.SGD([p for n, p in head.named_parameters() if n in set(g.trainable_params) - set(trained)],
                               lr=lr, momentum=momentum, weight_decay=opt.weight_decay)
    ref = copy.deepcopy(model)
    ref_opt = torch.optim.SGD([p for n, p in ref.named_parameters() if n in set(g.trainable_params)], lr=lr,
                              momentum=momentum, weight_decay=opt.weight_decay)
    only = copy.deepcopy(model)  # the head alone, float32: what training the biases too is measured against
    only_opt = torch.optim.SGD([p for n, p in only.named_parameters() if n in set(g.trainable_params) - set(trained)],
                               lr=lr, momentum=momentum, weight_decay=opt.weight_decay)
    losses = {"int8": [], "float32": [], "float32, head only": []}
    t0 = time.time()
    for x, y in fashion_mnist_batches(shape, 1, steps, seed=1):
        def float_head(b):
            cur["b"] = b[boundary]
            head_opt.zero_grad()
            loss = F.cross_entropy(head(x), y)
            loss.backward()
            head_opt.step()
            return loss.item(), {boundary: cur["t"].grad.numpy()}
        losses["int8"].append(qas.train_step(program, values, state, opt, trained, x.numpy(), float_head))
        ref_opt.zero_grad()
        loss = F.cross_entropy(ref(x), y)
        loss.backward()
        ref_opt.step()
        losses["float32"].append(loss.item())
        only_opt.zero_grad()
        loss = F.cross_entropy(only(x), y)
        loss.backward()
        only_opt.step()
        losses["float32, head only"].append(loss.item())
    print(f"{steps} steps in {time.time() - t0:.0f} s", flush=True)

    xt, yt = fashion_mnist("test", resize_to=shape[1:], channels=shape[0])
    xt, yt = xt[:n_eval], yt[:n_eval]
    bounds = np.concatenate([qas.forward(program, values, state, xt[k:k + 100].numpy().astype(np.float32))
                             .boundary[boundary] for k in range(0, n_eval, 100)])
    models = {"int8": head, "float32": ref, "float32, head only": only}
    right = {v: 0 for v in models}
    per_image = {v: 0 for v in models}  # batch norm on each image's own statistics, as batch 1 trained it
    with torch.no_grad():
        for v, m in models.items():
            m.eval()
            for k in range(0, n_eval, 100):
                cur["b"] = bounds[k:k + 100]
                right[v] += int((m(xt[k:k + 100]).argmax(1) == yt[k:k + 100]).sum())
            m.train()
            for bn in (b for b in m.modules() if isinstance(b, torch.nn.BatchNorm2d)):
                bn.track_running_stats, bn.running_mean, bn.running_var = False, None, None
            for k in range(n_eval):
                cur["b"] = bounds[k:k + 1]
                per_image[v] += int(m(xt[k:k + 1]).argmax(1).item() == int(yt[k]))
    init = {b: weights[b].detach().double().numpy() for b in trained}
    real = qas.real_biases(program, state)
    fl = dict(ref.named_parameters())
    drift = {b: float(np.linalg.norm((real[b] - init[b]) - (fl[b].detach().double().numpy() - init[b]))
                      / max(np.linalg.norm(fl[b].detach().double().numpy() - init[b]), 1e-30)) for b in trained}
    rows = []
    for variant in ("float32, head only", "float32", "int8"):
        ls = losses[variant]
        rows.append({"model": "mcu_mbv2_40", "train": "head.1.*,classifier.*" if "only" in variant else TRAIN,
                     "variant": variant, "pretrain_steps": pretrain_steps,
                     "steps": steps, "lr": lr, "momentum": momentum, "weight_decay": opt.weight_decay,
                     **({"tail_range_headroom": headroom} if variant == "int8" else {}),
                     "test_accuracy": right[variant] / n_eval, "eval_examples": n_eval,
                     "test_accuracy_per_image_statistics": per_image[variant] / n_eval,
                     "first_50_mean_loss": float(np.mean(ls[:50])), "last_50_mean_loss": float(np.mean(ls[-50:])),
                     **({"bias_change_rel_l2_vs_float32": drift} if variant == "int8" else {})})
        print(f"{variant}: test accuracy {rows[-1]['test_accuracy']:.3f} on {n_eval} "
              f"({rows[-1]['test_accuracy_per_image_statistics']:.3f} on each image's own statistics), loss "
              f"{rows[-1]['first_50_mean_loss']:.3f} -> {rows[-1]['last_50_mean_loss']:.3f}", flush=True)
    print("bias change, int8 vs float32 (relative L2):", {k: round(v, 3) for k, v in drift.items()})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--eval", type=int, default=1000)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--pretrain-steps", type=int, default=400)
    p.add_argument("--headroom", type=float, default=1.0,
                   help="the trained block's calibrated activation ranges widened by this factor (room to drift)")
    p.add_argument("--work", help="a folder for the pretrained model (reused when it holds one)")
    p.add_argument("--json", default=os.path.join(ROOT, "build", "bench", "int8_qas.json"))
    a = p.parse_args()
    write_json(a.json, run(a.steps, a.eval, a.lr, a.momentum, a.pretrain_steps, a.work, a.headroom))


if __name__ == "__main__":
    main()
