"""HiGHS adapter (highspy): the default solver. MIT licensed, proves optimality, accepts a warm start."""
from __future__ import annotations

import threading
import time

import highspy
import numpy as np

from .. import interrupt
from ..clock import clamp, stopped
from .quiet import quiet_stdout
from .model import SolveResult, SparseMILP, merge_terms, objective_scale


def _highs(threads: int | None, time_limit: float) -> highspy.Highs:
    interrupt.settle()  # a solve left running after a stop shares the global scheduler reset below
    with quiet_stdout():  # HiGHS prints a banner on the C stdout when created
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


class _Watch:
    """What HiGHS's callbacks hand over while it runs (its improving schedules, its bound), and the stop they pass
    on: a stopped solve that HiGHS does not end within interrupt.GRACE_S returns this instead of HiGHS's own
    answer (HiGHS checks the callback between nodes, not inside its root LP or primal heuristics)."""

    def __init__(self, h: highspy.Highs, scale: float) -> None:
        self.asked = threading.Event()
        self.values: np.ndarray | None = None
        self.bound = -np.inf  # scaled, as HiGHS reports it
        self.scale = scale
        for kind in (h.cbMipInterrupt, h.cbSimplexInterrupt, h.cbIpmInterrupt):
            kind.subscribe(self._check)
        h.cbMipImprovingSolution.subscribe(self._improved)

    def _check(self, e) -> None:
        if e.callback_type == highspy.cb.HighsCallbackType.kCallbackMipInterrupt:
            self.bound = max(self.bound, e.data_out.mip_dual_bound)
        if self.asked.is_set():
            e.interrupt()

    def _improved(self, e) -> None:
        self.values = np.array(e.data_out.mip_solution, dtype=np.float64)
        self.bound = max(self.bound, e.data_out.mip_dual_bound)


def _run(h: highspy.Highs, watch: _Watch) -> bool:
    """h.run(), stopped on Ctrl-C (interrupt.py); False when HiGHS was left running (then `watch` holds its
    last schedule and bound)."""
    if stopped():
        return False
    done, _ = interrupt.run(h.run, watch.asked.set)
    return done


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
    watch = _Watch(h, scale)
    if not _run(h, watch):
        return _left(m, watch, time.perf_counter() - t0)
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
    elif status == S.kInterrupt:
        name = "interrupted"  # Ctrl-C (HiGHS is interrupted by nothing else here)
    elif status in (S.kTimeLimit, S.kIterationLimit, S.kSolutionLimit):
        name = "time_limit"
    else:
        name = "error"
    objective = m.objective(values) if values is not None else None
    bound = info.mip_dual_bound / scale if np.isfinite(info.mip_dual_bound) else None
    if name == "optimal" and objective is not None and not any(m.integer):
        bound = objective  # an LP (a relaxation solved through the interface): its optimum is its bound
    claimed = info.objective_function_value / scale
    if (warm_start is not None and objective is not None and not stopped()
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


def _left(m: SparseMILP, watch: _Watch, seconds: float) -> SolveResult:
    """A stopped solve that HiGHS did not end in time (or that never started): its last schedule, if any."""
    values = watch.values if watch.values is not None and m.is_feasible(watch.values) else None
    objective = m.objective(values) if values is not None else None
    bound = watch.bound / watch.scale if np.isfinite(watch.bound) else None
    gap = None
    if objective is not None and bound is not None:
        gap = max(0.0, (objective - bound) / max(abs(objective), 1e-12))
    return SolveResult(solver="highs", status="interrupted", values=values, objective=objective, bound=bound,
                       gap=gap, seconds=seconds, variables=m.n_vars, constraints=m.n_rows, binaries=sum(m.integer))


class LpSession:
    """The LP relaxation of `m` kept in one HiGHS instance, so that rows can be added and the LP re-solved, as a
    cutting-plane loop needs. Each re-solve after added rows starts from scratch (`cold`, the default): with
    thousands of violated rows, dual simplex from the previous basis is slower than a cold solve with presolve."""

    def __init__(self, m: SparseMILP, threads: int | None = None, cold: bool = True):
        self.cold = cold
        self.h = _highs(threads, 60.0)
        self.scale = objective_scale(np.asarray(m.cost, dtype=np.float64))
        self.h.passModel(_lp(m, self.scale, integer=False))
        self.watch = _Watch(self.h, self.scale)

    def solve(self, time_limit: float) -> tuple[float, np.ndarray] | None:
        """(objective, values) of the LP optimum, or None when it was not reached in time."""
        # HiGHS's time limit is on the instance's clock, which adds up every run: give this run `time_limit` more
        # (else a late round stops at once when the earlier runs used up the limit).
        self.h.setOptionValue("time_limit", self.h.getRunTime() + float(max(time_limit, 0.01)))
        if self.h is None or not _run(self.h, self.watch):
            self.h = None  # left running: not to be touched again (a stopped compile solves nothing more)
            return None
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
        if self.h is None:
            return  # left running after a stop
        status = self.h.addRows(n, np.full(n, -highspy.kHighsInf), np.full(n, hi), len(index),
                                np.asarray(starts, dtype=np.int32), np.asarray(index, dtype=np.int32),
                                np.asarray(value, dtype=np.float64))
        if status == highspy.HighsStatus.kError:
            raise RuntimeError(f"HiGHS refused {n} cut rows")
        if self.cold:
            self.h.clearSolver()
