"""Ctrl-C during a compile (compiler/scheduling/interrupt.py): real SIGINTs, real solvers, real processes.

In the solve, the first Ctrl-C stops it within a second and the compile goes on with the best schedule found; a
second one aborts. Outside the solve (tracing) it aborts: exit 130, no traceback, the previous output untouched.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from edgetrain.compiler.scheduling import clock, interrupt
from edgetrain.compiler.scheduling.milp.model import SparseMILP
from edgetrain.compiler.scheduling.milp.registry import available, solve_with
from edgetrain.compiler.workbench.cli import main

ROOT = Path(__file__).resolve().parents[1]
STOP_S = 1.0  # a solve ends this soon after Ctrl-C (interrupt.GRACE_S and the poll, with room for a loaded machine)


def _keys_heard() -> None:
    """In the child: Ctrl-C as a terminal delivers it. A test runner's worker may ignore SIGINT, and a child
    inherits that (Python then installs no KeyboardInterrupt handler), as a shell's background job does."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def knapsack(n: int = 60, k: int = 8, seed: int = 0) -> SparseMILP:
    """A multi-dimensional knapsack that none of the solvers proves optimal within a minute on 2 cores (HiGHS,
    CP-SAT and Gurobi each stop at a gap near 1% after 30 s), yet each finds schedules within a second."""
    rng = np.random.default_rng(seed)
    w = rng.integers(10, 1000, size=(k, n))
    profit = w.mean(0) + rng.integers(0, 100, size=n)
    m = SparseMILP()
    for j in range(n):
        m.add_var(f"x{j}", cost=-float(profit[j]))
    for i in range(k):
        m.add_row([(j, float(w[i, j])) for j in range(n)], hi=float(w[i].sum() // 2))
    return m


@pytest.fixture
def python_sigint():
    """Python's own SIGINT handler, as the `edgetrain` command runs with (a test runner may have set another)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)
    interrupt.settle()  # a solver left running after its stop ends before the next test solves


class CtrlC:
    """SIGINT to this process, `times` times, the first `after` seconds from now (`sent`: when). Leave the
    stoppable region only after `wait()`: a signal arriving outside it would stop the test run."""

    def __init__(self, after: float, times: int = 1, gap: float = 0.2) -> None:
        self.sent: list[float] = []
        self.thread = threading.Thread(target=self._fire, args=(after, times, gap), daemon=True)
        self.thread.start()

    def _fire(self, after: float, times: int, gap: float) -> None:
        time.sleep(after)
        for k in range(times):
            if k:
                time.sleep(gap)
            self.sent.append(time.perf_counter())
            os.kill(os.getpid(), signal.SIGINT)

    def wait(self) -> None:
        self.thread.join()


@pytest.mark.parametrize("solver", ["highs", "cpsat", "gurobi", "scipy"])
def test_ctrl_c_stops_a_solve_within_a_second(solver, python_sigint):
    if not available(solver)[0]:
        pytest.skip(available(solver)[1])
    m = knapsack()
    # scipy's milp cannot be asked to stop: it is left running, so it gets a short limit to end soon after.
    limit = 3.0 if solver == "scipy" else 30.0
    with clock.deadline(60), interrupt.stoppable():
        key = CtrlC(after=1.0)
        r = solve_with(solver, m, time_limit=limit, mip_gap=1e-9)
        ended = time.perf_counter()
        key.wait()
        after = solve_with(solver, m, time_limit=limit, mip_gap=1e-9)  # no solve starts once stopped
    assert ended > key.sent[0], f"the {solver} solve ended before Ctrl-C ({r.status}): the test proves nothing"
    assert r.status == "interrupted", r
    assert ended - key.sent[0] <= STOP_S, f"{solver} took {ended - key.sent[0]:.2f} s to stop"
    if solver == "scipy":
        assert r.values is None  # its schedule stays inside scipy
    else:
        assert r.values is not None and m.is_feasible(r.values) and r.objective == pytest.approx(m.objective(r.values))
    assert after.status == "interrupted" and after.values is None and after.seconds == 0.0


def test_a_second_ctrl_c_aborts_at_once(python_sigint):
    """The first stops the solve and the compile goes on (here: waits); the second raises KeyboardInterrupt."""
    with clock.deadline(60), interrupt.stoppable():
        key = CtrlC(after=1.0, times=2, gap=1.0)
        r = solve_with("highs", knapsack(), time_limit=30, mip_gap=1e-9)
        assert r.status == "interrupted" and len(key.sent) == 1
        with pytest.raises(KeyboardInterrupt):
            time.sleep(30)
        ended = time.perf_counter()
        key.wait()
    assert len(key.sent) == 2 and ended - key.sent[1] <= 0.5


def _lines_until(stream, word: str, seen: list[str]) -> bool:
    """Read `stream` line by line into `seen` until a line holds `word` (True) or it ends (False)."""
    for line in stream:
        seen.append(line)
        if word in line:
            return True
    return False


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_ctrl_c_in_the_solve_keeps_the_best_schedule(tmp_path):
    """MobileNetV2 at its smallest budget: HiGHS proves no bound within half a minute here, so Ctrl-C lands in the
    solve. It stops within a second; the plan is written from the best schedule found and runs exactly."""
    out = tmp_path / "mbv2"
    cmd = [sys.executable, "-m", "edgetrain.compiler.workbench.cli", "compile", "mobilenetv2", "--target", "rpi4",
           "--budget", "min", "--time-limit", "60", "--out", str(out), "--json"]
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=_keys_heard)
    seen: list[str] = []
    try:
        assert _lines_until(p.stderr, "MILP:", seen), "".join(seen)  # progress lines reach a pipe too
        began = time.perf_counter()
        time.sleep(1.5)  # into HiGHS's search (its presolve and root), not before it starts
        sent = time.perf_counter()
        p.send_signal(signal.SIGINT)
        stdout, stderr = p.communicate(timeout=60)
    finally:
        p.kill()
    ended = time.perf_counter()
    stderr = "".join(seen) + stderr
    assert re.search(r"solving \d+ stages", stderr) and "Traceback" not in stderr, stderr
    assert ended - sent <= 5.0, f"exited {ended - sent:.1f} s after Ctrl-C"  # the plan's files written in that time
    r = json.loads(stdout)
    if p.returncode == 130:  # no schedule within the budget found by then: said so, nothing written
        assert r["error"]["kind"] == "Interrupted" and "before it found a schedule" in r["error"]["message"], r
        assert not out.exists()
        return
    assert p.returncode == 0, stderr
    assert r["interrupted"] is True and r["solver"]["status"] == "interrupted", r["solver"]
    assert r["solver"]["seconds"] <= sent - began + STOP_S, r["solver"]  # HiGHS stopped within a second
    assert r["peak_bytes"] <= r["budget_bytes"]
    body = json.loads((out / "schedule.json").read_text())
    assert body["solver"]["status"] == "interrupted"
    run = subprocess.run([sys.executable, "-m", "edgetrain.compiler.workbench.cli", "run", str(out), "--steps", "1",
                          "--check", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    checked = json.loads(run.stdout)
    assert checked["checked"] and checked["mismatched"] == [] and checked["measured_peak_bytes"] <= r["budget_bytes"]


def test_ctrl_c_while_tracing_leaves_the_previous_output(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["compile", "small_cnn", "--target", "rpi4", "--budget", "100%", "--scheduler", "store-all",
                 "--batch-size", "2", "--out", str(out), "--json"]) == 0
    capsys.readouterr()
    before = _tree(out)
    cmd = [sys.executable, "-m", "edgetrain.compiler.workbench.cli", "compile", "resnet18", "--target", "rpi4",
           "--budget", "100%", "--out", str(out), "--json"]
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=_keys_heard)
    seen: list[str] = []
    try:
        assert _lines_until(p.stderr, "tracing resnet18", seen), "".join(seen)  # its capture takes seconds
        p.send_signal(signal.SIGINT)
        stdout, stderr = p.communicate(timeout=60)
    finally:
        p.kill()
    stderr = "".join(seen) + stderr
    assert p.returncode == 130, stderr
    assert "Traceback" not in stderr and "solving" not in stderr, stderr
    message = f"interrupted (Ctrl-C): nothing was written, {out} is as it was"
    assert stderr.splitlines()[-1] == f"edgetrain compile: error: {message}"
    assert json.loads(stdout) == {"ok": False, "error": {"kind": "Interrupted", "message": message}}
    assert _tree(out) == before
    assert not [x.name for x in tmp_path.iterdir() if "edgetrain-tmp" in x.name]  # its staging folder discarded


def test_ctrl_c_before_any_schedule_fits_exits_130(tmp_path, capsys, monkeypatch, python_sigint):
    """Checkmate (no paging) at 74% of small_cnn's store-all peak: no recompute-only heuristic fits, only the MILP's
    schedules do. Ctrl-C as the solve starts: nothing to keep, so exit 130 and the previous output stays whole."""
    from edgetrain.compiler.workbench import cli

    out = tmp_path / "o"
    assert main(["compile", "small_cnn", "--target", "rpi4", "--budget", "100%", "--scheduler", "store-all",
                 "--out", str(out), "--json"]) == 0
    before = _tree(out)
    capsys.readouterr()

    def line_then_ctrl_c(message: str) -> None:
        print(message, file=sys.stderr)
        if message.startswith("MILP:"):
            os.kill(os.getpid(), signal.SIGINT)  # the key pressed as the solve starts

    monkeypatch.setattr(cli, "_progress_line", line_then_ctrl_c)
    rc = main(["compile", "small_cnn", "--target", "rpi4", "--budget", "74%", "--scheduler", "checkmate",
               "--out", str(out), "--json"])
    got = capsys.readouterr()
    assert rc == 130, got.err
    error = json.loads(got.out)["error"]
    assert error["kind"] == "Interrupted" and "Traceback" not in got.err
    assert "before it found a schedule within" in error["message"]
    assert error["message"].endswith(f"nothing was written, {out} is as it was")
    assert _tree(out) == before
