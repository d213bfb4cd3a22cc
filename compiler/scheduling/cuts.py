"""Window cuts: valid inequalities that close most of the POET MILP's LP gap at tight budgets.

The LP relaxation's favourite trick at tight budgets is a staircase: recompute a ReLU output 2% at each of 49
stages, supported by its input held at 2% throughout, so that the output's memory ramps up instead of stepping,
and the input costs 2% of its size instead of the decreasing ramp a mix of integer schedules would need. The same
with paging: page-ins summing to 1 over the window behind a page-out of 0.02. The per-stage rows (a recompute
needs its inputs resident *at that stage*) cannot see it; an inequality over a window of stages can:

    c resident at stage e, not resident entering stage u  =>  c was paged in or recomputed in [u, e];
    paged in                         =>  PO_c = 1                     (else: the page-ins in [u, e])
    recomputed at some v in [u, e]   =>  an input j resident at v     (else: the recomputes in [u, e])
    j resident somewhere in [u, e]   =>  j held at u, or paged in in (u, e] (PO_j), or recomputed in (u, e]
                                          (then one of j's inputs resident in (u, e], and so on)

which is linear once each "or" picks one alternative:

    held_c(e) - S_c(u) <= min(sum P_c[u..e], PO_c) + min(sum R_c[u..e], AV_j(u, e))
    AV_j(u, e) = held_j(u) + min(sum P_j(u..e], PO_j) + min(sum R_j(u..e], AV_k(u, e))

Valid for every schedule in which no tensor is held twice at once (a recompute or page-in of a resident tensor
only adds cost and memory, so an optimal schedule exists among them): the bound stays a lower bound on the
optimum. There are O(T^2) such rows per tensor, so they are separated: solve the LP, add the most violated
rows, repeat.

Memory cuts (separate_memory) close another trick of the LP at the smallest budgets: recompute a whole chain
(input, conv1, bn1, relu, ... twelve tensors) 30% at one stage, where the chain at 100% would not fit in that
stage's memory. If c is recomputed at t, each input is resident at t; an input that is not recomputed there
is held or paged in; so for a chain c <- n_1 <- ... <- n_k (each an input of the one before) whose members,
if all were recomputed at t, would need more memory than the stage has (with every input of each, and what
stage t reads):

    R_c(t) <= sum over m = 1..k of (S_{n_m}(t) + P_{n_m}(t))

Valid for every schedule (the memory row of stage t says so), so they need no assumption.

What each family lifts, measured: docs/solver.md.
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, replace

import numpy as np

from edgetrain.compiler.graph.liveness import Liveness
from .milp.model import merge_terms
from .milp.registry import Solver
from .poet import PoetModel


@dataclass
class CutReport:
    rounds: int
    cuts: int
    lp_before: float | None  # LP relaxation's objective, before and after the cuts
    lp_after: float | None
    seconds: float
    took_then: bool = False  # the LP was too slow for a solve after the cuts: the rounds took that time too
    memory: int = 0  # how many of `cuts` are memory cuts (the rest are window cuts)

    def to_json(self) -> dict:
        return {"rounds": self.rounds, "cuts": self.cuts, "memory": self.memory, "lp_before": self.lp_before,
                "lp_after": self.lp_after, "seconds": round(self.seconds, 3), "took_then": self.took_then}


class _Tensor:
    """One decision tensor's variables and LP values on the absolute backward stages [B0, T)."""

    def __init__(self, pm: PoetModel, lv: Liveness, x: np.ndarray, name: str):
        n = lv.T - lv.B0
        self.Sv = np.full(n, -1)
        self.Rv = np.full(n, -1)
        self.Pv = np.full(n, -1)
        for k in range(lv.window_end[name] - lv.B0 + 1):
            t = lv.B0 + k
            self.Sv[k] = pm.entering(t, name, lv.B0)
            self.Rv[k] = pm.R.get((t, name), -1)
            self.Pv[k] = pm.P.get((t, name), -1)
        val = lambda v: np.where(v >= 0, x[np.maximum(v, 0)], 0.0)  # noqa: E731
        self.S, self.R, self.P = val(self.Sv), val(self.Rv), val(self.Pv)
        self.held = self.S + self.R + self.P
        self.POv = pm.PO.get(name, -1)
        self.PO = float(x[self.POv]) if self.POv >= 0 else 0.0
        self.cR = np.concatenate([[0.0], np.cumsum(self.R)])
        self.cP = np.concatenate([[0.0], np.cumsum(self.P)])
        self.has_R = bool((self.Rv >= 0).any())


def _after(c: np.ndarray, U: np.ndarray, E: np.ndarray) -> np.ndarray:
    """sum over stages (u, e] from a cumulative sum (0 where e <= u)."""
    return np.maximum(c[E + 1] - c[U + 1], 0.0)


def _options(a: _Tensor, inputs: list[str], sumP: np.ndarray, sumR: np.ndarray,
             prev: dict | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The cheapest way, per (u, e), to say "a was paged in" (its page-ins, or PO) plus "a was recomputed" (its
    recomputes, or an input available, from `prev`): (value, PO chosen, input index chosen or -1)."""
    choose_po = a.PO < sumP
    r_term = sumR
    choice = np.full(sumR.shape, -1)
    if prev is not None and a.has_R:
        for k_index, k in enumerate(inputs):
            v = prev[k][0]
            better = v < r_term
            r_term = np.where(better, v, r_term)
            choice = np.where(better, k_index, choice)
    return np.where(choose_po, a.PO, sumP) + r_term, choose_po, choice


def separate(pm: PoetModel, lv: Liveness, x: np.ndarray, *, depth: int = 3, tol: float = 1e-3,
             per_tensor: int = 20) -> list[list[tuple[int, float]]]:
    """The most violated window cuts at the LP point `x`, each as terms of a row `<= 0`."""
    n = lv.T - lv.B0
    U, E = np.arange(n)[:, None], np.arange(n)[None, :]
    ts = {c: _Tensor(pm, lv, x, c) for c in lv.decision}
    # AV[d][j]: "j available somewhere in [u, e]" at recursion depth d, as _options returns it (plus held at u).
    AV: list[dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]] = []
    for d in range(depth):
        level = {}
        for j, a in ts.items():
            value, choose_po, choice = _options(a, lv.inputs_of[j], _after(a.cP, U, E), _after(a.cR, U, E),
                                                AV[d - 1] if d > 0 else None)
            level[j] = (a.held[:, None] + value, choose_po, choice)
        AV.append(level)

    def obtained(c: str, choose_po, choice, first: int, u: int, e: int, d: int) -> list[tuple[int, float]]:
        """Terms (negated) of "c paged in or recomputed in [first, e]" as chosen at (u, e)."""
        a = ts[c]
        terms = [(a.POv, -1.0)] if choose_po[u, e] else [(int(v), -1.0) for v in a.Pv[first:e + 1] if v >= 0]
        if choice[u, e] < 0:
            terms += [(int(v), -1.0) for v in a.Rv[first:e + 1] if v >= 0]
        else:
            j = lv.inputs_of[c][choice[u, e]]
            b = ts[j]
            terms += [(int(v), -1.0) for v in (b.Sv[u], b.Rv[u], b.Pv[u]) if v >= 0]
            terms += obtained(j, AV[d][j][1], AV[d][j][2], u + 1, u, e, d - 1)
        return terms

    cuts = []
    for c, a in ts.items():
        # [u, e] inclusive here: S_c(u) says only what is held entering u.
        value, choose_po, choice = _options(a, lv.inputs_of[c], a.cP[E + 1] - a.cP[U], a.cR[E + 1] - a.cR[U],
                                            AV[depth - 1])
        viol = np.where(E >= U, a.held[None, :] - a.S[:, None] - value, -np.inf)
        idx = np.argwhere(viol > tol)
        for u, e in idx[np.argsort(-viol[idx[:, 0], idx[:, 1]], kind="stable")[:per_tensor]]:
            terms = [(int(v), 1.0) for v in (a.Sv[e], a.Rv[e], a.Pv[e]) if v >= 0]
            terms.append((int(a.Sv[u]), -1.0))
            cuts.append(terms + obtained(c, choose_po, choice, u, u, e, depth - 1))
    return cuts


def separate_memory(pm: PoetModel, lv: Liveness, x: np.ndarray, *, tol: float = 1e-3, depth: int = 10,
                    expansions: int = 500, per_stage: int = 50) -> list[list[tuple[int, float]]]:
    """The most violated memory cuts at the LP point `x` (module docstring), each as terms of a row `<= 0`.
    Chains are searched depth-first from each recompute with a positive value, at most `expansions` steps each."""
    recomputed = defaultdict(list)
    for (t, c), r in pm.R.items():
        if x[r] > tol:
            recomputed[t].append((c, r))
    cuts = []
    for t, items in recomputed.items():
        live = {i for i in lv.decision if t <= lv.window_end[i]}

        def held_not_recomputed(i: str) -> list[int]:
            v = (pm.entering(t, i, lv.B0), pm.P.get((t, i)))
            return [j for j in v if j is not None]

        found = []
        for c, r in items:
            best = None
            stack = [(c, frozenset(lv.needs[t]) | {c} | set(lv.inputs_of[c]), (), 0.0, 0)]
            steps = 0
            while stack and steps < expansions:
                steps += 1
                n, resident, terms, value, d = stack.pop()
                if value >= x[r] - tol:
                    continue  # no cut along this chain is violated
                if sum(lv.size[i] for i in resident if i in live) > pm.free[t]:
                    if best is None or value < best[1]:
                        best = (terms, value)
                    continue
                if d < depth:
                    for j in lv.inputs_of[n]:
                        if j in live and (t, j) in pm.R:
                            alt = held_not_recomputed(j)
                            stack.append((j, resident | set(lv.inputs_of[j]), terms + tuple(alt),
                                          value + float(sum(x[v] for v in alt)), d + 1))
            if best is not None and x[r] > best[1] + tol:
                found.append((x[r] - best[1], [(r, 1.0)] + [(v, -1.0) for v in best[0]]))
        found.sort(key=lambda f: -f[0])
        cuts += [terms for _, terms in found[:per_stage]]
    return cuts


def strengthen(pm: PoetModel, lv: Liveness, *, seconds: float, then: float = 0.0, max_rounds: int = 40,
               threads: int | None = None, warm_start: np.ndarray | None = None,
               memory_cuts: bool = True, solver: Solver | str = "auto") -> tuple[PoetModel, CutReport]:
    """Rounds of LP solve + separation for at most `seconds`; returns the model with the cuts added (a new
    SparseMILP, the input is left as it is). A cut the warm start violates is left out, so the warm start
    (a feasible schedule, maybe with a redundant recompute) stays usable. `memory_cuts=False` separates window
    cuts only (to measure what each family buys: benchmarks/relaxation.py).

    `then`: the seconds the caller has after this for a solve on the model with the cuts. When 8 times the plain
    LP does not fit in `then`, that solve could not finish its root with the cuts (a MILP root re-solves its LP
    many times), so the rounds may take that time too: each round's LP is a proven bound, and the report says so
    (`took_then`). Each re-solve starts cold (HiGHS's LpSession; other solvers solve each LP anew). No re-solve starts with less than 3 times the previous
    one's time left: the caller gets that time back."""
    t0 = time.perf_counter()
    lp = Solver.of(solver).lp(pm.milp, threads=threads)
    added: list[list[tuple[int, float]]] = []
    seen: set[tuple] = set()
    first = last = None
    stalled = rounds = memory = 0
    took_then = False
    lp_seconds = 0.0  # the last LP solve's
    while rounds < max_rounds:
        left = seconds - (time.perf_counter() - t0)
        if left <= 0.05 or left < 3 * lp_seconds:
            break  # a re-solve takes up to 2.3 times the previous one: it might not finish, leave the time
        started = time.perf_counter()
        r = lp.solve(left)
        lp_seconds = time.perf_counter() - started
        if r is None:
            break
        objective, x = r
        rounds += 1
        if first is None:
            first = objective
            if then > 0 and 8 * lp_seconds > then:
                seconds, took_then = seconds + then, True
        # Stop when two rounds in a row moved the bound by less than 0.1% of what it adds over the constant.
        if last is not None and objective - last <= 1e-3 * max(abs(objective - pm.milp.offset), 1e-12):
            stalled += 1
            if stalled >= 2:
                last = max(last, objective)
                break
        else:
            stalled = 0
        last = objective if last is None else max(last, objective)
        new = []
        found = [(t, False) for t in separate(pm, lv, x)]
        if memory_cuts:
            found += [(t, True) for t in separate_memory(pm, lv, x)]
        for terms, is_memory in found:
            terms = merge_terms(terms)
            key = tuple(sorted(terms))
            if key in seen:
                continue
            seen.add(key)
            if warm_start is None or sum(v * warm_start[j] for j, v in terms) <= 1e-9:
                new.append(terms)
                memory += is_memory
        if not new:
            break
        added += new
        lp.add_rows(new)
    report = CutReport(rounds=rounds, cuts=len(added), lp_before=first, lp_after=last,
                       seconds=time.perf_counter() - t0, took_then=took_then, memory=memory)
    return replace(pm, milp=pm.milp.with_rows(added, hi=0.0)), report
