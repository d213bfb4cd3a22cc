"""Fine-tuning a float head on an int8 frozen backbone under QEMU, against the float32 plan of the same model.

    .venv/bin/python benchmarks/int8_finetune.py [--model benchmarks/fmnist_cnn.py:fmnist_cnn] [--steps 300]
        [--eval 1000] [--pretrain-steps 400] [--json docs/data/int8_finetune.json]

A backbone is only worth fine-tuning a head on when its features mean something: the model (benchmarks/fmnist_cnn.py
by default: three frozen convolutions, a trained linear head) is first trained whole in float32 with torch on
Fashion-MNIST (--pretrain-steps of Adam, batch 64), then its trained head is reset to a fresh initialisation, and
that model is what the device fine-tunes. It is compiled twice for the nRF52840 with --emit c (batch 1, SGD with
momentum, the backbone frozen): float32 throughout, and with --quantize-frozen int8 calibrated on Fashion-MNIST. Each
firmware trains --steps steps on the same Fashion-MNIST batches on the Cortex-M4F under QEMU (mps2-an386), with
run --check's first half on the last batch (the int8 prefix bit for bit against the Python integer reference).
Its trained head is then measured on the first --eval images of the test split: the float32 model as torch runs
it, the int8 one with its head fed the integer reference's boundary (what the firmware's head reads). Needs
`make data` (Fashion-MNIST) and `make toolchain`.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.output import write_json  # noqa: E402
from edgetrain.codegen.c.runner import run_program, verified_firmware  # noqa: E402
from edgetrain.compiler.frontend.modelspec import resolve  # noqa: E402
from edgetrain.compiler.graph.ir import OptimizerConfig  # noqa: E402
from edgetrain.compiler.pipeline import CompileOptions, compile_model  # noqa: E402
from edgetrain.compiler.workbench.calibration import calibration_of  # noqa: E402
from edgetrain.compiler.workbench.data import fashion_mnist, fashion_mnist_batches  # noqa: E402
from edgetrain.compiler.workbench.int8_check import Int8Reference, boundary_mismatches  # noqa: E402
from edgetrain.compiler.workbench.reference import load_weights  # noqa: E402
from edgetrain.compiler.workbench.run import schedule_batches  # noqa: E402


def _accuracy(out: str, body: dict, params: dict, x: torch.Tensor, y: torch.Tensor, int8: Int8Reference | None):
    spec = body["model"]
    model = resolve(spec["spec"], **spec["kwargs"]).module
    load_weights(model, os.path.join(out, "weights.safetensors"))
    state = model.state_dict()
    with torch.no_grad():
        for k, v in params.items():  # the trained head and running statistics the firmware wrote back
            state[k].copy_(v.reshape(state[k].shape))
    model.eval()
    before = int8.feed(model) if int8 is not None else (lambda x: None)
    right = 0
    with torch.no_grad():
        for k in range(0, len(x), 100):
            before(x[k:k + 100])
            right += int((model(x[k:k + 100]).argmax(1) == y[k:k + 100]).sum())
    return right / len(x)


FACTORY = """from safetensors.torch import load_file

from edgetrain.compiler.frontend.modelspec import resolve


def make():
    m = resolve({model!r}).module  # its frozen backbone and trained head as its factory sets them
    m.load_state_dict(load_file({weights!r}))
    return m
"""


def pretrain(model: str, shape: tuple, steps: int, work: str) -> str:
    """The model trained whole on Fashion-MNIST, its trainable head then reset: a `file.py:make` model spec."""
    from safetensors.torch import save_file

    from edgetrain.compiler.frontend.modelspec import resolve as resolve_spec

    torch.manual_seed(0)
    r = resolve_spec(model)
    m = r.module.train()
    head = [n for n, p in m.named_parameters() if p.requires_grad]
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    for p in m.parameters():
        p.requires_grad_(True)
    for k, (x, y) in enumerate(fashion_mnist_batches(shape, 64, steps, seed=0)):
        opt.zero_grad()
        loss = loss_fn(m(x), y)
        loss.backward()
        opt.step()
    fresh = resolve_spec(model).module  # the head as a fresh model initialises it
    with torch.no_grad():
        state = m.state_dict()
        for name, v in fresh.state_dict().items():
            if name.rsplit(".", 1)[0] in {h.rsplit(".", 1)[0] for h in head}:
                state[name].copy_(v)  # the head's weights and its batch norm's running statistics
    path = os.path.join(work, "pretrained.safetensors")
    save_file({k: v.contiguous() for k, v in state.items()}, path)
    spec = os.path.join(work, "pretrained_model.py")
    with open(spec, "w") as f:
        f.write(FACTORY.format(model=model, weights=path))
    print(f"pretrained {model} for {steps} steps (last loss {float(loss.detach()):.3f}); head {head} reset", flush=True)
    return f"{spec}:make"


def run(model: str, steps: int, n_eval: int, lr: float, momentum: float, pretrain_steps: int,
        work: str | None) -> list[dict]:
    rows = []
    work = work or tempfile.mkdtemp(prefix="int8_finetune_")
    os.makedirs(work, exist_ok=True)
    shape = resolve(model).input_shape or (1, 28, 28)  # a model file's: Fashion-MNIST as it is
    if not pretrain_steps:
        spec = model
    elif os.path.exists(os.path.join(work, "pretrained_model.py")):  # an earlier run's, in --work
        spec = os.path.join(work, "pretrained_model.py") + ":make"
    else:
        spec = pretrain(model, tuple(shape), pretrain_steps, work)
    for variant in ("float32", "int8"):
        out = os.path.join(work, variant)
        q = {"quantize_frozen": "int8", "calibrate": "fashion-mnist",
             "calibration": calibration_of("fashion-mnist")} if variant == "int8" else {}
        summary = compile_model(CompileOptions(model=spec, target="nrf52840", budget="auto", out=out, batch_size=1,
                                               emit="c", time_limit=30.0, seed=0, input_shape=tuple(shape),
                                               optimizer=OptimizerConfig.of("sgd", lr=lr, momentum=momentum), **q))
        body, manifest = verified_firmware(out)
        batches = schedule_batches(body, "fashion-mnist", steps, 1)
        ran = run_program(out, body, manifest, batches, qemu=True, timeout_s=3000.0)
        r = ran.result
        assert ran.exit_code == 0 and r["status"] == 0, ran.output[-2000:]
        int8 = Int8Reference(body, os.path.join(out, "weights.safetensors")) if variant == "int8" else None
        bits = boundary_mismatches(r["int8_boundary"], int8.flat(batches[-1][0])) if int8 is not None else None
        c, h, w = body["graph"]["input_shape"][1:]  # the model's own shape: Fashion-MNIST resized to it
        x, y = fashion_mnist("test", resize_to=(h, w), channels=c)
        acc = _accuracy(out, body, r["params"], x[:n_eval], y[:n_eval], int8)
        losses = r["losses"]
        instr = [t * manifest["instructions_per_tick"] for t in r["ticks"]]
        rows.append({"model": model.replace(ROOT + os.sep, ""), "pretrain_steps": pretrain_steps, "variant": variant, "steps": steps, "lr": lr,
                     "momentum": momentum,
                     "test_accuracy": acc, "eval_examples": n_eval,
                     "first_50_mean_loss": float(np.mean(losses[:50])), "last_50_mean_loss": float(np.mean(losses[-50:])),
                     "arena_bytes": manifest["arena_bytes"], "min_feasible_bytes": summary["min_feasible_bytes"],
                     "frozen_bytes": summary["frozen_bytes"], "flash_bytes": ran.sizes.get("flash_bytes"),
                     "ram_bytes": ran.sizes.get("ram_bytes"), "instructions_per_step": float(np.mean(instr)),
                     "int8_boundary_mismatches": bits, "tiled": summary.get("tiled")})
        print(f"{variant}: test accuracy {acc:.3f} on {n_eval}, loss {rows[-1]['first_50_mean_loss']:.3f} -> "
              f"{rows[-1]['last_50_mean_loss']:.3f}, arena {manifest['arena_bytes']} B, RAM {rows[-1]['ram_bytes']} B, "
              f"flash {rows[-1]['flash_bytes']} B, {rows[-1]['instructions_per_step']:.3g} instructions a step"
              + (f", boundary bits off: {bits}" if bits is not None else ""), flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=os.path.join(ROOT, "benchmarks", "fmnist_cnn.py") + ":fmnist_cnn",
                   help="a zoo name or file.py:factory whose frozen backbone ends in a convolution")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--eval", type=int, default=1000)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--pretrain-steps", type=int, default=400, help="0: the zoo's random initialisation")
    p.add_argument("--work", help="a folder for the firmware and the pretrained model (reused when it holds one)")
    p.add_argument("--json", default=os.path.join(ROOT, "build", "bench", "int8_finetune.json"))
    a = p.parse_args()
    rows = run(a.model, a.steps, a.eval, a.lr, a.momentum, a.pretrain_steps, a.work)
    write_json(a.json, rows)


if __name__ == "__main__":
    main()
