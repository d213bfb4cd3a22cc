"""Human output of the `edgetrain` commands (what `--json` prints as one object, written for a reader).

Off a terminal (piped, redirected) nothing wraps mid-phrase: lines are written whole and tables get a wide
fixed width. Values from the run (losses, errors) are escaped, never read as markup.
"""
from __future__ import annotations

import math
import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .local_cli import print_local

PIPED_WIDTH = 200  # tables off a terminal: wide enough for every column, never wrapped mid-phrase


def console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr, soft_wrap=True)
    return Console(stderr=stderr, soft_wrap=True, width=PIPED_WIDTH)


def percent(gap: float | None) -> str:
    """A solver's relative gap, the one way it is printed: `0.735%`."""
    return "-" if gap is None else f"{100 * gap:.3f}%"


def mb(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e6:.3f} MB"


def losses(values) -> str:
    """Losses rounded for reading; a non-finite one is printed as such (nan, inf)."""
    return escape("[" + ", ".join(f"{x:.4f}" if math.isfinite(x) else str(x) for x in values) + "]")


def error_message(r: dict) -> str:
    e = r.get("error")
    return str(e.get("message")) if isinstance(e, dict) else str(e)


def selection_line(r: dict) -> str:
    """What trains, and (for a --train selection that freezes something) what freezing saves."""
    line = (f"trains {r['trainable_params']:,} of {r['total_params']:,} parameters ({r['trainable_tensors']} of "
            f"{r['param_tensors']} tensors, {mb(r['trainable_bytes'])}; frozen {mb(r['frozen_bytes'])})")
    full = r.get("all_trainable")
    if full:
        line += (f"; smallest feasible {mb(r['min_feasible_bytes'])} vs {mb(full['min_feasible_bytes'])} training "
                 f"all, store-all peak {mb(r['store_all_peak_bytes'])} vs {mb(full['store_all_peak_bytes'])}")
    return line


def print_human(cmd: str, r: dict) -> None:
    con = console()
    if r.get("mode") == "local" or cmd == "train":
        print_local(cmd, r, con)
    elif cmd == "compile":
        s = r["solver"]
        if s.get("notice"):
            con.print(f"[yellow]{s['notice']}")
        con.print(f"[bold]{r['model']}[/] on {r['target']}: {r['nodes']} stages, scheduler {r['scheduler']} "
                  f"(kept: {r['schedule']}; solver {s['name']} {s['status']}, gap {percent(s.get('gap'))}, "
                  f"{s['seconds']:.2f} s)")
        if r.get("time_limit_notice"):  # where the time went, when it left the solve short (--json: always)
            con.print(f"[yellow]{r['time_limit_notice']}")
            con.print("phases: " + ", ".join(f"{k} {v:.1f} s" for k, v in r["phases"].items()))
        if r.get("streaming"):  # which frozen weights stream: the rule's or the MILP's, and what choosing took
            st = r["streaming"]
            con.print(f"streamed weights: the {'MILP' if st.get('kept') == 'milp' else 'rule'}'s choice, chosen in "
                      f"{st.get('seconds', 0.0):.1f} s of {st.get('share_s', 0.0):.1f} s"
                      + (f" (MILP not tried: {st['skipped']})" if st.get("skipped") else
                         f" (MILP {st.get('solver_status')})"))
        if r.get("interrupted"):
            con.print(f"[yellow]solve interrupted (Ctrl-C) after {s['seconds']:.1f} s: kept the best schedule found by "
                      f"then (gap {percent(s.get('gap'))}); a longer solve may find a cheaper one")
        con.print(f"budget {r['budget']} = {mb(r['budget_bytes'])} (smallest feasible {mb(r['min_feasible_bytes'])}), "
                  f"peak {mb(r['peak_bytes'])} vs store-all {mb(r['store_all_peak_bytes'])}")
        con.print(f"energy {r['energy_j']:.6g} J vs store-all {r['store_all_energy_j']:.6g} J "
                  f"(+{100 * (r['energy_j'] / r['store_all_energy_j'] - 1):.2f}%); time {r['time_s']:.6g} s"
                  + (f" ({r['tokens_per_s']:.4g} tokens/s)" if r.get("tokens_per_s") else "") + "; "
                  f"{r['recomputes']} recomputes, {r['page_ins']} page-ins, {r['page_outs']} page-outs")
        if r.get("fused_kernels"):
            con.print(f"fused: {r['fused_kernels']} chains of {r['fused_ops']} pointwise ops run as inductor kernels "
                      "(checked within a tolerance, not bitwise)")
        if r.get("memory_format", "contiguous") != "contiguous":
            con.print(f"layout: convolution weights {r['memory_format']}, activations following them "
                      "(checked within a tolerance, not bitwise)")
        if r.get("train") is not None or r.get("trainable_tensors", 0) < r.get("param_tensors", 0):
            con.print(escape(selection_line(r)))
        if r.get("device_fit"):
            f = r["device_fit"]
            con.print(f"fits {f['device']}: RAM {f['ram_need_bytes']} of {f['ram_bytes']} B, flash about "
                      f"{f['flash_need_bytes']} of {f['flash_bytes']} B")
        for t in r.get("tiled") or ():
            con.print(escape(f"computed patch by patch: {len(t['replaces'])} frozen forward nodes ({t['replaces'][0]} "
                             f".. {t['replaces'][-1]}) in {t['tiles']} tiles, patch buffers {t['patch_bytes']} B"))
        if r.get("emit") == "c":
            con.print(f"static arena {r['arena_bytes']} B (schedule's activation peak "
                      f"{r['peak_bytes'] - r['state_bytes']} B) + parameters and momentum {r['state_bytes']} B, "
                      f"budget {r['budget_bytes']} B; {r['paged_bytes_per_step']} B paged per step")
            if r.get("streamed"):
                con.print(f"{len(r['streamed'])} frozen weights ({r['streamed_bytes']} B) streamed from storage, "
                          f"paged in before each reader: {escape(', '.join(r['streamed']))}")
            if r.get("input_read_bytes_per_step") is not None:
                con.print(f"the input batch is read from storage patch by patch, never whole in RAM: "
                          f"{r['input_read_bytes_per_step']} B read per step, halos included")
            con.print(f"wrote {r['out']}/schedule.json, plan.c, plan.h, main_host.c, main_qemu.c, Makefile, "
                      f"firmware.json, {'storage/, ' if r.get('streamed') else ''}et_runtime/")
        else:
            if r.get("streamed"):
                con.print(f"{len(r['streamed'])} frozen weights ({r['streamed_bytes']} B) streamed from "
                          f"weights.safetensors, read before each reader and freed after; {r['paged_bytes_per_step']} "
                          "B read or paged per step")
            floats = ", prefix_floats.safetensors" if r.get("int8_prefix") else ""  # the check's float originals
            con.print(f"wrote {r['out']}/schedule.json, plan.py, weights.safetensors{floats}")
    elif cmd == "run" and "build" in r:  # C firmware
        con.print(f"{r.get('steps_done', 0)}/{r['steps']} steps ({r['build']}), losses "
                  f"{losses(r.get('losses', []))}")
        con.print(f"arena {r['arena_bytes']} B, budget {r['budget_bytes']} B, paged {r.get('paged_bytes')} B, "
                  f"instructions/step {r['instructions_per_step']}"
                  + (f", RAM (.data+.bss) {r['ram_bytes']} B, flash {r['flash_bytes']} B" if "ram_bytes" in r else ""))
        if r.get("checked") and r.get("max_abs_err") is not None:
            con.print(f"check against autograd: max abs err {r['max_abs_err']:.3g}, max rel err "
                      f"{r['max_rel_err']:.3g} -> {'[green]OK' if r['ok'] else '[red]MISMATCH'}")
            _print_float64_rule(con, r)
        if not r["ok"]:
            con.print(f"[red]{escape(error_message(r))}")
    elif cmd == "sweep":
        t = Table(title=f"{r['model']} on {r['target']}, batch {r['batch_size']}: {r['combinations']} combinations "
                        f"({r['solved']} solved now, {r['skipped']} from earlier runs)")
        cells = []
        for x in r["rows"]:
            sol = "-" if x.get("solver_name") in (None, "none") else f"{x['solver_name']} {x['solver_status']}"
            cells.append((x["budget"], x["deadline"], x["scheduler"], x["status"],
                          "-" if x["energy_j"] is None else f"{x['energy_j']:.6g}",
                          "-" if x["time_s"] is None else f"{x['time_s']:.6g}", mb(x["peak_bytes"]), sol))
        heads = ("budget", "deadline", "scheduler", "status", "energy (J)", "time (s)", "peak", "solver")
        for k, col in enumerate(heads):
            # Names are never cut: their columns keep their longest value's width; numbers wrap if they must.
            longest = max([len(col)] + [len(c[k]) for c in cells])
            t.add_column(col, min_width=longest if k < 4 else None, no_wrap=k < 4, overflow="fold")
        for c in cells:
            t.add_row(*c)
        con.print(t)
        con.print(f"wrote {r['results_csv']}, {r['results_json']}")
    elif cmd == "plot":
        con.print(f"wrote {len(r['files'])} files to {r['plots']}" + (f" (solve {r['solve']})" if r["solve"] else ""))
        if r.get("report"):
            con.print(f"wrote {r['report']} (self-contained: open it in a browser)")
    elif cmd == "run":
        if r.get("epochs"):  # each epoch had its line as it ended
            con.print(f"{r['steps']} steps on {r['device']}, loss {losses(r['losses'][:1])} -> "
                      f"{losses(r['losses'][-1:])}" + (f"; per epoch in {escape(r['metrics'])}" if r.get("metrics")
                                                       else ""))
        else:
            con.print(f"{r['steps']} steps on {r['device']}, losses {losses(r['losses'])}")
        con.print(f"measured peak {mb(r['measured_peak_bytes'])} (predicted {mb(r['predicted_peak_bytes'])}, "
                  f"budget {mb(r['budget_bytes'])}), paged {r['paged_bytes']} B")
        if r.get("resumed_from"):
            con.print(f"resumed from {escape(r['resumed_from'])} at step {r['first_step']}")
        if r.get("saved"):
            con.print(f"saved {escape(r['saved'][0])} (the model's state_dict) and {escape(r['saved'][1])} "
                      f"(training state, step {r['first_step'] + r['steps']})")
        if r.get("int8_boundary_floats") is not None:
            con.print(f"int8 prefix against the integer reference: {r['int8_boundary_mismatches']} of "
                      f"{r['int8_boundary_floats']} boundary values differ (bit for bit expected)")
        if r.get("checked") and r.get("max_abs_err") is not None:
            kernels = " (both sides with cuDNN off)" if r.get("cudnn") is False else ""
            if r.get("fused_kernels") or r.get("memory_format", "contiguous") != "contiguous":
                # inductor's kernels and channels-last sums are not eager's to the bit: the check says how close
                what = f"{r['fused_kernels']} fused kernels" if r.get("fused_kernels") else ""
                if r.get("memory_format", "contiguous") != "contiguous":
                    what += (", " if what else "") + f"{r['memory_format']} convolution weights"
                kernels += f" ({what}: within rtol {r['check_rtol']:g}, atol {r['check_atol']:g}, not bitwise)"
            con.print(f"check against autograd{kernels}: max abs err {r['max_abs_err']:.3g}, max rel err "
                      f"{r['max_rel_err']:.3g} -> {'[green]OK' if r['ok'] else '[red]MISMATCH'}")
        if not r["ok"]:
            con.print(f"[red]{escape(error_message(r))}")
    else:
        t = Table(title=f"{r['model']} on {r['target']}: stages with recomputes or paging ({len(r['active_stages'])}"
                        f" of {r['stages']})")
        for col in ("stage", "node", "recompute", "page in", "page out"):
            t.add_column(col)
        for s in r["active_stages"]:
            t.add_row(str(s["stage"]), s["node"], ", ".join(s["recompute"]), ", ".join(s["page_in"]),
                      ", ".join(s["page_out"]))
        con.print(t)
        s = Table(title="schedule vs store-all")
        for col in ("", "schedule", "store-all"):
            s.add_column(col)
        s.add_row("peak memory", mb(r["peak_bytes"]), mb(r["store_all_peak_bytes"]))
        s.add_row("budget", mb(r["budget_bytes"]), "")
        s.add_row("energy (J)", f"{r['energy_j']:.6g}", f"{r['store_all_energy_j']:.6g}")
        s.add_row("time (s)", f"{r['time_s']:.6g}", f"{r['store_all_time_s']:.6g}")
        s.add_row("recomputes / page-ins / page-outs", f"{r['recomputes']} / {r['page_ins']} / {r['page_outs']}", "0 / 0 / 0")
        con.print(s)
        if r.get("smallest_budget_bound"):
            b = r["smallest_budget_bound"]
            con.print(escape(f"smallest feasible budget {b['budget_bytes']} B: {b['text']}. To lower it: "
                             f"{b['remedies']}."))
        for t in r.get("tiled") or ():
            con.print(escape(f"computed patch by patch: {t['node']} = {len(t['replaces'])} frozen forward nodes "
                             f"({t['replaces'][0]} .. {t['replaces'][-1]}) in {t['tiles']} tiles, patch buffers "
                             f"{t['patch_bytes']} B, {t['flops']} FLOPs with the halos"))
        sol = r["solver"]
        seconds = "-" if sol.get("seconds") is None else f"{sol['seconds']:.2f}"
        con.print(f"solver {sol['name']}: {sol['status']}, gap {percent(sol.get('gap'))}, {seconds} s")


def _print_float64_rule(con, r: dict) -> None:
    """C firmware's check: how many tensors were within rtol/atol, and each one held to the float64 run instead."""
    held = r.get("check_tensors") or []
    if not held:
        return
    con.print(f"{r['within_rtol']} tensors within rtol {r['check_rtol']:g}, atol {r['check_atol']:g} of eager "
              f"float32; {len(held)} beyond it, held to a float64 run of the same steps (pass: at most "
              f"{r['check_rounding_factor']:g}x eager float32's error against it):")
    for c in held:
        verdict = "[green]rounding" if c["rule"] == "float64" else "[red]FAILED"
        con.print(f"  {escape(c['name'])}: max abs err {c['max_abs_err']:.3g}; against float64: firmware "
                  f"{c['float64_err']:.3g}, eager float32 {c['eager_float64_err']:.3g} -> {verdict}")
