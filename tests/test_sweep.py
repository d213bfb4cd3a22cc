"""The workbench: `edgetrain sweep` (every combination, CSV/JSON rows, resume) and `edgetrain plot`."""
from __future__ import annotations

import csv
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

BUDGETS = ["100%", "60%", "min"]
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
    want = {combo_key("60%", "none", "poet"), combo_key("min", "1.2", "dtr")}  # one solved, one infeasible
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


def test_plot_writes_png_and_svg(swept, capsys):
    out, _ = swept
    assert main(["plot", out, "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["solve"] == combo_key("min", "none", "poet")  # POET at the tightest budget by default
    assert main(["plot", out, "--solve", combo_key("60%", "none", "paging"), "--json"]) == 0
    r2 = json.loads(capsys.readouterr().out)
    names = {os.path.basename(p) for p in r["files"] + r2["files"]}
    for stem in ("energy_vs_budget", "time_vs_budget", f"schedule_{r['solve']}", f"memory_{r['solve']}",
                 f"schedule_{r2['solve']}", f"memory_{r2['solve']}"):
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
    assert main(["plot", out, "--solve", combo_key("min", "none", "dtr"), "--json"]) == 2  # infeasible: no schedule
    assert "no schedule" in json.loads(capsys.readouterr().out)["error"]


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


def test_energy_plot_has_one_panel_per_deadline():
    """Each deadline of a sweep gets its panel; a deadline's points are drawn only in its own panel."""
    from edgetrain.compiler.workbench.plot import _mpl, _versus_budget, deadline_panels

    meta = {"model": "m", "target": "t", "batch_size": 2, "schedulers": ["poet", "dtr"],
            "deadlines": ["none", "1.2", "1.5"], "min_feasible_bytes": 1e6}
    rows = [{"scheduler": s, "deadline": d, "status": "ok", "budget_bytes": b, "energy_j": e}
            for s, d, b, e in [("poet", "none", 2e6, 1.0), ("poet", "none", 3e6, 0.9), ("dtr", "1.2", 3e6, 1.1),
                               ("poet", "0.5s", 3e6, 2.0)]]
    assert deadline_panels(meta, rows) == ["none", "1.2", "0.5s"]  # 1.5 has no row; 0.5s is not in meta
    assert deadline_panels(meta, []) == ["none"]
    plt = _mpl()
    fig = _versus_budget(plt, meta, rows, "energy_j", "J", "Energy", None)
    axes = fig.axes
    assert len(axes) == 3
    assert [len(ax.lines) - 1 for ax in axes] == [1, 1, 1]  # one scheduler line each, plus the min-budget line
    assert list(axes[0].lines[0].get_ydata()) == [1.0, 0.9]
    assert "1.2x" in axes[1].get_title() and "0.5s" in axes[2].get_title()
    plt.close(fig)
