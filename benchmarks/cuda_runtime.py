"""CUDA runtime benchmark: a Jetson target's plans trained by the Python runtime on a CUDA GPU, against autograd.

    .venv/bin/python benchmarks/cuda_runtime.py compile DIR [--models resnet18,mobilenetv2,gpt_tiny]
                                                [--budgets 100%,50%] [--target jetson-agx-orin] [--batch-size 8]
    python3 benchmarks/cuda_runtime.py run DIR [--steps 3] [--timed 20] [--json build/bench/cuda_runtime.json]

`compile` (any machine, no GPU) compiles each (target, model, budget) into DIR/<model>-<budget>-<target>, the model's
weights kept once in DIR/weights (every plan of a model starts from the same seeded weights) so the folder travels
small. `run` (on the GPU, with the runtime and the model zoo only: no solver is imported) puts the weights back
and, per plan, in a process of its own, with cuDNN's algorithm choice and torch's kernels made deterministic:
- `edgetrain run --check` as a user runs it (`run_plan`, which trains both sides with cuDNN off: eager batch norm
  would take cuDNN's kernel, the plan torch's native one): --steps steps on the GPU, every parameter and buffer
  against the model trained by autograd with the matching torch.optim optimizer on the same GPU (max abs error),
  the ledger's peak against the prediction and the budget, and the CUDA caching allocator's peak
  (`torch.cuda.max_memory_allocated`, weights, optimizer state and data included, as the ledger counts them);
- per step, the allocator's peak against the ledger's (the first step pays cuDNN's and cuBLAS's one-time
  allocations); per op, over a later step: the allocator's peak growth inside the op beyond the ledger's (a
  kernel's workspace the memory model does not count), summed per aten op, largest first, and the op where the
  allocator stood furthest above the ledger;
- each plan twice, in a process of its own each time: under the runtime's allocator setting (expandable segments,
  `runtime/python/cuda_memory.py`) and under torch's as it comes (`--allocators`);
- the runtime's step against the plain PyTorch step on the GPU (same weights, data and SGD), medians of --timed
  steps after warm-up, each synchronized.
Prints a table and writes the rows as JSON.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks.output import write_json  # noqa: E402

WEIGHTS = "weights.safetensors"


def compile_plans(args) -> None:
    from edgetrain.compiler.pipeline import CompileOptions, compile_model

    os.makedirs(os.path.join(args.dir, "weights"), exist_ok=True)
    for target, model, budget in itertools.product(args.target.split(","), args.models.split(","),
                                                   args.budgets.split(",")):
        out = os.path.join(args.dir, f"{model}-{budget.replace('%', 'pct')}-{target}")
        compile_model(CompileOptions(model=model, target=target, budget=budget, out=out,
                                     batch_size=args.batch_size, time_limit=args.time_limit))
        kept = os.path.join(args.dir, "weights", f"{model}.safetensors")
        if os.path.exists(kept):
            with open(kept, "rb") as a, open(os.path.join(out, WEIGHTS), "rb") as b:
                if a.read() != b.read():
                    raise SystemExit(f"{out}: weights differ from the model's other plans")
            os.remove(os.path.join(out, WEIGHTS))
        else:
            os.replace(os.path.join(out, WEIGHTS), kept)
        print(f"compiled {out}", flush=True)


def _deterministic() -> None:
    # cuBLAS's workspace is the runtime's (runtime/python/cuda_memory.py: ":16:8", one that determinism accepts)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)  # an op without such a kernel warns, runs its own


def _op_workspace(plan_dir: str, body: dict, batches) -> tuple[list[dict], dict]:
    """Per aten op, over the last of `batches`' steps: the allocator's peak growth inside each op beyond the
    ledger's growth in it (both from the bytes held as the op starts), summed over the op's calls; and where the
    step's allocator peak stood furthest above the ledger's (the bytes allocated beyond the ledger's as that op
    started, which no op's own growth shows, and the op's own excess)."""
    from edgetrain.runtime.python import load_plan, runtime_for
    from edgetrain.runtime.python.executor import Runtime

    plan = load_plan(plan_dir)
    rt = runtime_for(plan, os.path.join(plan_dir, "pages-workspace"), device="cuda")
    real_run = Runtime._run_aten
    per_op: dict[str, list] = defaultdict(lambda: [0, 0, 0])  # op -> [calls, summed excess, largest excess]
    worst = {"above_ledger_bytes": 0}
    on = [False]

    def run_aten(self, first, name, node):
        if not on[0]:
            return real_run(self, first, name, node)
        torch.cuda.synchronize()
        a0, l0 = torch.cuda.memory_allocated(), self.ledger.live_bytes
        torch.cuda.reset_peak_memory_stats()
        self.ledger.reset_peak()
        held = real_run(self, first, name, node)
        torch.cuda.synchronize()
        excess = max(0, (torch.cuda.max_memory_allocated() - a0) - (self.ledger.peak_bytes - l0))
        above = torch.cuda.max_memory_allocated() - self.ledger.peak_bytes
        if above > worst["above_ledger_bytes"]:
            worst.update(above_ledger_bytes=above, node=name, op=node.op, at_start_bytes=a0 - l0, own_bytes=excess)
        row = per_op[node.op]
        row[0] += 1
        row[1] += excess
        row[2] = max(row[2], excess)
        return held

    Runtime._run_aten = run_aten
    # per step, not measured op by op: (allocator peak, ledger peak, peak of the bytes asked for), bytes; the
    # allocator counts whole blocks (without expandable segments a large block is not split for a remainder of
    # 1 MiB or less), so its figure above the bytes asked for is its rounding and fragmentation
    worst["steps"] = []
    try:
        for k, (x, y) in enumerate(batches):
            on[0] = k == len(batches) - 1
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            rt.ledger.reset_peak()
            rt.begin_step(x, y)
            plan.train_step(rt)
            torch.cuda.synchronize()
            if not on[0]:
                requested = torch.cuda.memory_stats().get("requested_bytes.all.peak")
                worst["steps"].append([torch.cuda.max_memory_allocated(), rt.ledger.peak_bytes, requested])
    finally:
        Runtime._run_aten = real_run
    rows = sorted(({"op": op, "calls": c, "excess_bytes": s, "largest_bytes": m} for op, (c, s, m) in per_op.items()
                   if s), key=lambda r: -r["largest_bytes"])
    return rows, worst


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _timed(plan_dir: str, body: dict, batches, timed: int, device: str) -> tuple[float, float]:
    """(runtime step s, PyTorch step s), medians of alternating synchronized steps after two of each; the PyTorch
    step is benchmarks/runtime.py's (the model as written, the plan's weights and SGD)."""
    from benchmarks.runtime import _torch_step, pytorch_side
    from edgetrain.runtime.python import load_plan, runtime_for

    plan = load_plan(plan_dir)
    rt = runtime_for(plan, os.path.join(plan_dir, "pages-timed"), device=device)
    model, opt = pytorch_side(body, plan_dir)
    model.to(device)  # its parameters move in place: the optimizer keeps them
    if rt.threads is not None:  # a CPU plan's steps run at its thread count: PyTorch's at the same
        torch.set_num_threads(rt.threads)
    ours, theirs = [], []
    for k in range(timed + 2):
        x, y = batches[k % len(batches)]
        x, y = x.to(device), y.to(device)
        _sync(device)
        t0 = time.perf_counter()
        rt.begin_step(x, y)
        plan.train_step(rt)
        _sync(device)
        t1 = time.perf_counter()
        _torch_step(model, opt, x, y)
        _sync(device)
        if k >= 2:
            ours.append(t1 - t0)
            theirs.append(time.perf_counter() - t1)
    return statistics.median(ours), statistics.median(theirs)


def run_plans(args) -> list[dict]:
    from edgetrain.compiler.schedule_file import format as schedule_format
    from edgetrain.compiler.workbench.run import run_plan, schedule_batches
    from edgetrain.runtime.python import cuda_memory

    if args.device == "cuda":
        _deterministic()
    rows = []
    for name in _plan_names(args.dir) if args.only is None else [args.only]:
        plan_dir = os.path.join(args.dir, name)
        body = schedule_format.load(plan_dir)
        model = body["model"]["spec"]
        if not os.path.exists(os.path.join(plan_dir, WEIGHTS)):
            shutil.copyfile(os.path.join(args.dir, "weights", f"{model}.safetensors"),
                            os.path.join(plan_dir, WEIGHTS))
        row = {"plan": name, "model": model, "budget": body["budget"]["spec"],
               "target": body["target"]["name"],
               "device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
               "torch": torch.__version__, "budget_bytes": body["budget"]["bytes"]}
        for action, key in (("recompute", "recomputes"), ("page_in", "page_ins"), ("page_out", "page_outs")):
            row[key] = sum(st["action"] == action for st in body["steps"])
        try:
            checked = run_plan(plan_dir, steps=args.steps, check=True, device=args.device)
            row.update({k: checked[k] for k in ("ok", "max_abs_err", "predicted_peak_bytes", "measured_peak_bytes",
                                               "cuda_max_memory_allocated", "paged_bytes")})
            row["error"] = checked.get("error")
            row["mismatched"] = checked.get("mismatched", [])
            batches = schedule_batches(body, "random", 3, seed=1)
            if args.device == "cuda":
                row["op_workspace"], row["above_ledger"] = _op_workspace(plan_dir, body, batches)
            row["runtime_s"], row["pytorch_s"] = _timed(plan_dir, body, batches, args.timed, args.device)
            row["ratio"] = row["runtime_s"] / row["pytorch_s"]
        except Exception as e:  # noqa: BLE001 - one plan's failure is a row, the others still run
            row["ok"], row["error"] = False, f"{type(e).__name__}: {e}"
        row["allocator_settings"] = cuda_memory.allocator_settings()
        rows.append(row)
        print(_line(row), flush=True)
    return rows


def _plan_names(folder: str) -> list[str]:
    return [n for n in sorted(os.listdir(folder)) if os.path.exists(os.path.join(folder, n, "plan.py"))]


# The caching allocator each plan runs under: the runtime's (expandable segments: blocks split to 512-byte
# granules), and torch's as it comes (a cached block handed out whole when 1 MiB or less of it would be left).
ALLOCATORS = {"runtime": None, "torch": "expandable_segments:False"}


def run_each(args) -> list[dict]:
    """Each plan in a process of its own (`run --only NAME`), once per allocator setting: the allocator's peak is
    that plan's alone, with no tensors of an earlier plan, nor its cuBLAS workspace, still held."""
    rows = []
    allocators = args.allocators.split(",") if args.allocators else (list(ALLOCATORS) if args.device == "cuda"
                                                                       else ["runtime"])
    unknown = [a for a in allocators if a not in ALLOCATORS]
    if unknown:
        raise SystemExit(f"--allocators: unknown {', '.join(unknown)} (choose from {', '.join(ALLOCATORS)})")
    with tempfile.TemporaryDirectory(prefix="edgetrain-cuda-") as tmp:
        for name in _plan_names(args.dir):
            for allocator in allocators:
                out = os.path.join(tmp, f"{name}-{allocator}.json")
                env = {k: v for k, v in os.environ.items() if not k.endswith("ALLOC_CONF")}
                if ALLOCATORS[allocator] is not None:
                    env["PYTORCH_ALLOC_CONF"] = ALLOCATORS[allocator]
                subprocess.run([sys.executable, os.path.abspath(__file__), "run", args.dir, "--only", name, "--steps",
                                str(args.steps), "--timed", str(args.timed), "--device", args.device, "--json", out],
                               check=False, env=env)
                if os.path.exists(out):
                    with open(out) as f:
                        got = json.load(f)
                else:
                    got = [{"plan": name, "ok": False, "error": "its process wrote no row (see its output)"}]
                rows += [{**row, "allocator": allocator} for row in got]
    return rows


def _mb(b) -> str:
    return "-" if b is None else f"{b / 1e6:.2f}"


def _line(r: dict) -> str:
    head = (f"{r['plan']:<18} allocator settings '{r.get('allocator_settings', '')}'  "
            f"rec/pin/pout {r['recomputes']}/{r['page_ins']}/{r['page_outs']}  ok={r.get('ok')}  "
            f"max abs err {r.get('max_abs_err')}  budget {_mb(r['budget_bytes'])} MB  predicted "
            f"{_mb(r.get('predicted_peak_bytes'))}  ledger {_mb(r.get('measured_peak_bytes'))}  CUDA peak "
            f"{_mb(r.get('cuda_max_memory_allocated'))}")
    if "ratio" in r:
        head += f"  step {r['runtime_s'] * 1e3:.2f} ms vs PyTorch {r['pytorch_s'] * 1e3:.2f} ms ({r['ratio']:.2f}x)"
    w = r.get("above_ledger")
    for k, (real, ledger, requested) in enumerate((w or {}).get("steps", [])):
        head += (f"\n    step {k}: allocator peak {_mb(real)} MB (bytes asked for: {_mb(requested)} MB at most), "
                 f"ledger peak {_mb(ledger)} MB")
    if w and w.get("node"):
        head += (f"\n    allocator peak above the ledger's by {_mb(w['above_ledger_bytes'])} MB at most, in "
                 f"'{w['node']}' ({w['op']}): {_mb(w['at_start_bytes'])} MB beyond it as the op started, "
                 f"{_mb(w['own_bytes'])} MB of its own")
    for w in r.get("op_workspace", [])[:6]:
        head += (f"\n    {w['op']}: {w['calls']} calls, beyond the ledger {_mb(w['excess_bytes'])} MB in all, "
                 f"largest {_mb(w['largest_bytes'])} MB")
    if r.get("error"):
        head += f"\n    error: {r['error']}"
    return head


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile")
    c.add_argument("dir")
    c.add_argument("--models", default="resnet18,mobilenetv2,gpt_tiny")
    c.add_argument("--budgets", default="100%,50%")
    c.add_argument("--target", default="jetson-agx-orin",
                   help="comma-separated; a Jetson's plans recompute rather than page: add rpi4 for plans that page")
    c.add_argument("--batch-size", type=int, default=8)
    c.add_argument("--time-limit", type=float, default=20.0)
    r = sub.add_parser("run")
    r.add_argument("dir")
    r.add_argument("--steps", type=int, default=3, help="steps of each plan checked against autograd")
    r.add_argument("--timed", type=int, default=20, help="timed steps of each side")
    r.add_argument("--json", default="build/bench/cuda_runtime.json")
    r.add_argument("--device", default="cuda", help="cuda, or cpu (the same checks and timings, no allocator)")
    r.add_argument("--only", metavar="NAME", help="this plan of DIR, in this process (each plan runs so by default)")
    r.add_argument("--allocators", default=None,
                   help="comma-separated: runtime (its setting: expandable segments), torch (as torch comes); "
                        "default both on CUDA, runtime on the CPU")
    args = ap.parse_args(argv)
    if args.cmd == "compile":
        compile_plans(args)
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: `run` trains on a GPU (compile the plans anywhere, run them there)", file=sys.stderr)
        return 2
    rows = run_plans(args) if args.only is not None else run_each(args)
    write_json(args.json, rows)
    print(f"wrote {args.json}")
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
