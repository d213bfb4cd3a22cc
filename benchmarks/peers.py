"""Peers benchmark: edgetrain's plans against what torch offers for training memory, real peak and step time.

    .venv/bin/python benchmarks/peers.py [--models resnet18,mobilenetv2,gpt_small,llama] [--methods all]
                                         [--steps 10] [--warmup 2] [--target host] [--batch-size 8]
                                         [--threads 1] [--time-limit 30] [--optimizer sgd]
                                         [--json build/bench/peers.json]
    .venv/bin/python benchmarks/peers.py --table docs/data/peers.json   # the table and figures from JSON

Methods (benchmarks/peers_methods.py), each `method` or `method:setting` in --methods: eager;
eager-optim-hook (torch's optimizer-in-backward recipe); checkpoint (torch.utils.checkpoint per block);
compile:1.0,0.5,0.3,0.1 (torch.compile, inductor, at that activation_memory_budget); edgetrain:100%,50%,40%,25%,min
(a plan compiled at that budget, B% of plain backprop's predicted peak, run by the runtime's Trainer);
edgetrain-fused at the same budgets (compile --fuse: pointwise chains as inductor kernels, convolution weights
channels-last). `llama` is a Hugging Face LlamaForCausalLM of 4.7 M parameters (benchmarks/peers_models.py);
`llama_1b_slice` two decoder layers of Llama-3.2-1B's shape with a bf16 base and LoRA adapters
(tests/llm_models.py; `make bench-llm-slice`); other names are zoo models or path/file.py:fn. Every method trains
with --optimizer (its defaults); a token model's rows give tokens/s (batch x sequence over the median step).

Real peak: each configuration in a fresh process (`--child`) whose malloc returns every block of a page or more
at once (benchmarks/memory_probe.py), --mem-steps steps on random batches, each step's resident-set high-water
growth added to the tensors held before it (parameters, buffers, optimizer state; a plan's ledger): the most of
the steps after the first (which also pays one-time allocations, torch.compile's compile among them). Step time:
every configuration of a model built in one process and their steps alternating (the order rotating each step),
so all see the same load; `time_ratio` is the median over the --steps timed steps of a configuration's step time
over eager's step of the same rotation. eager always runs: the ratios are to it. Prints a table, writes JSON
rows (model, method, setting, real_peak_bytes, time_ratio, ...) and draws a memory-vs-time figure per model.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.output import write_json  # noqa: E402
from benchmarks.peers_methods import METHODS, PLANS, Workload  # noqa: E402
from benchmarks.peers_models import LLAMA_SPEC  # noqa: E402

# Two decoder layers of Llama-3.2-1B's shape, LoRA r=16 on q and v, bf16 base or float32 (train with --optimizer adamw)
ALIASES = {"llama": LLAMA_SPEC, "llama_1b_slice": "tests/llm_models.py:llama_1b_slice",
           "llama_1b_slice_fp32": "benchmarks/peers_models.py:llama_1b_slice_fp32"}


class UsageError(Exception):
    pass


def parse_methods(text: str) -> list[tuple[str, str]]:
    """`all`, or a comma list of `method` (every default setting) and `method:setting`; eager always first."""
    configs = [("eager", "-")]
    for item in (text.split(",") if text != "all" else list(METHODS)):
        method, _, setting = item.strip().partition(":")
        if method not in METHODS:
            raise UsageError(f"unknown method {method!r} in --methods; choose from {', '.join(METHODS)} "
                             "(optionally method:setting, e.g. compile:0.1 or edgetrain:50%)")
        settings = [setting] if setting else list(METHODS[method])
        for s in settings:
            if method == "compile":
                try:
                    ok = 0.0 <= float(s) <= 1.0
                except ValueError:
                    ok = False
                if not ok:
                    raise UsageError(f"compile:{s}: the activation memory budget is a fraction in [0, 1]")
            if (method, s) not in configs:
                configs.append((method, s))
    return configs


def workload(model: str, a) -> Workload:
    from benchmarks.peers_methods import loss_for

    spec = ALIASES.get(model, model)
    return Workload(model=spec, loss=loss_for(spec), batch_size=a.batch_size, seed=a.seed, target=a.target,
                    threads=a.threads, time_limit=a.time_limit, optimizer=a.optimizer)


# -- one configuration's real peak, in this process ------------------------------------------------


def child(model: str, method: str, setting: str, a) -> dict:
    from benchmarks.memory_probe import Probe, count_pages, isolate_malloc, pin_to_one_cpu

    isolated = isolate_malloc()  # before torch allocates anything
    import torch

    from benchmarks.peers_methods import batches, make_step

    torch.set_num_threads(a.threads)
    w = workload(model, a)
    step = make_step(w, method, setting, a.work)
    probe = Probe("cpu")
    ledger = step.trainer.rt.ledger if method in PLANS else None
    if ledger is not None:  # the page each block isolate_malloc maps adds beyond its bytes, counted beside the plan's
        count_pages(ledger)
    pinned = pin_to_one_cpu()  # the high-water mark then lags by one CPU's counter batch, not every CPU's
    reals, walls, rounding = [], [], []
    for x, y in batches(w, a.mem_steps):
        state = step.state_bytes()
        if ledger is not None:
            ledger.reset_peak()
        t0 = time.perf_counter()
        with probe.span() as s:
            step.step(x, y)
        walls.append(time.perf_counter() - t0)
        reals.append(state + s.growth)
        if ledger is not None:
            rounding.append(ledger.mapped_peak - ledger.peak_bytes)
    row = {"real_peak_bytes": max(reals[1:]), "real_first_step_bytes": reals[0], "real_steps_bytes": reals,
           "state_bytes": step.state_bytes(), "malloc_isolated": isolated, "cpu_pinned": pinned, "mem_steps_s": walls,
           "tokens_per_step": x.numel() if x.dtype == torch.int64 else 0}
    if ledger is not None:
        row["ledger_peak_bytes"] = step.ledger_peak()
        row["page_rounding_bytes"] = max(rounding[1:])
    step.close()
    return row


def run_child(model: str, method: str, setting: str, a) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", model, method, setting, "--work", a.work,
           "--mem-steps", str(a.mem_steps), "--target", a.target, "--batch-size", str(a.batch_size),
           "--threads", str(a.threads), "--seed", str(a.seed), "--optimizer", a.optimizer]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        lines = (r.stderr or r.stdout).strip().splitlines()
        return {"error": lines[-1] if lines else f"exit {r.returncode}"}
    return json.loads(r.stdout.strip().splitlines()[-1])


# -- step times: every configuration alternating in one process -----------------------------------


def time_configs(w: Workload, configs: list[tuple[str, str]], a) -> tuple[dict, int]:
    """({config: [seconds of each timed step]}, tokens a step: 0 but for token ids), the configurations' steps
    alternating, the order rotating."""
    import torch

    from benchmarks.peers_methods import batches, make_step

    torch.set_num_threads(a.threads)
    steps = {c: make_step(w, *c, a.work) for c in configs}
    times = {c: [] for c in configs}
    tokens = 0
    for k, (x, y) in enumerate(batches(w, a.warmup + a.steps)):
        tokens = x.numel() if x.dtype == torch.int64 else 0
        turn = k % len(configs)
        for c in configs[turn:] + configs[:turn]:
            t0 = time.perf_counter()
            steps[c].step(x, y)
            if k >= a.warmup:
                times[c].append(time.perf_counter() - t0)
    for s in steps.values():
        s.close()
    return times, tokens


def bench_model(model: str, configs: list[tuple[str, str]], a) -> list[dict]:
    from edgetrain.compiler.errors import EdgetrainError

    from benchmarks.peers_methods import compile_plan, plan_dir

    w = workload(model, a)
    rows, runnable = [], []
    for method, setting in configs:
        row = {"model": model, "method": method, "setting": setting, "target": a.target if method in PLANS
               else None, "batch_size": a.batch_size, "threads": a.threads, "real_peak_bytes": None,
               "time_ratio": None}
        rows.append(row)
        if method in PLANS:
            try:
                c = compile_plan(w, setting, plan_dir(a.work, w.model, setting, method), method)
            except EdgetrainError as e:  # a budget below the smallest feasible one is refused: a row says so
                row["error"], row["refused"] = str(e).splitlines()[0], True
                continue
            row.update(budget_bytes=c["budget_bytes"], predicted_peak_bytes=c["peak_bytes"],
                       recomputes=c["recomputes"], page_ins=c["page_ins"], page_outs=c["page_outs"])
        row.update(run_child(model, method, setting, a))
        if "error" not in row:
            runnable.append((method, setting))
        print(f"{model} {method} {setting}: {_mb(row.get('real_peak_bytes'))} MB real {row.get('error', '')}",
              file=sys.stderr)
    if ("eager", "-") not in runnable:
        return rows
    if not a.steps:  # no paired timing: each configuration's steps after the first in its memory process
        return _sequential_times(rows)
    times, tokens = time_configs(w, runnable, a)
    eager = times[("eager", "-")]
    for row in rows:
        t = times.get((row["method"], row["setting"]))
        if t:
            row["step_s"] = statistics.median(t)
            row["eager_step_s"] = statistics.median(eager)
            row["time_ratio"] = statistics.median(m / e for m, e in zip(t, eager))
            row["steps_s"] = t
            if tokens:
                row["tokens_per_s"] = tokens / row["step_s"]
        if row.get("budget_bytes") is not None and row["real_peak_bytes"] is not None:
            row["within_budget"] = row["real_peak_bytes"] <= row["budget_bytes"]
    return rows


def _sequential_times(rows: list[dict]) -> list[dict]:
    """Step times from the memory processes (run one after another, not alternating): the median of each
    configuration's steps after the first, its ratio to eager's."""
    eager = next(r for r in rows if r["method"] == "eager")
    e = statistics.median(eager["mem_steps_s"][1:])
    for row in rows:
        if "error" in row:
            continue
        row["step_s"], row["eager_step_s"] = statistics.median(row["mem_steps_s"][1:]), e
        row["time_ratio"], row["timing"] = row["step_s"] / e, "sequential"
        if row.get("tokens_per_step"):
            row["tokens_per_s"] = row["tokens_per_step"] / row["step_s"]
        if row.get("budget_bytes") is not None:
            row["within_budget"] = row["real_peak_bytes"] <= row["budget_bytes"]
    return rows


# -- the table and the figures, from rows -----------------------------------------------------------


def _mb(b) -> str:
    return f"{b / 1e6:.1f}" if isinstance(b, (int, float)) else "-"


def print_table(rows: list[dict], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    tokens = any(r.get("tokens_per_s") for r in rows)
    for col in ("model", "method", "setting", "real peak MB", "vs eager", "time ratio", "step ms",
                *(("tokens/s",) if tokens else ()), "budget MB", "predicted MB", "ledger MB", "note"):
        t.add_column(col, justify="right")
    eager = {r["model"]: r["real_peak_bytes"] for r in rows if r["method"] == "eager"}
    for r in rows:
        real, base = r.get("real_peak_bytes"), eager.get(r["model"])
        t.add_row(r["model"], r["method"], r["setting"], _mb(real),
                  f"{real / base:.2f}" if real and base else "-",
                  f"{r['time_ratio']:.2f}x" if r.get("time_ratio") else "-",
                  f"{r['step_s'] * 1e3:.0f}" if r.get("step_s") else "-",
                  *((f"{r['tokens_per_s']:.1f}" if r.get("tokens_per_s") else "-",) if tokens else ()),
                  _mb(r.get("budget_bytes")), _mb(r.get("predicted_peak_bytes")), _mb(r.get("ledger_peak_bytes")),
                  r.get("error", "") or _over_note(r))
    Console(width=170).print(t)


def _over_note(r: dict) -> str:
    """A plan's real peak over its budget, and by how much against the page rounding the measuring malloc adds."""
    if r.get("within_budget") is not False:
        return ""
    over = r["real_peak_bytes"] - r["budget_bytes"]
    rounding = r.get("page_rounding_bytes")
    return f"over budget by {over / 1e3:.0f} KB" + (f" (page rounding {rounding / 1e3:.0f} KB)" if rounding else "")


def table_title(rows: list[dict]) -> str:
    load = next((r["loadavg_1min_before_after"] for r in rows if "loadavg_1min_before_after" in r), None)
    r0 = rows[0] if rows else {}
    where = f"load {load[0]:.2f} -> {load[1]:.2f}" if load else "load not recorded"
    paired = ("median step over eager's, each in its own process one after another"
              if any(r.get("timing") == "sequential" for r in rows) else "paired median over eager")
    return (f"real peak and step time against eager (batch {r0.get('batch_size')}, torch threads "
            f"{r0.get('threads')}; MB = 1e6 B; time ratio: {paired}; {where})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet18,mobilenetv2,gpt_small,llama")
    ap.add_argument("--methods", default="all", help="all, or a comma list of method or method:setting")
    ap.add_argument("--steps", type=int, default=10, help="timed steps of each configuration, after the warm-up (0: "
                    "no paired timing; the memory processes' steps after the first, one process after another)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps of each first (torch.compile compiles)")
    ap.add_argument("--mem-steps", type=int, default=3, help="steps of each memory child (the first not counted)")
    ap.add_argument("--target", default="host", help="the target edgetrain plans are compiled for")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads, every method alike")
    ap.add_argument("--time-limit", type=float, default=30.0, help="solver time limit per compile (s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--optimizer", default="sgd", help="every method's optimizer, with its defaults (sgd: with "
                    "momentum, compile's default; adam; adamw; adagrad)")
    ap.add_argument("--json", default="build/bench/peers.json", metavar="PATH", help="rows written here")
    ap.add_argument("--figures", default=None, metavar="DIR", help="also draw peers_<model>.png/.svg here")
    ap.add_argument("--table", default=None, metavar="JSON", help="print the table of a JSON written before; no run")
    ap.add_argument("--child", nargs=3, metavar=("MODEL", "METHOD", "SETTING"), help=argparse.SUPPRESS)
    ap.add_argument("--work", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.table:
        with open(a.table) as f:
            rows = json.load(f)
        print_table(rows, table_title(rows))
        if a.figures:
            _figures(rows, a.figures)
        return 0
    if a.child:
        print(json.dumps(child(*a.child, a)))
        return 0
    if a.steps < 0 or a.mem_steps < 2 or a.warmup < 1:
        ap.error("--steps must be >= 0, --mem-steps >= 2 (the first step is not counted), --warmup >= 1")
    from edgetrain.compiler.errors import EdgetrainError

    try:
        configs = parse_methods(a.methods)
        from edgetrain.compiler.graph.ir import OPTIMIZERS

        if a.optimizer not in OPTIMIZERS:
            raise UsageError(f"unknown --optimizer {a.optimizer!r}; choose from {', '.join(OPTIMIZERS)}")
        models = [m.strip() for m in a.models.split(",") if m.strip()]
        for m in models:  # an unknown model fails here, before any run
            workload(m, a)
    except (UsageError, EdgetrainError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    load = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgetrain-peers-") as work:
        a.work = work
        for model in models:
            rows += bench_model(model, configs, a)
    load_after = os.getloadavg()
    write_json(a.json, rows, load[0], load_after[0])
    print_table(rows, table_title(rows))
    if a.figures:
        _figures(rows, a.figures)
    print(f"wrote {a.json}")
    return 0 if all("error" not in r or r.get("refused") for r in rows) else 1


def _figures(rows: list[dict], out: str) -> None:
    from benchmarks.peers_figure import plot_peers

    for path in plot_peers(rows, out):
        print(os.path.relpath(path, ROOT) if path.startswith(ROOT) else path)


if __name__ == "__main__":
    sys.exit(main())
