"""The workbench: `edgetrain sweep` (every combination, CSV/JSON rows, resume) and `edgetrain plot`."""
from __future__ import annotations

import csv
import glob
import itertools
import json
import os
import shutil

import pytest

from edgetrain.compiler.workbench.cli import main
from edgetrain.compiler.errors import EdgetrainError
from edgetrain.compiler.graph.ir import TrainingGraph
from edgetrain.compiler.workbench.plot import memory_curve, schedule_matrices
from edgetrain.compiler.workbench.sweep import COLUMNS, SweepOptions, combo_key, read_rows, run_sweep

BUDGETS = ["100%", "85%", "min"]
DEADLINES = ["none", "1.2"]
SCHEDULERS = ["poet", "paging", "dtr"]


def _opts(out: str, **kw) -> SweepOptions:
    base = dict(model="small_cnn", target="rpi4", out=out, budgets=",".join(BUDGETS), deadlines=",".join(DEADLINES),
                schedulers=",".join(SCHEDULERS), time_limit=10, batch_size=8, jobs=2)
    base.update(kw)
    return SweepOptions(**base)


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("sweep") / "small_cnn")
    return out, run_sweep(_opts(out))


def _csv_rows(out: str) -> list[dict]:
    with open(os.path.join(out, "results.csv"), newline="") as f:
        return list(csv.DictReader(f))


def test_sweep_rows_cover_every_combination(swept):
    out, r = swept
    n = len(BUDGETS) * len(DEADLINES) * len(SCHEDULERS)
    assert r["combinations"] == n and r["solved"] == n and r["skipped"] == 0
    rows = _csv_rows(out)
    with open(os.path.join(out, "results.json")) as f:
        jrows = json.load(f)
    assert len(rows) == len(jrows) == n
    assert list(rows[0].keys()) == list(COLUMNS)
    want = {combo_key(b, d, s) for b, d, s in itertools.product(BUDGETS, DEADLINES, SCHEDULERS)}
    assert {x["key"] for x in rows} == {x["key"] for x in jrows} == want
    assert {(x["budget"], x["deadline"], x["scheduler"]) for x in jrows} == set(
        itertools.product(BUDGETS, DEADLINES, SCHEDULERS))
    for x in jrows:
        assert x["model"] == "small_cnn" and x["target"] == "rpi4" and x["batch_size"] == 8
        assert x["status"] in ("ok", "infeasible"), x  # no crash, no unexpected error
        if x["budget"] == "min":
            assert x["budget_bytes"] == r["min_feasible_bytes"]
        if x["deadline"] == "1.2":
            assert x["deadline_s"] == pytest.approx(1.2 * r["store_all_time_s"])
        else:
            assert x["deadline_s"] is None
        if x["status"] == "ok":
            assert x["energy_j"] > 0 and x["time_s"] > 0 and x["peak_bytes"] <= x["budget_bytes"]
            if x["deadline_s"] is not None:
                assert x["time_s"] <= x["deadline_s"] * (1 + 1e-6)
            with open(os.path.join(out, x["solve_file"])) as f:
                solve = json.load(f)
            assert solve["key"] == x["key"] and solve["steps"] and len(solve["stage_peaks"]) > 0
        else:
            assert x["error"] and x["error_type"] == "BudgetError" and x["energy_j"] is None
    statuses = {x["key"]: x["status"] for x in jrows}
    # DTR cannot page, so it cannot meet the smallest budget (which only paging attains); the rows say why.
    assert statuses[combo_key("min", "none", "dtr")] == "infeasible"
    assert statuses[combo_key("min", "none", "poet")] == "ok"
    assert statuses[combo_key("100%", "none", "poet")] == "ok"


def test_poet_is_never_worse_than_a_baseline(swept):
    out, _ = swept
    rows = read_rows(out)
    by = {(x["budget"], x["deadline"], x["scheduler"]): x for x in rows}
    compared = 0
    for b, d in itertools.product(BUDGETS, DEADLINES):
        poet = by[(b, d, "poet")]
        for s in SCHEDULERS[1:]:
            other = by[(b, d, s)]
            if other["status"] != "ok":
                continue
            assert poet["status"] == "ok", (b, d, s)  # whatever a baseline fits, POET fits
            gap = poet["solver_gap"] or 0.0
            assert poet["energy_j"] <= other["energy_j"] * (1 + gap + 1e-9) + 1e-15, (b, d, s)
            compared += 1
    assert compared >= 3


def test_solve_figures_follow_the_steps(swept):
    out, _ = swept
    with open(os.path.join(out, "graph.json")) as f:
        g = TrainingGraph.from_json(json.load(f))
    for x in read_rows(out):
        if x["status"] != "ok":
            continue
        with open(os.path.join(out, x["solve_file"])) as f:
            steps = json.load(f)["steps"]
        after, during = memory_curve(g, steps)
        assert max(during) == x["peak_bytes"]  # the validator's accounting, replayed
        assert after[-1] == g.state_bytes  # every tensor freed by the end of the step
        _tensors, m = schedule_matrices(g, steps)
        assert sum(map(sum, m["page_in"])) == x["page_ins"]
        assert sum(map(sum, m["page_out"])) == x["page_outs"]
        assert sum(v == 2 for row in m["compute"] for v in row) == x["recomputes"]


def test_resume_solves_only_missing_rows(swept, tmp_path, capsys):
    src, first = swept
    out = str(tmp_path / "resumed")
    shutil.copytree(src, out)
    path = os.path.join(out, "rows.jsonl")
    with open(path) as f:
        lines = f.readlines()
    keep, dropped = [], []
    want = {combo_key("85%", "none", "poet"), combo_key("min", "1.2", "dtr")}  # one solved, one infeasible
    for line in lines:
        (dropped if json.loads(line)["key"] in want else keep).append(line)
    assert len(dropped) == 2
    with open(path, "w") as f:
        f.writelines(keep)
        f.write('{"key": "poet_b100pct_d')  # a row torn by a kill mid-write is ignored
    os.remove(os.path.join(out, "results.csv"))
    code = main(["sweep", "small_cnn", "--target", "rpi4", "--budgets", ",".join(BUDGETS), "--deadlines",
                 ",".join(DEADLINES), "--schedulers", ",".join(SCHEDULERS), "--time-limit", "10", "--batch-size", "8",
                 "--out", out, "--json"])
    r = json.loads(capsys.readouterr().out)
    assert code == 0 and r["ok"]
    assert r["solved"] == 2 and r["skipped"] == first["combinations"] - 2
    rows = read_rows(out)
    assert {x["key"] for x in rows if x["run_id"] == r["run_id"]} == want
    assert {x["key"] for x in rows if x["run_id"] == first["run_id"]} == {x["key"] for x in first["rows"]} - want
    assert len(_csv_rows(out)) == first["combinations"]
    again = {x["key"]: x for x in rows}
    for x in first["rows"]:  # the re-solved rows agree with the first run
        assert again[x["key"]]["status"] == x["status"]
        if x["status"] == "ok":
            assert again[x["key"]]["energy_j"] == pytest.approx(x["energy_j"], rel=1e-4)


def test_resume_refuses_another_configuration(swept):
    out, _ = swept
    with pytest.raises(EdgetrainError, match="another configuration"):
        run_sweep(_opts(out, batch_size=4, budgets="100%", deadlines="none", schedulers="poet"))


@pytest.fixture(scope="module")
def plotted(swept):
    from edgetrain.compiler.workbench.plot import plot_sweep

    out, _ = swept
    return out, plot_sweep(out)


def test_plot_writes_png_and_svg(plotted, capsys):
    out, r = plotted  # plot_sweep(out): the command's defaults
    assert r["solve"] == combo_key("min", "none", "poet")  # POET at the tightest budget by default
    assert main(["plot", out, "--solve", combo_key("85%", "none", "paging"), "--memory-steps", "--json"]) == 0
    r2 = json.loads(capsys.readouterr().out)
    assert "data" not in r2  # the drawn data is for Python callers, not the command's output
    names = {os.path.basename(p) for p in r["files"] + r2["files"]}
    for stem in ("energy_vs_budget", "time_vs_budget", "energy_vs_time", f"schedule_{r['solve']}",
                 f"memory_{r['solve']}", f"schedule_{r2['solve']}", f"memory_{r2['solve']}"):
        assert {f"{stem}.png", f"{stem}.svg"} <= names
    for p in r["files"] + r2["files"]:
        assert os.path.dirname(p) == os.path.join(out, "plots")
        assert os.path.getsize(p) > 1024, p
        with open(p, "rb") as f:
            head = f.read(512)
        if p.endswith(".png"):
            assert head.startswith(b"\x89PNG\r\n\x1a\n")
        else:
            assert b"<svg" in head or b"<?xml" in head
    assert not [f for f in os.listdir(os.path.join(out, "plots")) if f.endswith(".tmp")]  # atomic writes
    assert r["report"] == os.path.join(out, "report.html") and os.path.exists(r["report"])
    assert main(["plot", out, "--solve", combo_key("min", "none", "dtr"), "--json"]) == 2  # infeasible: no schedule
    assert "no schedule" in json.loads(capsys.readouterr().out)["error"]["message"]


def test_sweep_on_a_local_ray_instance(swept, tmp_path):
    pytest.importorskip("ray")
    src, _ = swept
    out = str(tmp_path / "ray")
    r = run_sweep(_opts(out, budgets="100%,min", deadlines="none", executor="ray"))
    assert r["executor"] == "ray" and r["solved"] == 6 and r["skipped"] == 0
    local = {x["key"]: x for x in read_rows(src)}
    rows = read_rows(out)
    assert len(rows) == 6 and len(_csv_rows(out)) == 6
    for x in rows:  # the same answers as the local process pool
        assert x["status"] == local[x["key"]]["status"], x["key"]
        if x["status"] == "ok":
            assert x["energy_j"] == pytest.approx(local[x["key"]]["energy_j"], rel=1e-4)
            assert os.path.exists(os.path.join(out, x["solve_file"]))


# -- figures: what they draw ---------------------------------------------------------------------------

def test_every_scheduler_is_in_every_panel_and_infeasible_points_are_marked(swept, plotted):
    from edgetrain.compiler.workbench.plot import budget_percent

    out, r = plotted
    with open(os.path.join(out, "sweep.json")) as f:
        meta = json.load(f)
    rows = {(x["budget"], x["deadline"], x["scheduler"]): x for x in read_rows(out)}
    for name, field, base in (("energy_vs_budget", "energy_j", meta["store_all_energy_j"]),
                              ("time_vs_budget", "time_s", meta["store_all_time_s"])):
        panels = r["data"][name]["panels"]
        assert list(panels) == DEADLINES
        for d, panel in panels.items():
            assert set(panel["points"]) == set(panel["infeasible"]) == set(SCHEDULERS)
            for s in SCHEDULERS:
                drawn = {p[2]: p for p in panel["points"][s]}
                marked = {p[1]: p for p in panel["infeasible"][s]}
                assert set(drawn) | set(marked) == set(BUDGETS) and not set(drawn) & set(marked)  # each once
                for b in BUDGETS:
                    row = rows[(b, d, s)]
                    x = budget_percent(meta, row["budget_bytes"])
                    if row["status"] == "ok":
                        assert drawn[b][0] == pytest.approx(x)
                        assert drawn[b][1] == pytest.approx(100 * (row[field] / base - 1))
                    else:
                        assert marked[b][0] == pytest.approx(x) and marked[b][2] in (
                            "budget", "deadline", "budget + deadline")
    inf = r["data"]["energy_vs_budget"]["panels"]["none"]["infeasible"]["dtr"]
    assert ("min", "budget") in [(b, why) for _, b, why in inf]  # DTR cannot page: min is out of its reach
    assert [p[0] for p in inf] == sorted(p[0] for p in inf)
    assert budget_percent(meta, rows[("85%", "none", "poet")]["budget_bytes"]) == pytest.approx(85, abs=1e-3)


def test_versus_budget_has_one_legend_outside_the_axes():
    from edgetrain.compiler.workbench.plot import versus_budget

    meta = {"model": "m", "target": "t", "batch_size": 2, "schedulers": ["poet", "dtr"], "deadlines": ["none", "1.2"],
            "fixed_bytes": 1e6, "activation_peak_bytes": 2e6, "min_feasible_bytes": 1.2e6, "store_all_peak_bytes": 3e6,
            "store_all_energy_j": 1.0, "store_all_time_s": 1.0, "store_all_peak_bytes": 3e6}
    rows = [{"scheduler": s, "deadline": d, "status": st, "budget": b, "budget_bytes": bb, "energy_j": e,
             "error": None if st == "ok" else "over the deadline"}
            for s, d, st, b, bb, e in [("poet", "none", "ok", "100%", 3e6, 1.0), ("poet", "none", "ok", "50%", 1.5e6, 1.01),
                                       ("dtr", "none", "ok", "100%", 3e6, 1.0), ("dtr", "1.2", "infeasible", "50%", 1.5e6, None),
                                       ("poet", "1.2", "ok", "50%", 1.5e6, 1.02)]]
    fig, data = versus_budget(meta, rows, "energy_j", "energy")
    assert len(fig.legends) == 1 and not any(ax.get_legend() for ax in fig.axes)
    fig.canvas.draw()
    legend = fig.legends[0].get_window_extent()
    for ax in fig.axes:
        assert not legend.overlaps(ax.get_window_extent()), ax
    assert data["panels"]["1.2"]["infeasible"]["dtr"] == [(50.0, "50%", "deadline")]
    assert data["panels"]["1.2"]["points"]["dtr"] == []  # no point drawn for it: only the mark
    assert data["panels"]["none"]["points"]["poet"] == [(50.0, pytest.approx(1.0), "50%"), (100.0, 0.0, "100%")]
    import matplotlib.pyplot as plt

    plt.close(fig)


def _scheduler_lines(ax, scheds) -> list:
    return [ln for ln in ax.lines if ln.get_label() in scheds]


def assert_every_point_shows(fig, scheds: list[str]) -> None:
    """What a figure's reader relies on, read off its artists: every marker inside its axes' frame, every
    legend entry standing for a drawn artist with finite data, coinciding series apart on the page."""
    import numpy as np
    from matplotlib.collections import LineCollection

    fig.canvas.draw()
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        box = ax.get_window_extent()
        for art in ax.lines:
            if art.get_marker() in (None, "None", "", " "):
                continue
            xy = art.get_transform().transform(art.get_xydata())
            assert np.isfinite(xy).all(), art.get_label()
            inside = ((xy[:, 0] >= box.x0 - 0.5) & (xy[:, 0] <= box.x1 + 0.5) &
                      (xy[:, 1] >= box.y0 - 0.5) & (xy[:, 1] <= box.y1 + 0.5))
            assert inside.all(), (art.get_label(), art.get_xydata()[~inside], ax.get_xlim(), ax.get_ylim())
        for col in ax.collections:
            if isinstance(col, LineCollection):
                for seg in col.get_segments():
                    xy = col.get_transform().transform(seg)
                    assert (xy[:, 1] >= box.y0 - 0.5).all() and (xy[:, 1] <= box.y1 + 0.5).all(), col.get_label()
    (legend,) = fig.legends
    for text in legend.get_texts():
        label = text.get_text()
        arts = [a for ax in fig.axes for a in [*ax.lines, *ax.collections] if label in (a.get_label(), a.get_gid())]
        assert arts, f"the legend lists {label!r}, nothing drawn stands for it"
        data = [np.asarray(a.get_xydata() if hasattr(a, "get_xydata") else np.concatenate(a.get_segments()))
                for a in arts]
        assert any(d.size and np.isfinite(d).all() for d in data), label
    for ax in fig.axes:
        lines = _scheduler_lines(ax, scheds)
        looks = [(ln.get_marker(), ln.get_markersize()) for ln in lines]
        assert len(set(looks)) == len(looks), looks  # no two series look alike
        for a, b in itertools.combinations(lines, 2):
            if a.get_markersize() != b.get_markersize():  # the smaller marker on top
                small, big = sorted((a, b), key=lambda ln: ln.get_markersize())
                assert small.get_zorder() > big.get_zorder(), (small.get_label(), big.get_label())
            pa, pb = a.get_xydata(), b.get_xydata()
            da, db = a.get_transform().transform(pa), b.get_transform().transform(pb)
            for i, j in itertools.product(range(len(pa)), range(len(pb))):
                if np.allclose(pa[i], pb[j]):  # one data point: drawn apart on the page
                    assert abs(da[i][0] - db[j][0]) >= 2.0, (a.get_label(), b.get_label(), pa[i])


def _figures(meta: dict, rows: list[dict]):
    from edgetrain.compiler.workbench.plot import energy_vs_time, versus_budget

    yield versus_budget(meta, rows, "energy_j", "energy")
    yield versus_budget(meta, rows, "time_s", "time")
    yield energy_vs_time(meta, rows)


def _check_sweep_figures(d: str) -> list[dict]:
    import matplotlib.pyplot as plt
    from edgetrain.compiler.workbench.plot import NO_SCHEDULE_LABEL

    with open(os.path.join(d, "sweep.json")) as f:
        meta = json.load(f)
    rows = read_rows(d)
    scheds = sorted({r["scheduler"] for r in rows})
    bad = [r for r in rows if r["status"] != "ok"]
    out = []
    for fig, data in _figures(meta, rows):
        assert_every_point_shows(fig, scheds)
        if "field" in data:  # versus budget: one cross per combination without a schedule, and its legend entry
            crosses = [ln for ax in fig.axes for ln in ax.lines if ln.get_label() == NO_SCHEDULE_LABEL]
            assert all(ln.get_marker() == "x" for ln in crosses)
            assert sum(len(ln.get_xydata()) for ln in crosses) == len(bad)
            assert (NO_SCHEDULE_LABEL in [t.get_text() for t in fig.legends[0].get_texts()]) == bool(bad)
            drawn = sum(len(ln.get_xydata()) for ax in fig.axes for ln in _scheduler_lines(ax, scheds))
            assert drawn == len(rows) - len(bad)  # every solved combination is a marker
        else:
            said = sum(len(v) for p in data["panels"].values() for v in p["no_schedule"].values())
            assert said == len(bad)  # energy vs time: each one named in its panel
        out.append(data)
        plt.close(fig)
    return out


def test_every_point_of_a_real_sweep_is_inside_its_frame(swept):
    """small_cnn's sweep: overheads from 0 to a few hundred percent, on a linear axis, and DTR's crosses."""
    out, _ = swept
    _check_sweep_figures(out)


DOCS_SWEEPS = sorted(glob.glob(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                                             "data", "sweep_*")))


@pytest.mark.parametrize("d", DOCS_SWEEPS, ids=os.path.basename)
def test_every_point_of_the_committed_sweeps_is_inside_its_frame(d):
    """The committed ResNet-18 sweeps: 0.001% beside 30%, on a symlog axis; schedulers coinciding at 100%."""
    energy, time_, _ = _check_sweep_figures(d)
    assert energy["yscale"] == time_["yscale"] == "symlog"


def test_a_point_hundreds_of_percent_above_the_rest_stays_in_the_frame():
    """+0.05% beside +300%, paging alike at both budgets, one scheduler without any schedule: autoscaling
    would miss the series (drawn through an offset transform), so the limits come from the values."""
    meta = {"model": "m", "target": "t", "batch_size": 2, "schedulers": ["poet", "paging", "dtr"],
            "deadlines": ["none"], "fixed_bytes": 1e6, "activation_peak_bytes": 2e6, "min_feasible_bytes": 1.8e6,
            "store_all_energy_j": 1.0, "store_all_time_s": 1.0, "store_all_peak_bytes": 3e6}
    rows = [{"scheduler": s, "deadline": "none", "status": st, "budget": b, "budget_bytes": bb, "energy_j": e,
             "time_s": e, "error": None if st == "ok" else "does not fit the budget", "key": f"{s}{b}"}
            for s, st, b, bb, e in [("poet", "ok", "100%", 3e6, 1.0), ("poet", "ok", "min", 1.8e6, 1.0005),
                                    ("paging", "ok", "100%", 3e6, 4.0), ("paging", "ok", "min", 1.8e6, 4.0),
                                    ("dtr", "infeasible", "100%", 3e6, None), ("dtr", "infeasible", "min", 1.8e6, None)]]
    import matplotlib.pyplot as plt

    for fig, data in _figures(meta, rows):
        assert_every_point_shows(fig, ["poet", "paging", "dtr"])
        if "field" in data:
            assert data["yscale"] == "symlog"
            assert data["panels"]["none"]["infeasible"]["dtr"] == [(60.0, "min", "budget"), (100.0, "100%", "budget")]
        plt.close(fig)


def test_pareto_front_keeps_what_nothing_beats():
    from edgetrain.compiler.workbench.plot import pareto_front

    pts = [(0.0, 5.0), (10.0, 1.0), (5.0, 5.0), (20.0, 1.0), (30.0, 0.5), (2.0, 7.0)]
    assert pareto_front(pts) == [(0.0, 5.0), (10.0, 1.0), (30.0, 0.5)]
    assert pareto_front([]) == []


def test_energy_vs_time_front_is_drawn_from_solved_rows(plotted):
    from edgetrain.compiler.workbench.plot import pareto_front

    out, r = plotted
    panels = r["data"]["energy_vs_time"]["panels"]
    assert list(panels) == ["100%", "85%", "min"]  # loosest first
    ok = [x for x in read_rows(out) if x["status"] == "ok"]
    for b, p in panels.items():
        assert len(p["points"]) == sum(x["budget"] == b for x in ok)
        assert p["front"] == pareto_front(p["points"]) and p["front"]


def test_stacked_memory_equals_the_validator_stage_peaks(swept):
    """What the memory figure stacks sums, stage by stage, to the validator's stage peaks: exactly."""
    from edgetrain.compiler.workbench.memory_breakdown import CATEGORIES, breakdown

    out, _ = swept
    with open(os.path.join(out, "graph.json")) as f:
        g = TrainingGraph.from_json(json.load(f))
    seen_paging = False
    for x in read_rows(out):
        if x["status"] != "ok":
            continue
        with open(os.path.join(out, x["solve_file"])) as f:
            solve = json.load(f)
        b = breakdown(g, solve["steps"])
        assert b.totals() == solve["stage_peaks"], x["key"]
        assert max(b.totals()) == x["peak_bytes"]
        for c in b.stage_peaks:
            assert set(c) == set(CATEGORIES) and min(c.values()) >= 0 and c["state"] == g.state_bytes
        seen_paging |= any(c["paging"] for c in b.stage_peaks) and x["page_ins"] > 0
        bwd = [c["gradients"] for t, c in enumerate(b.stage_peaks) if t > g.loss_stage]
        assert max(bwd) > 0 and all(c["gradients"] == 0 for c in b.stage_peaks[: g.loss_stage])
    assert seen_paging


def test_memory_figure_data_is_the_breakdown(plotted):
    out, r = plotted
    mem = r["data"]["memory"]
    assert not mem["per_step"]
    assert mem["totals"] == mem["stage_peaks"]
    assert [sum(v) for v in zip(*mem["series"].values())] == mem["totals"]


def test_report_is_self_contained_and_has_the_results_table(plotted):
    import re

    out, r = plotted
    with open(r["report"]) as f:
        html = f.read()
    refs = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert refs
    for ref in refs:
        if ref.startswith("data:"):
            assert ref.startswith("data:image/png;base64,")
        else:
            assert "://" not in ref and os.path.exists(os.path.join(out, ref)), ref
    assert len(re.findall(r'src="data:image/png;base64,', html)) == 5  # energy, time, trade-off, schedule, memory
    table = html[html.index('<table id="results">'):]
    table = table[: table.index("</table>")]
    rows = read_rows(out)
    assert table.count("<tr") == len(rows) + 1
    for x in rows:
        assert f"<td class=\"l\">{x['scheduler']}</td>" in table
    assert table.count('<tr class="infeasible">') == sum(x["status"] == "infeasible" for x in rows)


def test_sweep_asks_no_deadline_by_default():
    from edgetrain.compiler.workbench.cli import _parser

    a = _parser().parse_args(["sweep", "small_cnn", "--target", "rpi4", "--out", "x"])
    assert a.deadlines == "none"
    assert SweepOptions(model="m", target="t", out="x").deadlines == ["none"]


def test_console_table_keeps_names_whole_at_80_columns(monkeypatch):
    import io

    from rich.console import Console

    from edgetrain.compiler.workbench import report

    buf = io.StringIO()
    monkeypatch.setattr(report, "console", lambda stderr=False: Console(file=buf, width=80, soft_wrap=True))
    rows = [{"budget": "100%", "deadline": "none", "scheduler": s, "status": st, "energy_j": e, "time_s": e,
             "peak_bytes": None if e is None else 1616304, "solver_name": "highs", "solver_status": "time_limit"}
            for s, st, e in [("checkmate", "infeasible", None), ("checkpoint", "ok", 1.47850757)]]
    report.print_human("sweep", {"model": "small_cnn", "target": "rpi4", "batch_size": 8, "combinations": 2,
                                 "solved": 2, "skipped": 0, "rows": rows, "results_csv": "r.csv",
                                 "results_json": "r.json"})
    text = buf.getvalue()
    for word in ("checkmate", "checkpoint", "infeasible"):
        assert word in text, text


@pytest.mark.slow
def test_resnet50_schedule_figures_are_block_aggregated(tmp_path):
    """A ResNet-50 schedule (hundreds of stages, more than a hundred decision tensors) drawn in blocks."""
    from edgetrain.compiler.workbench.plot import plot_sweep
    from edgetrain.compiler.workbench.plot_schedule import MAX_ROWS, MAX_STAGES

    out = str(tmp_path / "r50")
    r = run_sweep(SweepOptions(model="resnet50", target="rpi4", out=out, budgets="min", deadlines="none",
                               schedulers="paging", time_limit=10, jobs=1))
    assert r["status_counts"] == {"ok": 1}
    p = plot_sweep(out)
    sched = p["data"]["schedule"]
    assert sched["aggregated"] and len(sched["tensors"]) > MAX_ROWS
    assert len(sched["labels"]) <= MAX_ROWS and len(sched["cols"]) <= MAX_STAGES
    covered = [i for a, b in sched["rows"] for i in range(a, b)]
    assert covered == list(range(len(sched["tensors"])))  # every tensor in exactly one block, in order
    row = read_rows(out)[0]
    # every page-in of the schedule is in some block's share: the aggregated panel hides none of them
    n_rows = [b - a for a, b in sched["rows"]]
    n_cols = [b - a for a, b in sched["cols"]]
    hits = sum(share * nr * nc for line, nr in zip(sched["shares"]["page_in"], n_rows)
               for share, nc in zip(line, n_cols))
    assert round(hits) == row["page_ins"] > 0
    assert p["data"]["memory"]["totals"] == p["data"]["memory"]["stage_peaks"]
    names = {os.path.basename(f) for f in p["files"]}
    for stem in ("energy_vs_budget", "time_vs_budget", "energy_vs_time", f"schedule_{row['key']}",
                 f"memory_{row['key']}"):
        assert {f"{stem}.png", f"{stem}.svg"} <= names
