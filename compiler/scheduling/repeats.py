"""Repeated blocks of a training graph (a transformer's decoder layers) and the restriction of the POET MILP that
solves one block's decisions once and reuses them for every identical block.

    blocks = find_blocks(g, lv)          # None: no block repeats
    shape = restriction(g, lv, blocks)   # poet.build(..., repeats=shape)

Blocks are found from the graph's structure, not from module names: the longest run of forward stages whose
(op, shape, dtype, operand count) sequence repeats with one period. Two restrictions make the model small, and
both keep it a restriction of the flat model (every schedule it finds is a schedule of the flat MILP, so the
validator replays it as any other and its energy is an upper bound on the flat optimum):

- a block's tensor is decided about only from the block's own backward on (`opens`): before that it is held if
  it is kept and absent if not (no recompute, page-in or free earlier). The window of a tensor of block k is then
  block k's backward, not every backward stage from the loss on: the flat model's variables grow with the square
  of the depth, these with the depth.
- the tensors of identical blocks share their variables (`tie`): block k's "recompute tensor j at the u-th stage
  of its backward" is block 0's. The objective and the deadline count a shared variable once per block; the
  memory rows stay per stage, so every block's peak is checked with the decisions it shares.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from edgetrain.compiler.graph.ir import TrainingGraph
from edgetrain.compiler.graph.liveness import Liveness
from .milp.model import SparseMILP, merge_terms
from .warmstart import Groups

MIN_REPEATS = 2  # fewer repeats of a block are no repetition
# `auto` reuses where the flat model would have more than this many "held" variables (one per decision tensor and
# backward stage of its window): a 4-layer tiny Llama has ~55,000 and HiGHS does not close its gap in minutes;
# Llama-3.2-1B's 16 layers, ~850,000, the flat model alone took a compile from 3.35 to 7.70 GB.
AUTO_HELD = 200_000


@dataclass(frozen=True)
class Blocks:
    """`count` blocks of `period` forward stages, the first starting at stage `start`."""
    start: int
    period: int
    count: int

    def of(self, stage: int) -> int | None:
        """The block that forward stage `stage` belongs to, or None."""
        k, r = divmod(stage - self.start, self.period)
        return k if stage >= self.start and k < self.count else None

    def to_json(self) -> dict:
        return {"start": self.start, "period": self.period, "count": self.count}


@dataclass
class Restriction:
    """What poet.build restricts: `opens[i]`, the first backward stage where tensor i may be recomputed, paged in
    or freed; `tie[i] = (j, shift)`, tensor i's variables are tensor j's at stage + shift."""
    blocks: Blocks
    opens: dict[str, int] = field(default_factory=dict)
    tie: dict[str, tuple[str, int]] = field(default_factory=dict)

    def key(self, kind: str, i: str, t: int | None = None) -> tuple:
        """The shared variable of `kind` (K, PO, S, R, P) for tensor i (at backward stage t)."""
        j, shift = self.tie.get(i, (i, 0))
        return (kind, j) if t is None else (kind, j, t + shift)

    def to_json(self) -> dict:
        return {**self.blocks.to_json(), "tied_tensors": len(self.tie), "restricted_tensors": len(self.opens)}


def _signatures(g: TrainingGraph, lv: Liveness) -> np.ndarray:
    codes: dict[tuple, int] = {}
    return np.array([codes.setdefault((n.op, n.shape, n.dtype, len(n.inputs), n.kind), len(codes))
                     for n in g.nodes[: lv.L + 1]], dtype=np.int64)


def find_blocks(g: TrainingGraph, lv: Liveness) -> Blocks | None:
    """The repeated blocks that cover the most forward stages (the shortest period among equals), or None."""
    s = _signatures(g, lv)
    best: Blocks | None = None
    for p in range(2, len(s) // MIN_REPEATS + 1):
        eq = np.concatenate([[False], s[:-p] == s[p:], [False]])
        edges = np.flatnonzero(np.diff(eq.astype(np.int8)))  # starts and ends of the runs of equal signatures
        if len(edges) == 0:
            continue
        starts, ends = edges[0::2], edges[1::2]
        longest = int(np.argmax(ends - starts))
        count = int(ends[longest] - starts[longest]) // p + 1
        if count >= MIN_REPEATS and (best is None or count * p > best.count * best.period):
            best = Blocks(start=int(starts[longest]), period=p, count=count)
    return best


def restriction(g: TrainingGraph, lv: Liveness, blocks: Blocks, tie: bool = True) -> Restriction:
    """Each block's tensors opened at the block's backward, and (`tie`) those of identical blocks shared."""
    stage = {n.name: t for t, n in enumerate(g.nodes)}
    block = {i: blocks.of(stage[i]) for i in lv.decision}
    block = {i: k for i, k in block.items() if k is not None}
    read: dict[str, list[int]] = {}
    for t in range(lv.B0, lv.T):
        for i in lv.needs[t]:
            read.setdefault(i, []).append(t)
    first = {i: ts[0] for i, ts in read.items()}
    # A block's backward begins where its first tensor that stays inside it is read (the block's output is read
    # by the next block's backward, earlier).
    outside = {r.name for t, n in enumerate(g.nodes[: lv.L + 1]) if n.kind == "forward"
               for r in n.inputs if r.name in block and blocks.of(t) != block[r.name]}
    begins: dict[int, int] = {}
    for i, k in block.items():
        if i not in outside and i in first:
            begins[k] = min(begins.get(k, lv.T), first[i])
    out = Restriction(blocks)
    for i, k in block.items():
        if k in begins:
            out.opens[i] = min(first.get(i, lv.T), begins[k])
    if not tie:
        return out
    # Block k is tied to the first block whose tensors match it one to one (same sizes, costs, windows and
    # readers relative to the block's backward); a block that matches none (the last block beside the head, say)
    # keeps its own variables.
    nodes = {n.name: n for n in g.nodes}
    members: dict[int, list[str | None]] = {k: [] for k in range(blocks.count)}
    for k in range(blocks.count):
        for j in range(blocks.period):
            name = g.nodes[blocks.start + k * blocks.period + j].name
            members[k].append(name if name in out.opens else None)

    def profile(i: str | None, k: int) -> tuple | None:
        if i is None:
            return None
        o = begins[k]
        n = nodes[i]
        rel = lambda t: None if t is None else t - o  # noqa: E731
        return (lv.size[i], n.energy_j, n.time_s, n.rec_energy_j, n.rec_time_s, rel(out.opens[i]),
                rel(lv.window_end[i]), rel(lv.recompute_until.get(i)), tuple(rel(t) for t in read.get(i, ())),
                tuple(_where(inp, stage, blocks, k) for inp in lv.inputs_of[i]))

    reps: list[tuple[int, list]] = []
    for k in range(blocks.count):
        if k not in begins or any(m is not None and m not in out.opens for m in members[k]):
            continue
        prof = [profile(i, k) for i in members[k]]
        rep = next((r for r, p in reps if p == prof), None)
        if rep is None:
            reps.append((k, prof))
            continue
        shift = begins[rep] - begins[k]
        for i, j in zip(members[k], members[rep]):
            if i is not None:
                out.tie[i] = (j, shift)
    return out


def _where(name: str, stage: dict[str, int], blocks: Blocks, k: int) -> tuple:
    """An operand as a block sees it: its place relative to the block's start if inside a block, else its name."""
    b = blocks.of(stage[name])
    if b is None:
        return ("outside", name)
    return ("block", stage[name] - (blocks.start + k * blocks.period))


@dataclass
class UniqueRows(SparseMILP):
    """A SparseMILP that adds each row once: tied blocks repeat their rows over the same shared variables."""
    _seen: set = field(default_factory=set)

    def add_row(self, terms, lo=-np.inf, hi=np.inf) -> int:
        terms = merge_terms(terms)
        key = (tuple(sorted(terms)), lo, hi)
        if key in self._seen:
            return -1
        self._seen.add(key)
        return super().add_row(terms, lo=lo, hi=hi)

    def plain(self) -> SparseMILP:
        """The model built, as a plain SparseMILP (rows added later, cuts say, are not deduplicated)."""
        return SparseMILP(**{f.name: getattr(self, f.name) for f in fields(SparseMILP)})


def groups(lv: Liveness, shape: Restriction) -> Groups:
    """The restriction as the greedy start sees it (warmstart.Groups): tied tensors are kept or dropped together;
    a block's tensor that a recompute may read before the block's backward opens it (the block's output, which
    the next block's recomputes read) is never dropped; the greedy starts from every other block tensor dropped
    (each block recomputed or paged in its own backward from its input) and refills what fits."""
    members: dict[str, list[str]] = {}
    for i, (j, _) in shape.tie.items():
        members.setdefault(j, [j]).append(i)
    of = {i: tuple(ms) for ms in members.values() for i in ms}
    # A tensor held is never recomputed, so only the readers left unheld pin their inputs: decided from the last
    # tensor back (a reader comes after what it reads).
    early: dict[str, list[str]] = {}
    for c in lv.decision:
        for i in lv.inputs_of[c]:
            if i in shape.opens and shape.opens.get(c, lv.B0) < shape.opens[i]:
                early.setdefault(i, []).append(c)
    pinned: set[str] = set()
    for i in reversed(lv.decision):
        if any(c not in pinned for c in early.get(i, ())):
            pinned.add(i)
    return Groups(of=of, pinned=frozenset(pinned), dropped=frozenset(set(shape.opens) - pinned))


def flat_size(lv: Liveness) -> int:
    """The flat model's "held" variables: one per decision tensor and backward stage of its window."""
    return sum(lv.window_end[i] - lv.B0 + 1 for i in lv.decision)


def choose(g: TrainingGraph, lv: Liveness, mode: str) -> Restriction | None:
    """The restriction `mode` asks for (`reuse`, or `auto` on a model whose flat MILP is large), or None (flat)."""
    if mode == "flat" or (mode == "auto" and flat_size(lv) <= AUTO_HELD):
        return None
    blocks = find_blocks(g, lv)
    return None if blocks is None else restriction(g, lv, blocks)
