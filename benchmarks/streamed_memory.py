"""Real memory of a Python plan that streams frozen weights from storage: a bf16 Llama with LoRA whose frozen base
does not fit the budget, compiled for a Jetson profile, three steps run, each step's real memory measured.

    .venv/bin/python benchmarks/streamed_memory.py [--budget 30MB] [--hidden 512] [--layers 4] [--json]

As benchmarks/memory.py measures it (memory_probe.py): glibc malloc isolated first, then each step's real memory
is the ledger's bytes before it (what stays resident: trainable parameters, optimizer state, buffers, the
frozen weights not streamed) plus the process's resident-set high-water growth over the step. The streamed
weights are read with pread into memory freed after each reader (runtime/python/streamed_weights.py), so the
page cache that holds the file is the kernel's, not the process's: it is not in the figure, as it is not in
the budget (on a Jetson it is reclaimable memory). Linux only.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 3


def _probe_module():
    path = os.path.join(ROOT, "benchmarks", "memory_probe.py")
    spec = importlib.util.spec_from_file_location("edgetrain_memory_probe", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def measure(budget: str, target: str, model_kwargs: dict, work: str, time_limit: float = 10.0) -> dict:
    probe_mod = _probe_module()
    isolated = probe_mod.isolate_malloc()
    import torch

    from edgetrain.compiler.graph.ir import OptimizerConfig
    from edgetrain.compiler.pipeline import CompileOptions, compile_model
    from edgetrain.compiler.schedule_file import format as schedule_format
    from edgetrain.compiler.workbench.run import schedule_batches
    from edgetrain.runtime.python import load_plan, runtime_for

    out = os.path.join(work, "plan")
    c = compile_model(CompileOptions(model=os.path.join(ROOT, "tests", "llm_models.py") + ":llama", target=target,
                                     budget=budget, out=out, batch_size=1, time_limit=time_limit, loss="model",
                                     optimizer=OptimizerConfig(name="adamw", lr=1e-3), model_kwargs=model_kwargs))
    body = schedule_format.load(out)
    plan = load_plan(out)
    rt = runtime_for(plan, storage_dir=os.path.join(work, "pages"), device="cpu")
    torch.set_num_threads(rt.threads or 1)
    probe = probe_mod.Probe("cpu")
    reals, ledgers, reads = [], [], []
    for x, y in schedule_batches(body, "random", STEPS, seed=1):
        state = rt.ledger.live_bytes
        rt.ledger.reset_peak()
        before = rt.streamed.read_bytes
        with probe.span() as s:
            rt.begin_step(x, y)
            plan.train_step(rt)
        reals.append(state + s.growth)
        ledgers.append(rt.ledger.peak_bytes)
        reads.append(rt.streamed.read_bytes - before)
    streamed = sorted({p for n in body["graph"]["nodes"] for p in n.get("streamed", ())})
    size = {k: torch.empty(v["shape"], dtype=getattr(torch, v["dtype"]), device="meta").nbytes
            for k, v in body["graph"]["params"].items()}
    steady = max(reals[1:])
    frozen = sum(b for k, b in size.items() if k not in set(body["graph"]["trainable"]))
    return {"budget": budget, "target": target, "model_kwargs": model_kwargs, "malloc_isolated": isolated,
            "budget_bytes": c["budget_bytes"], "schedule_peak_bytes": c["peak_bytes"], "ledger_peak_bytes": max(ledgers),
            "frozen_bytes": frozen, "streamed_weights": len(streamed),
            "streamed_bytes": sum(size[p] for p in streamed),
            "read_bytes_per_step": reads[-1], "state_bytes": c["state_bytes"], "real_steps_bytes": reals,
            "real_bytes": steady, "ok": steady <= c["budget_bytes"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget", default="30MB")
    ap.add_argument("--target", default="jetson-orin-nano")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    kwargs = {"dtype": "bfloat16", "hidden": a.hidden, "mlp": 4 * a.hidden, "layers": a.layers, "heads": 8,
              "kv_heads": 4, "vocab": 8000, "seq": 128, "r": 8}
    with tempfile.TemporaryDirectory() as work:
        row = measure(a.budget, a.target, kwargs, work)
    if a.json:
        print(json.dumps(row))
    else:
        mb = lambda b: f"{b / 1e6:.2f} MB"  # noqa: E731
        print(f"budget {mb(row['budget_bytes'])}, frozen base {mb(row['frozen_bytes'])}, "
              f"{row['streamed_weights']} weights streamed ({mb(row['streamed_bytes'])}), "
              f"{mb(row['read_bytes_per_step'])} read a step; schedule peak {mb(row['schedule_peak_bytes'])}, "
              f"ledger {mb(row['ledger_peak_bytes'])}, real {mb(row['real_bytes'])} (steps: "
              f"{', '.join(mb(b) for b in row['real_steps_bytes'])}): {'within' if row['ok'] else 'OVER'} the budget")
    return 0 if row["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
