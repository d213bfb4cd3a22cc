"""The POET MILP: recompute, keep, page out and page in every decision tensor, minimizing energy.

Unlike the reference formulation (5T^2 + T|E| binaries over all stages and nodes), variables exist only
where a choice exists: a decision tensor i has K_i (held from the forward pass into backward) and PO_i
(written to storage right after its forward compute), and for each
backward stage t of its window [B0, E_i]: S[t,i] (held entering t; S[B0,i] is K_i), R[t,i] (recomputed at t,
only up to the SGD update of its own parameters) and P[t,i] (paged in at t, only where something may read
it). Memory rows are exact for the step order of `steps.build_steps`: the peak of a stage is reached while
its node runs, and frees happen at the end.

Energy = sum R*E_comp + PO*E_out + P*E_in (+ the constant energy of computing every node once).
Deadline: the same with times, paging included.

With `stream` (frozen weights that may stay in flash or go to storage, and how many bytes flash cannot hold),
F[w] says weight w is in storage: every node that reads it then holds it as workspace and pays its page-in
(a recompute too: Z[t,i,w] = R[t,i] and F[w]), and at least the bytes flash cannot hold are in storage.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .steps import Decisions
from edgetrain.compiler.graph.ir import TrainingGraph
from edgetrain.compiler.graph.liveness import Liveness
from .milp.model import SparseMILP
from .repeats import Restriction, UniqueRows


@dataclass
class PoetModel:
    milp: SparseMILP
    K: dict[str, int]
    PO: dict[str, int]
    S: dict[tuple[int, str], int]
    R: dict[tuple[int, str], int]
    P: dict[tuple[int, str], int]
    base_energy_j: float
    base_time_s: float
    free: dict[int, float] = field(default_factory=dict)  # backward stage -> bytes its memory row allows
    F: dict[str, int] = field(default_factory=dict)  # frozen weight -> "kept in storage" (with `stream`)

    def entering(self, t: int, i: str, B0: int) -> int | None:
        """The variable "i held entering backward stage t": K at the first backward stage B0, then S."""
        return self.K[i] if t == B0 else self.S.get((t, i))

    def useless_page_outs(self, x: np.ndarray, lv: Liveness) -> set[str]:
        """Tensors `x` pages out but never pages in. The objective charges a page-out, but only up to the
        solver's gap: a solve stopped at 1e-4 kept six of them on ResNet-18 at 50%. Dropping one keeps every
        row satisfied (PO appears only in P <= PO, where P = 0, and in "kept, recomputed or stored by the first
        reader", which a tensor never paged in meets by K or R) and saves its energy and time. A row
        PO <= sum P would forbid them instead, at one more row per tensor (VGG-11 at batch 2 would then pass
        the 2000 rows of Gurobi's size-limited license)."""
        return {i for i, j in self.PO.items() if x[j] > 0.5 and not any(
            x[p] > 0.5 for t in range(lv.B0, lv.window_end[i] + 1) if (p := self.P.get((t, i))) is not None)}

    def decisions(self, x: np.ndarray, lv: Liveness) -> Decisions:
        """The decisions of a solution, without its useless page-outs (see `useless_page_outs`)."""
        on = lambda j: x[j] > 0.5  # noqa: E731
        useless = self.useless_page_outs(x, lv)
        d = Decisions(keep={i for i, j in self.K.items() if on(j)},
                      page_out={i for i, j in self.PO.items() if on(j)} - useless)
        for t in range(lv.B0, lv.T):
            d.resident[t] = set()
            d.recompute[t] = []
            d.page_in[t] = []
        d.resident[lv.B0] = set(d.keep)
        for (t, i), j in self.S.items():
            if on(j):
                d.resident[t].add(i)
        for (t, i), j in self.R.items():
            if on(j):
                d.recompute[t].append(i)
        for (t, i), j in self.P.items():
            if on(j):
                d.page_in[t].append(i)
        order = {n: k for k, n in enumerate(lv.decision)}
        for t in d.recompute:
            d.recompute[t].sort(key=order.__getitem__)
        return d

    def vector(self, d: Decisions) -> np.ndarray:
        """The variable vector of a heuristic's decisions (for a warm start)."""
        x = np.zeros(self.milp.n_vars)
        for i, j in self.K.items():
            x[j] = i in d.keep
        for i, j in self.PO.items():
            x[j] = i in d.page_out
        for (t, i), j in self.S.items():
            if j != self.K[i]:  # S is K before a restricted tensor's block (repeats.py)
                x[j] = i in d.resident.get(t, ())
        for (t, i), j in self.R.items():
            x[j] = i in d.recompute.get(t, ())
        for (t, i), j in self.P.items():
            x[j] = i in d.page_in.get(t, ())
        return x


def reads(lv: Liveness, can_recompute: dict[str, bool]) -> dict[str, set[int]]:
    """Per decision tensor, the backward stages where something may read it: its own backward readers, and
    every stage where a tensor it feeds may be recomputed."""
    out: dict[str, set[int]] = {i: set() for i in lv.decision}
    for t in range(lv.B0, lv.T):
        for i in lv.needs[t]:
            out[i].add(t)
    for c in lv.decision:
        if can_recompute[c]:
            for i in lv.inputs_of[c]:
                out[i].update(range(lv.B0, lv.recompute_until[c] + 1))
    return out


def build(g: TrainingGraph, lv: Liveness, target, budget_bytes: int, deadline_s: float | None = None, *,
          paging: bool = True, recompute: bool = True, prune: bool = True, held_once: str = "needs",
          sources: bool = True, stream: dict[str, int] | None = None, stream_need: int = 0,
          repeats: Restriction | None = None) -> PoetModel:
    """The MILP. `prune` leaves out dominated page-ins; `held_once` ("none", "needs", "all") says where rows
    say a tensor is held at most once (see below); `sources` adds, per tensor, "held at its first reader only
    if kept, recomputed by then, or stored". All keep the optimum; the switches exist to measure them.
    `repeats` (repeats.restriction): a restriction of this model for repeated blocks, each block's tensors decided
    about from its own backward on and identical blocks sharing variables; its schedules are this model's."""
    m = SparseMILP() if repeats is None else UniqueRows()
    B0 = lv.B0
    node = {n.name: n for n in g.nodes}
    K, PO, S, R, P = {}, {}, {}, {}, {}
    can_recompute = {i: recompute and lv.recomputable(i) for i in lv.decision}
    read_at = reads(lv, can_recompute)
    shared: dict[tuple, int] = {}
    opens = repeats.opens if repeats is not None else {}

    def var(name: str, key: tuple, cost: float = 0.0) -> int:
        """A variable, or with `repeats` the one its tied block made (the objective counts it once per block)."""
        if repeats is None:
            return m.add_var(name, cost=cost)
        key = repeats.key(*key)
        if key in shared:
            m.cost[shared[key]] += float(cost)
            return shared[key]
        shared[key] = m.add_var(name, cost=cost)
        return shared[key]

    for i in lv.decision:
        size = lv.size[i]
        opened = opens.get(i, B0)  # before it, held iff kept: S is K, and nothing recomputes or pages it in
        K[i] = var(f"K[{i}]", ("K", i))
        if paging:
            PO[i] = var(f"PO[{i}]", ("PO", i), cost=target.page_out_energy_j(size))
        for t in range(B0, lv.window_end[i] + 1):
            if t > B0:
                S[t, i] = K[i] if t < opened else var(f"S[{t},{i}]", ("S", i, t))
            if t < opened:
                continue
            if can_recompute[i] and t <= lv.recompute_until[i]:
                R[t, i] = var(f"R[{t},{i}]", ("R", i, t), cost=node[i].rec_energy_j)
            # A page-in where nothing can read the tensor is dominated: paging it in at its next read instead
            # costs the same and holds less memory at every instant in between.
            if paging and (t in read_at[i] or not prune):
                P[t, i] = var(f"P[{t},{i}]", ("P", i, t), cost=target.page_in_energy_j(size))

    # Frozen weights in storage or flash: paged in by each reader (its first computation: energy in F's cost).
    F: dict[str, int] = {}
    reads_of = {t: [w for w in dict.fromkeys(n.params) if w in (stream or {})] for t, n in enumerate(g.nodes)}
    for w, size in (stream or {}).items():
        readers = sum(w in ws for ws in reads_of.values())
        F[w] = m.add_var(f"F[{w}]", cost=readers * target.page_in_energy_j(size))
    if F:
        m.add_row([(F[w], float(size)) for w, size in stream.items()], lo=float(stream_need))
    Z: dict[tuple[int, str, str], int] = {}
    for (t, i), r in R.items():
        for w in reads_of[g.index(i)]:
            Z[t, i, w] = m.add_var(f"Z[{t},{i},{w}]", cost=target.page_in_energy_j(stream[w]))
            m.add_row([(Z[t, i, w], 1.0), (r, -1.0), (F[w], -1.0)], lo=-1.0)

    # Weights the budget holds while they stay (a Python plan's; a microcontroller's stay in flash): one streamed
    # instead frees its bytes at every instant but its readers'.
    resident = not g.frozen_in_flash
    unheld = [(F[w], -float(stream[w])) for w in F] if resident else []

    def streamed(t: int) -> list[tuple[int, float]]:
        """Node t's weights in storage: its workspace while it runs (where they were held anyway: no change);
        the others' bytes out of memory."""
        if resident:
            return [(F[w], -float(stream[w])) for w in F if w not in reads_of[t]]
        return [(F[w], float(stream[w])) for w in reads_of[t]]

    def held(t: int, i: str) -> list[tuple[int, float]]:
        """Terms of 'i is resident during stage t' (entering, recomputed, or paged in)."""
        terms = [(K[i] if t == B0 else S[t, i], 1.0)]
        if (t, i) in R:
            terms.append((R[t, i], 1.0))
        if (t, i) in P:
            terms.append((P[t, i], 1.0))
        return terms

    for i in lv.decision:
        for t in range(max(B0, opens.get(i, B0) - 1), lv.window_end[i]):  # before: S is K throughout
            m.add_row([(S[t + 1, i], 1.0)] + [(j, -v) for j, v in held(t, i)], hi=0.0)
        for t in range(B0, lv.window_end[i] + 1):
            if (t, i) in P:
                m.add_row([(P[t, i], 1.0), (PO[i], -1.0)], hi=0.0)
            if (t, i) in R:
                for j in lv.inputs_of[i]:
                    m.add_row([(R[t, i], 1.0)] + [(c, -v) for c, v in held(t, j)], hi=0.0)
    # Held at most once: a recompute or page-in of a tensor already held only adds cost and memory, so no
    # optimum has one; saying so cuts those points from the LP relaxation. "needs": where a node reads the
    # tensor, "held >= 1" becomes "== 1" (no extra row); "all": a row at every stage of its window.
    for t in range(B0, lv.T):
        for i in lv.needs[t]:
            m.add_row(held(t, i), lo=1.0, hi=1.0 if held_once != "none" else math.inf)
    if sources:
        first = {}
        for t in range(B0, lv.T):
            for i in lv.needs[t]:
                first.setdefault(i, t)
        for i, t in first.items():
            terms = [(K[i], 1.0)] + ([(PO[i], 1.0)] if i in PO else [])
            terms += [(R[s, i], 1.0) for s in range(B0, t + 1) if (s, i) in R]
            m.add_row(terms, lo=1.0)
    if held_once == "all":
        for i in lv.decision:
            for t in range(B0, lv.window_end[i] + 1):
                if len(held(t, i)) > 1:
                    m.add_row(held(t, i), hi=1.0)
    # Memory: forward stages hold a decision tensor past its last forward use only if it is kept.
    for t in range(0, B0):
        terms = [(K[i], float(lv.size[i])) for i in lv.decision if lv.end[i] < t]
        # Always a row, even with no variable: a stage whose fixed memory alone exceeds the budget makes the
        # model infeasible for anyone calling build() directly, as the validator would.
        m.add_row(terms + streamed(t), hi=float(budget_bytes - lv.static[t]))
    free = {t: float(budget_bytes - lv.static[t]) for t in range(B0, lv.T)}
    for t in range(B0, lv.T):
        terms = []
        for i in lv.decision:
            if t <= lv.window_end[i]:
                terms += [(j, float(lv.size[i]) * v) for j, v in held(t, i)]
        m.add_row(terms + streamed(t), hi=free[t])
    # A recompute with a workspace (max-pool's pooled values) peaks while it runs, before node t does: one
    # more row for that instant (page-ins, then recomputes in forward order, are already resident).
    order = {name: k for k, name in enumerate(lv.decision)}
    for (t, i), r in R.items():
        w = node[i].transient_bytes
        pulled = [(Z[t, i, v], float(stream[v])) for v in reads_of[g.index(i)] if (t, i, v) in Z]
        if not w and not pulled:
            continue
        terms = [(r, float(w))] + pulled + unheld
        for k in lv.decision:
            if t <= lv.window_end[k]:
                terms += [(j, float(lv.size[k])) for j, v in held(t, k)
                          if (t, k) not in R or j != R[t, k] or order[k] <= order[i]]
        m.add_row(terms, hi=float(budget_bytes - lv.before_node(g, t)))
    base_time = sum(n.time_s for n in g.nodes)
    base_energy = sum(n.energy_j for n in g.nodes)
    if deadline_s is not None:
        terms = [(j, node[i].rec_time_s) for (t, i), j in R.items()]
        terms += [(j, target.page_out_time_s(lv.size[i])) for i, j in PO.items()]
        terms += [(j, target.page_in_time_s(lv.size[i])) for (t, i), j in P.items()]
        terms += [(F[w], sum(w in ws for ws in reads_of.values()) * target.page_in_time_s(stream[w])) for w in F]
        terms += [(z, target.page_in_time_s(stream[w])) for (t, i, w), z in Z.items()]
        # Seconds can be ~1e-11 per recompute on a Jetson, far below a solver's feasibility tolerance (~1e-7):
        # scale the row (by a power of two, exactly) so its smallest time is about 1.
        positive = [v for _, v in terms if v > 0]
        scale = 1.0
        if positive:
            scale = math.ldexp(1.0, -math.frexp(min(positive))[1])
            scale = min(scale, math.ldexp(1.0, 20 - math.frexp(max(positive))[1]))  # keep the largest <= ~1e6
        m.add_row([(j, v * scale) for j, v in terms], hi=(deadline_s - base_time) * scale)
    m.offset = base_energy
    if isinstance(m, UniqueRows):
        m = m.plain()
    return PoetModel(milp=m, K=K, PO=PO, S=S, R=R, P=P, base_energy_j=base_energy, base_time_s=base_time,
                     free=free, F=F)


def without_redundant_holds(pm: PoetModel, lv: Liveness, x: np.ndarray) -> np.ndarray:
    """`x` with every recompute or page-in of a tensor that is already resident removed (and a page-in beside a
    recompute), then every page-out left without a page-in: each only adds energy, time and memory, and the tensor stays resident, so the result is
    feasible wherever `x` is and costs no more. Window cuts assume schedules without them."""
    x = np.round(np.asarray(x, dtype=np.float64))
    for i in lv.decision:
        for t in range(lv.B0, lv.window_end[i] + 1):
            entering = x[pm.entering(t, i, lv.B0)]
            r, p = pm.R.get((t, i)), pm.P.get((t, i))
            if entering > 0.5:
                for j in (r, p):
                    if j is not None:
                        x[j] = 0.0
            elif r is not None and p is not None and x[r] > 0.5:
                x[p] = 0.0
    for i in pm.useless_page_outs(x, lv):
        x[pm.PO[i]] = 0.0  # nothing pages it in (any more): its page-out goes too
    return x
