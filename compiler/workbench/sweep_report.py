"""DIR/report.html: one self-contained page of a sweep (settings, figures inline as base64 PNG, every row).

It opens from disk in a browser without a server; its only links are to files of the sweep folder itself
(results.csv, results.json).
"""
from __future__ import annotations

import base64
import os

import jinja2

from .figures import budget_percent, infeasible_reason

_TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>{{ meta.model }} on {{ meta.target }}: edgetrain sweep</title>
<style>
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1400px; color: #222; }
table { border-collapse: collapse; font-size: 13px; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 2px 8px; text-align: right; white-space: nowrap; }
th { background: #f3f3f3; } td.l, th.l { text-align: left; }
#results td:last-child { white-space: normal; text-align: left; min-width: 28em; }
tr.infeasible td { color: #888; } tr.error td { color: #b00; }
figure { margin: 1em 0 2em; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 13px; color: #555; }
</style></head><body>
<h1>{{ meta.model }} on {{ meta.target }}, batch {{ meta.batch_size }}</h1>
<p>{{ rows|length }} combinations: {% for s, n in counts %}{{ n }} {{ s }}{% if not loop.last %}, {% endif %}{% endfor %}.
Data: <a href="results.csv">results.csv</a>, <a href="results.json">results.json</a>.</p>
<h2>Settings</h2>
<table>{% for k, v in settings %}<tr><th class="l">{{ k }}</th><td class="l">{{ v }}</td></tr>{% endfor %}</table>
<h2>Figures</h2>
{% for f in figures %}<figure><img alt="{{ f.name }}" src="data:image/png;base64,{{ f.png }}">
<figcaption>{{ f.name }}: {{ f.caption }}</figcaption></figure>
{% endfor %}
<h2>Results</h2>
<table id="results"><tr>{% for c in columns %}<th{% if loop.index <= 4 %} class="l"{% endif %}>{{ c }}</th>{% endfor %}</tr>
{% for r in table %}<tr class="{{ r.status }}">{% for v in r.cells %}<td{% if loop.index <= 4 %} class="l"{% endif %}>{{ v }}</td>{% endfor %}</tr>
{% endfor %}</table>
</body></html>
"""

COLUMNS = ("budget", "deadline", "scheduler", "status", "budget (MB)", "budget (% act.)", "energy (J)",
           "energy vs store-all", "time (s)", "time vs store-all", "peak (MB)", "recomputes", "page-ins",
           "page-outs", "solver", "gap", "why no schedule")


def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _cells(meta: dict, r: dict) -> list[str]:
    from .report import percent

    def over(v, base):
        return "-" if v is None or not base else f"{100 * (v / base - 1):+.3f}%"

    ok = r["status"] == "ok"
    solver = "-" if r.get("solver_name") in (None, "none") else f"{r['solver_name']} {r.get('solver_status')}"
    return [r["budget"], r["deadline"], r["scheduler"], r["status"], f"{r['budget_bytes'] / 1e6:.3f}",
            f"{budget_percent(meta, r['budget_bytes']):.1f}%", _fmt(r.get("energy_j"), ".6g"),
            over(r.get("energy_j"), meta.get("store_all_energy_j")), _fmt(r.get("time_s"), ".6g"),
            over(r.get("time_s"), meta.get("store_all_time_s")),
            "-" if r.get("peak_bytes") is None else f"{r['peak_bytes'] / 1e6:.3f}",
            _fmt(r.get("recomputes"), "d"), _fmt(r.get("page_ins"), "d"), _fmt(r.get("page_outs"), "d"), solver,
            percent(r.get("solver_gap")) if ok else "-",
            "" if ok else f"{infeasible_reason(r.get('error'))}: {r.get('error') or ''}"]


def _settings(meta: dict, rows: list[dict]) -> list[tuple[str, str]]:
    limits = sorted({r.get("time_limit") for r in rows if r.get("time_limit") is not None})
    mb = lambda k: "-" if meta.get(k) is None else f"{meta[k] / 1e6:.3f} MB"  # noqa: E731
    return [("model", meta["model"]), ("target", meta["target"]), ("batch size", meta["batch_size"]),
            ("input shape", meta.get("input_shape")), ("seed", meta.get("seed")), ("solver", meta.get("solver")),
            ("budgets", ", ".join(meta.get("budgets", []))), ("deadlines", ", ".join(meta.get("deadlines", []))),
            ("schedulers", ", ".join(meta.get("schedulers", []))),
            ("time limit per solve", ", ".join(f"{x:g} s" for x in limits) or "-"),
            ("training-graph nodes (stages)", meta.get("nodes")), ("decision tensors", meta.get("decision_tensors")),
            ("fixed state (params, optimizer, buffers, largest gradient)", mb("fixed_bytes")),
            ("store-all activation peak", mb("activation_peak_bytes")),
            ("smallest feasible budget", mb("min_feasible_bytes")),
            ("store-all peak (100%)", mb("store_all_peak_bytes")),
            ("store-all energy per step", f"{meta['store_all_energy_j']:.6g} J"),
            ("store-all time per step", f"{meta['store_all_time_s']:.6g} s")]


def write_report(d: str, meta: dict, rows: list[dict], figures: list[dict], plots: str | None = None) -> str:
    """Write DIR/report.html (atomically) from the sweep's rows and the figures' PNGs in ``plots`` (default
    DIR/plots); returns its path."""
    from .sweep import _write_atomic

    figs = []
    for f in figures:
        with open(os.path.join(plots or os.path.join(d, "plots"), f"{f['name']}.png"), "rb") as fh:
            figs.append(dict(f, png=base64.b64encode(fh.read()).decode("ascii")))
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    rank = {f: {k: i for i, k in enumerate(meta.get(f + "s", []))} for f in ("budget", "deadline", "scheduler")}
    table = sorted(rows, key=lambda r: tuple(rank[f].get(r[f], len(rank[f])) for f in rank))  # the sweep's order
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    html = env.from_string(_TEMPLATE).render(
        meta=meta, rows=rows, counts=sorted(counts.items()), settings=_settings(meta, rows), figures=figs,
        columns=COLUMNS, table=[{"status": r["status"], "cells": _cells(meta, r)} for r in table])
    path = os.path.join(d, "report.html")
    _write_atomic(path, html)
    return path
