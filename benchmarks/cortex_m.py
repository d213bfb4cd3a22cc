"""Cortex-M benchmark: C training firmware per model and budget, built for the M4F and run under QEMU.

    .venv/bin/python benchmarks/cortex_m.py [--models mcu_cnn,mcu_resnet] [--budgets 100%,90%,80%,70%]
                                            [--target nrf52840] [--steps 3] [--json build/bench/cortex_m.json]
    .venv/bin/python benchmarks/cortex_m.py --finetune [--json build/bench/cortex_m_finetune.json]

Per row: the budget, store-all's peak and the smallest feasible budget; the static arena the offset planner
packed (vs the schedule's activation peak) and state (parameters + momentum); recomputes and page-ins per
step; bytes paged per step as the firmware counted them; instructions per training step under
`qemu-system-arm -M mps2-an386 -icount shift=0` (the board timer, 40 instructions a tick); flash
(text + data) and RAM (.data + .bss) from arm-none-eabi-size; FLOPs per step (every compute and recompute of
the schedule, the graph's FLOP counts) and instructions per FLOP; and the same firmware built for the host
(the generated Makefile's flags), seconds per step against a plain PyTorch step at batch 1 on one thread, run
side by side in alternating rounds, medians of both (--host-steps, 0 to skip). Prints a table and writes JSON.

`--finetune`: the fine-tuning models at the device's own budget (`auto`), each with its default trainable set
and the alternatives in FINETUNE, with RAM, flash, the frozen weights streamed from storage (not in flash),
paged bytes (streamed weights included) and instructions per step, the predicted time and energy per step on
the target, and beside each the same model with full backprop: its smallest feasible budget and how far that
is from the device's budget.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from benchmarks.output import write_json  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from edgetrain.compiler.frontend import zoo  # noqa: E402
from edgetrain.compiler.pipeline import CompileOptions, compile_model  # noqa: E402
from edgetrain.compiler.workbench.run_c import run_firmware  # noqa: E402


# (model, --train): the fine-tuning rows; None is the model's own trainable set.
FINETUNE = (("mcu_mobilenetv2", None), ("mcu_mobilenetv2", "biases"), ("mcu_mobilenetv3", None), ("mcu_wide_mlp", None))


def bench(model: str, budget: str, target: str, steps: int, work: str, host_steps: int = 0,
          train: str | None = None) -> dict:
    out = os.path.join(work, f"{model}-{budget.replace('%', 'pct')}-{train or 'own'}")
    row: dict = {"model": model, "budget": budget, "target": target, "train": train}
    try:
        c = compile_model(CompileOptions(model=model, target=target, budget=budget, out=out, batch_size=1,
                                         emit="c", time_limit=30.0, train=train))
    except Exception as e:  # noqa: BLE001 - a benchmark row records the failure
        return dict(row, error=str(e))
    row.update({k: c[k] for k in ("budget_bytes", "store_all_peak_bytes", "min_feasible_bytes", "peak_bytes",
                                  "state_bytes", "activation_peak_bytes", "arena_bytes", "recomputes", "page_ins",
                                  "page_outs", "schedule", "time_s", "energy_j", "trainable_params",
                                  "total_params")})
    row["schedule_activation_bytes"] = c["peak_bytes"] - c["state_bytes"]
    row["flops_per_step"] = step_flops(out)
    with open(os.path.join(out, "firmware.json")) as f:
        row["streamed_bytes"] = json.load(f).get("streamed_bytes", 0)  # frozen weights kept in storage, not flash
    r = run_firmware(out, qemu=True, steps=steps, data="random")
    row.update(ok=r["ok"], error=r.get("error"), paged_bytes_per_step=r.get("paged_bytes_per_step"),
               instructions_per_step=r.get("instructions_per_step"), flash_bytes=r.get("flash_bytes"),
               ram_bytes=r.get("ram_bytes"), text_bytes=r.get("text_bytes"), data_bytes=r.get("data_bytes"),
               bss_bytes=r.get("bss_bytes"), steps=steps)
    if row["instructions_per_step"] and row["flops_per_step"]:
        row["instructions_per_flop"] = row["instructions_per_step"] / row["flops_per_step"]
    if host_steps:
        row.update(host_vs_pytorch(out, model, host_steps))
    return row


def host_vs_pytorch(out: str, model: str, steps: int, rounds: int = 5) -> dict:
    """The same firmware built for the host (the generated Makefile's flags) against a plain PyTorch training
    step of the model at batch 1 on one thread, side by side: `rounds` rounds, each one run of the program
    (`steps` steps, process start included) then `steps` PyTorch steps; the medians of the rounds' seconds
    per step, and the load average before the first round (a shared machine skews both sides alike)."""
    r = run_firmware(out, qemu=False, steps=steps, data="random")
    if not r["ok"]:
        return {"host_error": r.get("error")}
    work = os.path.join(out, "run-host")
    program = os.path.abspath(os.path.join(out, "build", "host", "fw"))
    torch.set_num_threads(1)
    m = zoo.build(model).train()
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(1, *zoo.ZOO[model].input_shape), torch.tensor([1])

    def torch_steps(k: int) -> float:
        t0 = time.perf_counter()
        for _ in range(k):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(m(x), y).backward()
            opt.step()
        return (time.perf_counter() - t0) / max(k, 1)

    torch_steps(5)  # warm-up: the first steps allocate
    load = os.getloadavg()[0]
    c_runs, pt_runs = [], []
    for _ in range(rounds):
        os.makedirs(os.path.join(work, "pages"), exist_ok=True)  # run_firmware removes it; paging rows need it
        t0 = time.perf_counter()
        subprocess.run([program], cwd=work, check=True, capture_output=True)
        c_runs.append((time.perf_counter() - t0) / steps)
        shutil.rmtree(os.path.join(work, "pages"))  # pages live only within a step
        pt_runs.append(torch_steps(steps))
    c, p = statistics.median(c_runs), statistics.median(pt_runs)
    return {"host_c_step_s": c, "pytorch_step_s": p, "host_c_over_pytorch": c / p, "host_rounds": rounds,
            "host_load_avg": load}


def full_backprop(model: str, target: str, device_budget: int) -> dict:
    """The same model with every parameter trained: its smallest feasible budget and store-all peak for the C
    runtime, and how far the smallest is above the device's budget (negative: it would fit)."""
    from edgetrain.compiler.graph.liveness import analyze
    from edgetrain.compiler.pipeline import build_graph
    from edgetrain.compiler.scheduling.budget import anchors
    from edgetrain.targets import load_target

    tg = load_target(target)
    opts = CompileOptions(model=model, target=target, budget="100%", out="", batch_size=1, emit="c", train="all")
    _, _, g = build_graph(opts, tg, device_check=False)
    a = anchors(g, analyze(g), tg)
    return {"full_min_feasible_bytes": a.min_feasible_bytes, "full_store_all_peak_bytes": a.store_all.peak_bytes,
            "full_over_budget_bytes": a.min_feasible_bytes - device_budget}


def step_flops(out: str) -> int:
    """FLOPs of one training step: every compute and recompute the schedule makes, at the graph's counts."""
    with open(os.path.join(out, "schedule.json")) as f:
        body = json.load(f)
    flops = {n["name"]: n["flops"] for n in body["graph"]["nodes"]}
    return sum(flops[s["tensor"]] for s in body["steps"] if s["action"] in ("compute", "recompute"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mcu_cnn,mcu_resnet")
    ap.add_argument("--budgets", default="100%,90%,80%,70%")
    ap.add_argument("--target", default="nrf52840")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--host-steps", type=int, default=40,
                    help="steps of the host build timed against PyTorch at batch 1 (0: skip)")
    ap.add_argument("--finetune", action="store_true", help="the fine-tuning rows (FINETUNE) at the device's budget")
    ap.add_argument("--json", default=None, metavar="PATH",
                    help="rows written here (default build/bench/cortex_m.json, or cortex_m_finetune.json)")
    a = ap.parse_args(argv)
    a.json = a.json or f"build/bench/cortex_m{'_finetune' if a.finetune else ''}.json"
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgetrain-cortex-m-") as work:
        if a.finetune:
            for model, train in FINETUNE:
                row = bench(model, "auto", a.target, a.steps, work, 0, train)
                if "budget_bytes" in row:
                    row.update(full_backprop(model, a.target, row["budget_bytes"]))
                rows.append(row)
            return _finetune_table(rows, a)
        for model in a.models.split(","):
            for budget in a.budgets.split(","):
                rows.append(bench(model, budget, a.target, a.steps, work, a.host_steps))
    write_json(a.json, rows)
    t = Table(title=f"C training firmware on a Cortex-M4F (QEMU mps2-an386, {a.target} budgets), batch 1")
    cols = ("model", "budget", "budget B", "store-all B", "min B", "state B", "arena B", "sched. act. B",
            "rec/pin", "paged B/step", "instr/step", "instr/FLOP", "host C/PyTorch", "flash B", "RAM B", "ok")
    for col in cols:
        t.add_column(col, justify="right")
    for r in rows:
        if "arena_bytes" not in r:
            t.add_row(r["model"], r["budget"], *["-"] * (len(cols) - 3), "error")
            continue
        t.add_row(r["model"], r["budget"], str(r["budget_bytes"]), str(r["store_all_peak_bytes"]),
                  str(r["min_feasible_bytes"]), str(r["state_bytes"]), str(r["arena_bytes"]),
                  str(r["schedule_activation_bytes"]), f"{r['recomputes']}/{r['page_ins']}",
                  f"{r['paged_bytes_per_step']:.0f}" if r.get("paged_bytes_per_step") is not None else "-",
                  f"{r['instructions_per_step']:.4g}" if r.get("instructions_per_step") else "-",
                  f"{r['instructions_per_flop']:.2f}" if r.get("instructions_per_flop") else "-",
                  f"{r['host_c_over_pytorch']:.2f}x" if r.get("host_c_over_pytorch") else "-",
                  str(r.get("flash_bytes", "-")), str(r.get("ram_bytes", "-")), "yes" if r.get("ok") else "NO")
    rc = _report(rows, t, a.json, "budget")
    loads = [r["host_load_avg"] for r in rows if "host_load_avg" in r]
    if loads:  # the host ratios are side by side, but a busy machine still adds noise to both
        print(f"host C vs PyTorch: medians of {rows[0].get('host_rounds', 0)} alternating rounds; 1-minute load "
              f"average {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} CPUs")
    return rc


def _report(rows: list[dict], table: Table, path: str, label: str) -> int:
    """Print the table and each row's error (named by its model and `label`); 0 when every row ran."""
    Console(width=220).print(table)
    for r in rows:
        if r.get("error"):
            print(f"{r['model']} {r[label]}: {r['error']}", file=sys.stderr)
    print(f"wrote {path}")
    return 0 if all(r.get("ok") for r in rows) else 1


def _finetune_table(rows: list[dict], a) -> int:
    write_json(a.json, rows)
    t = Table(title=f"Fine-tuning C firmware on a Cortex-M4F (QEMU mps2-an386, {a.target}), batch 1, budget auto")
    cols = ("model", "trains", "params", "budget B", "arena B", "RAM B", "flash B", "streamed B", "paged B/step",
            "instr/step",
            "pred. s/step", "pred. J/step", "full backprop: min B", "over budget B", "ok")
    for col in cols:
        t.add_column(col, justify="right")
    for r in rows:
        if "arena_bytes" not in r:
            t.add_row(r["model"], r["train"] or "own", *["-"] * (len(cols) - 3), "error")
            continue
        t.add_row(r["model"], r["train"] or "own", f"{r['trainable_params']:,} of {r['total_params']:,}",
                  str(r["budget_bytes"]), str(r["arena_bytes"]), str(r.get("ram_bytes", "-")),
                  str(r.get("flash_bytes", "-")), str(r.get("streamed_bytes", 0)),
                  f"{r['paged_bytes_per_step']:.0f}" if r.get("paged_bytes_per_step") is not None else "-",
                  f"{r['instructions_per_step']:.4g}" if r.get("instructions_per_step") else "-",
                  f"{r['time_s']:.3g}", f"{r['energy_j']:.3g}", str(r["full_min_feasible_bytes"]),
                  f"{r['full_over_budget_bytes']:+d}", "yes" if r.get("ok") else "NO")
    return _report(rows, t, a.json, "train")


if __name__ == "__main__":
    sys.exit(main())
