"""benchmarks/peers.py end to end on small_cnn: eager, checkpoint per block and two edgetrain plans (100% and
80%: on rpi4 at batch 8 its smallest feasible budget is about 71% of plain backprop's peak), each real
peak measured in its own process, their steps timed alternating; the rows' fields and figures hold up, and the
table and the figure come back from the JSON alone."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.memory_probe import cpu_probe_available  # noqa: E402
from benchmarks.peers import _over_note, main, parse_methods  # noqa: E402
from benchmarks.peers_figure import pareto  # noqa: E402

PEERS = os.path.join(ROOT, "benchmarks", "peers.py")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, PEERS, *args], capture_output=True, text=True, cwd=ROOT, timeout=300)


@pytest.mark.skipif(not cpu_probe_available(), reason="needs Linux's resettable resident-set high-water mark")
def test_peers_rows_table_and_figure(tmp_path, capsys):
    out = tmp_path / "peers.json"
    r = _run("--models", "small_cnn", "--methods", "checkpoint,edgetrain:100%,edgetrain:80%", "--steps", "2",
             "--warmup", "1", "--mem-steps", "2", "--target", "rpi4", "--time-limit", "10", "--json", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(out.read_text())
    by = {(row["method"], row["setting"]): row for row in rows}
    assert set(by) == {("eager", "-"), ("checkpoint", "per block"), ("edgetrain", "100%"), ("edgetrain", "80%")}
    for row in rows:
        assert row["model"] == "small_cnn" and "error" not in row, row
        assert row["real_peak_bytes"] > row["state_bytes"] > 0
        assert row["time_ratio"] > 0 and len(row["steps_s"]) == 2
        assert len(row["loadavg_1min_before_after"]) == 2
    assert by[("eager", "-")]["time_ratio"] == 1.0
    for budget in ("100%", "80%"):
        plan = by[("edgetrain", budget)]
        assert plan["ledger_peak_bytes"] == plan["predicted_peak_bytes"]  # the ledger counts what was predicted
        assert plan["real_peak_bytes"] <= plan["budget_bytes"] and plan["within_budget"]
        # the measuring malloc's page per mapped block, counted beside the plan's bytes, on one CPU
        assert 0 <= plan["page_rounding_bytes"] < 64 * 4096 and plan["cpu_pinned"] is not None
    assert "page_rounding_bytes" not in by[("checkpoint", "per block")]
    assert by[("edgetrain", "80%")]["budget_bytes"] < by[("edgetrain", "100%")]["budget_bytes"]
    assert by[("eager", "-")]["real_peak_bytes"] >= by[("edgetrain", "80%")]["real_peak_bytes"]

    figures = tmp_path / "figures"
    assert main(["--table", str(out), "--figures", str(figures)]) == 0
    shown = capsys.readouterr().out
    for method in ("eager", "checkpoint", "edgetrain"):
        assert method in shown
    assert (figures / "peers_small_cnn.png").stat().st_size > 0
    assert (figures / "peers_small_cnn.svg").stat().st_size > 0


@pytest.mark.skipif(not cpu_probe_available(), reason="needs Linux's resettable resident-set high-water mark")
def test_without_paired_timing_each_memory_process_times_its_own_steps(tmp_path, capsys):
    out = tmp_path / "peers.json"
    r = _run("--models", "small_cnn", "--methods", "edgetrain:100%", "--steps", "0", "--mem-steps", "3",
             "--target", "rpi4", "--optimizer", "adamw", "--time-limit", "10", "--json", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(out.read_text())
    for row in rows:
        assert len(row["mem_steps_s"]) == 3 and row["timing"] == "sequential" and "steps_s" not in row
        assert row["time_ratio"] == row["step_s"] / row["eager_step_s"] > 0
    plan = rows[1]
    assert plan["ledger_peak_bytes"] == plan["predicted_peak_bytes"] and plan["within_budget"]
    assert main(["--table", str(out)]) == 0
    assert "one after another" in capsys.readouterr().out
    assert main(["--models", "small_cnn", "--optimizer", "lion"]) == 2
    assert "unknown --optimizer 'lion'" in capsys.readouterr().err


def test_bad_method_is_one_line_naming_the_choices(capsys):
    assert main(["--models", "small_cnn", "--methods", "eager,jit"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'jit'" in err and "edgetrain" in err


def test_unknown_model_is_refused_before_any_run(capsys, tmp_path):
    out = tmp_path / "peers.json"
    assert main(["--models", "no_such_model", "--methods", "eager", "--json", str(out)]) == 2
    assert "no_such_model" in capsys.readouterr().err and not out.exists()


def test_methods_expand_to_their_settings_with_eager_first():
    assert parse_methods("compile,edgetrain:min") == [("eager", "-"), ("compile", "1.0"), ("compile", "0.5"),
                                                      ("compile", "0.3"), ("compile", "0.1"), ("edgetrain", "min")]
    with pytest.raises(Exception, match=r"fraction in \[0, 1\]"):
        parse_methods("compile:2")


def test_pareto_front_keeps_what_nothing_beats_on_both():
    pts = [{"real_peak_bytes": m, "time_ratio": t, "n": n}
           for n, (m, t) in enumerate([(100, 1.0), (60, 1.2), (70, 1.5), (40, 2.0), (40, 2.5)])]
    assert [p["n"] for p in pareto(pts)] == [0, 1, 3]


def test_a_row_over_its_budget_says_by_how_much_beside_the_page_rounding():
    assert _over_note({"within_budget": True}) == ""
    row = {"within_budget": False, "real_peak_bytes": 101_021_952, "budget_bytes": 100_925_188,
           "page_rounding_bytes": 180_224}
    assert _over_note(row) == "over budget by 97 KB (page rounding 180 KB)"
    assert _over_note({**row, "page_rounding_bytes": None}) == "over budget by 97 KB"
