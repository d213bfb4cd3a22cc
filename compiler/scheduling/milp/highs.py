"""HiGHS adapter (highspy): the default solver. MIT licensed, proves optimality, accepts a warm start."""
from __future__ import annotations

import contextlib
import os
import sys
import time

import highspy
import numpy as np

from ..clock import clamp
from .model import SolveResult, SparseMILP, merge_terms, objective_scale


@contextlib.contextmanager
def _quiet_stdout():
    """HiGHS prints a banner on the C stdout when created; keep stdout clean for `--json`."""
    sys.stdout.flush()
    saved = os.dup(1)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 1)
    try:
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def _highs(threads: int | None, time_limit: float) -> highspy.Highs:
    with _quiet_stdout():
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit))
    # HiGHS keeps one global thread scheduler per process; a solve asking for another thread count than the
    # first one would not run at all (status "not set") unless the scheduler is rebuilt. Rebuilt every time, so
    # that a solve never depends on what an earlier one in the process asked for (a compile after a threads=1
    # solve proved a different bound than the same compile in a fresh process).
    highspy.Highs.resetGlobalScheduler(True)
    if threads:
        h.setOptionValue("threads", int(threads))
    return h


def _lp(m: SparseMILP, scale: float, integer: bool) -> highspy.HighsLp:
    """`m` as a HiGHS model, its objective scaled by `scale` (see objective_scale: solver tolerances). The
    constant (every node computed once) stays in the objective: the relative gap HiGHS stops at is then the
    gap of the whole energy, as reported."""
    lp = highspy.HighsLp()
    lp.num_col_ = m.n_vars
    lp.num_row_ = m.n_rows
    lp.col_cost_ = np.asarray(m.cost, dtype=np.float64) * scale
    lp.offset_ = m.offset * scale
    lp.col_lower_ = np.asarray(m.lower, dtype=np.float64)
    lp.col_upper_ = np.asarray(m.upper, dtype=np.float64)
    lp.row_lower_ = np.asarray(m.rows_lo, dtype=np.float64)
    lp.row_upper_ = np.asarray(m.rows_hi, dtype=np.float64)
    start, index, value = m.csc()
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = start
    lp.a_matrix_.index_ = index
    lp.a_matrix_.value_ = value
    if integer:
        lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
                           for i in m.integer]
    return lp


def solve(m: SparseMILP, *, time_limit: float = 60.0, mip_gap: float = 1e-4, warm_start: np.ndarray | None = None,
          threads: int | None = None, solutions: int | None = None) -> SolveResult:
    """`solutions`: stop after that many improving schedules (a rule that, unlike a time limit, does not depend on
    the machine's speed)."""
    time_limit = clamp(time_limit)  # sub-solves call here directly: within the compile's --time-limit too
    h = _highs(threads, time_limit)
    if solutions:
        h.setOptionValue("mip_max_improving_sols", int(solutions))
    h.setOptionValue("mip_rel_gap", float(mip_gap))
    h.setOptionValue("mip_abs_gap", 0.0)  # energies can be ~1e-6 J: an absolute gap would hide a relative one
    scale = objective_scale(np.asarray(m.cost, dtype=np.float64))
    h.passModel(_lp(m, scale, integer=True))
    if warm_start is not None:
        sol = highspy.HighsSolution()
        sol.col_value = list(map(float, warm_start))
        sol.value_valid = True
        h.setSolution(sol)
    t0 = time.perf_counter()
    h.run()
    seconds = time.perf_counter() - t0
    status = h.getModelStatus()
    info = h.getInfo()
    S = highspy.HighsModelStatus
    has_solution = info.primal_solution_status == 2  # kSolutionStatusFeasible
    values = np.asarray(h.getSolution().col_value) if has_solution else None
    if status == S.kOptimal:
        name = "optimal"
    elif status == S.kInfeasible:
        name = "infeasible"
    elif status in (S.kTimeLimit, S.kIterationLimit, S.kSolutionLimit, S.kInterrupt):
        name = "time_limit"
    else:
        name = "error"
    objective = m.objective(values) if values is not None else None
    bound = info.mip_dual_bound / scale if np.isfinite(info.mip_dual_bound) else None
    if name == "optimal" and objective is not None and not any(m.integer):
        bound = objective  # an LP (a relaxation solved through the interface): its optimum is its bound
    claimed = info.objective_function_value / scale
    if (warm_start is not None and objective is not None
            and abs(objective - claimed) > 1e-9 * max(abs(objective), abs(claimed), 1e-300)):
        # Seen with highspy 1.16: warm-started, HiGHS can report the optimum's objective and bound but hand
        # back the warm start's values. Solve again from scratch with the time left, and keep the better.
        left = time_limit - seconds
        if left > 0.05:
            cold = solve(m, time_limit=left, mip_gap=mip_gap, warm_start=None, threads=threads)
            cold.seconds += seconds
            if cold.values is not None and cold.objective <= objective:
                return cold
    gap = None
    if objective is not None and bound is not None:
        gap = max(0.0, (objective - bound) / max(abs(objective), 1e-12))
    if name == "optimal" and (gap is None or gap > mip_gap * (1 + 1e-6) + 1e-12):
        name = "feasible"  # the solver claimed optimality, but the values it returned do not prove it
    return SolveResult(solver="highs", status=name, values=values, objective=objective, bound=bound, gap=gap,
                       seconds=seconds, variables=m.n_vars, constraints=m.n_rows, binaries=sum(m.integer))


class LpSession:
    """The LP relaxation of `m` kept in one HiGHS instance, so that rows can be added and the LP re-solved, as a
    cutting-plane loop needs. Each re-solve after added rows starts from scratch (`cold`, the default): with
    thousands of violated rows, dual simplex from the previous basis is slower than a cold solve with presolve."""

    def __init__(self, m: SparseMILP, threads: int | None = None, cold: bool = True):
        self.cold = cold
        self.h = _highs(threads, 60.0)
        self.scale = objective_scale(np.asarray(m.cost, dtype=np.float64))
        self.h.passModel(_lp(m, self.scale, integer=False))

    def solve(self, time_limit: float) -> tuple[float, np.ndarray] | None:
        """(objective, values) of the LP optimum, or None when it was not reached in time."""
        # HiGHS's time limit is on the instance's clock, which adds up every run: give this run `time_limit` more
        # (else a late round stops at once when the earlier runs used up the limit).
        self.h.setOptionValue("time_limit", self.h.getRunTime() + float(max(time_limit, 0.01)))
        self.h.run()
        if self.h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return None
        x = np.asarray(self.h.getSolution().col_value)
        return self.h.getInfo().objective_function_value / self.scale, x

    def add_rows(self, rows: list[list[tuple[int, float]]], hi: float = 0.0) -> None:
        """Add `rows` (each terms <= hi). A row naming a variable twice is merged first: HiGHS rejects it."""
        starts, index, value = [], [], []
        for terms in map(merge_terms, rows):
            starts.append(len(index))
            index += [j for j, _ in terms]
            value += [v for _, v in terms]
        n = len(rows)
        status = self.h.addRows(n, np.full(n, -highspy.kHighsInf), np.full(n, hi), len(index),
                                np.asarray(starts, dtype=np.int32), np.asarray(index, dtype=np.int32),
                                np.asarray(value, dtype=np.float64))
        if status == highspy.HighsStatus.kError:
            raise RuntimeError(f"HiGHS refused {n} cut rows")
        if self.cold:
            self.h.clearSolver()
