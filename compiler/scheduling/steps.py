"""Decisions about decision tensors, and the schedule steps they imply.

Every scheduler (store-all, checkpointing, paging, the MILP) produces a `Decisions`; one function turns any
`Decisions` into the ordered steps the validator replays and codegen renders, so all schedulers share one
memory model. Within a stage the order is fixed: page-ins, recomputes (forward order), the stage's node,
page-out of a fresh forward tensor, then frees.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from edgetrain.compiler.graph.ir import TrainingGraph
from edgetrain.compiler.graph.liveness import Liveness


@dataclass
class Decisions:
    keep: set[str] = field(default_factory=set)  # held in RAM from the forward pass into backward
    page_out: set[str] = field(default_factory=set)  # written to storage right after the forward compute
    resident: dict[int, set[str]] = field(default_factory=dict)  # backward stage -> held entering it
    recompute: dict[int, list[str]] = field(default_factory=dict)
    page_in: dict[int, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Step:
    stage: int
    action: str  # compute | recompute | page_out | page_in | free
    tensor: str
    reason: str = ""

    def to_json(self) -> dict:
        return {"stage": self.stage, "action": self.action, "tensor": self.tensor, "reason": self.reason}


def on_demand(g: TrainingGraph, lv: Liveness, keep: set[str], page_out: set[str], *,
              retain: bool = True, prefer_recompute: bool = True, kept_for_recompute: bool = True,
              page_first: frozenset[str] | set[str] = frozenset(),
              hold: frozenset[str] | set[str] = frozenset()) -> Decisions:
    """A policy: keep `keep`, store what of `page_out` it pages in; at each backward stage bring back what the node needs
    (page in if stored, else recompute, recursively) and, if `retain`, hold it while later stages read it.
    Kept tensors stay while they may feed a recompute (`kept_for_recompute`, checkpoints) or else only
    while a later stage reads them (plain backprop frees a saved tensor after its last reader).
    Tensors in `page_first` are paged in when stored, whatever `prefer_recompute` says; kept tensors in `hold`
    stay through their window whatever `kept_for_recompute` says.
    """
    B0 = lv.B0
    d = Decisions(keep=set(keep), page_out=set(page_out))
    resident = set(keep)
    order = {name: k for k, name in enumerate(lv.decision)}
    last_need: dict[str, int] = {}  # the last backward stage that reads each tensor
    for t in range(B0, lv.T):
        for i in lv.needs[t]:
            last_need[i] = t

    def bring(i: str, t: int, pins: list[str], recs: list[str], have: set[str]) -> None:
        if i in have:
            return
        can_page = i in page_out
        can_rec = lv.recomputable(i) and t <= lv.recompute_until[i]
        if can_rec and (prefer_recompute or not can_page) and not (can_page and i in page_first):
            for j in lv.inputs_of[i]:
                bring(j, t, pins, recs, have)
            recs.append(i)
        elif can_page:
            pins.append(i)
        else:
            raise ValueError(f"{i} is needed at stage {t} but neither kept, stored nor recomputable")
        have.add(i)

    for t in range(B0, lv.T):
        d.resident[t] = {i for i in resident if lv.window_end[i] >= t}
        pins: list[str] = []
        recs: list[str] = []
        have = set(d.resident[t])
        for i in lv.needs[t]:
            bring(i, t, pins, recs, have)
        d.page_in[t] = pins
        d.recompute[t] = sorted(recs, key=order.__getitem__)
        # What stays for the next stage: kept tensors while useful; brought-back ones while read later.
        nxt = set()
        for i in have:
            if t + 1 > lv.window_end[i]:
                continue
            if i in keep and (kept_for_recompute or i in hold):
                nxt.add(i)
            elif (retain or i in keep) and last_need.get(i, -1) > t:
                nxt.add(i)
        resident = nxt
    # Store only what comes back: a page-out never paged in costs time and energy for nothing.
    d.page_out = {i for pins in d.page_in.values() for i in pins}
    return d


def _why_back(i: str, t: int, g: TrainingGraph, d: Decisions, how: str) -> str:
    """Why tensor i comes back at stage t: the first later reader (a node, or a recompute it feeds)."""
    for s in range(t, len(g.nodes)):
        for j in d.recompute.get(s, []):
            if s > t or j != i:
                if any(r.name == i for r in g.node(j).inputs):
                    return f"{how} {i}: freed earlier to fit the budget; read by the recompute of {j} at stage {s}"
        if any(r.name == i for r in g.nodes[s].inputs):
            return f"{how} {i}: freed earlier to fit the budget; read by {g.nodes[s].name} at stage {s}"
    return f"{how} {i}"


def build_steps(g: TrainingGraph, lv: Liveness, d: Decisions) -> list[Step]:
    """The ordered steps of one training step, as the runtime will execute them."""
    steps: list[Step] = []
    B0, dset = lv.B0, set(lv.decision)
    order = {name: k for k, name in enumerate(lv.decision)}
    fixed_end: dict[int, list[str]] = {}
    for name, e in lv.end.items():
        if name not in dset and lv.size.get(name, 0) > 0:
            fixed_end.setdefault(e, []).append(name)
    resident: set[str] = set()  # decision tensors held now
    for t, node in enumerate(g.nodes):
        if t >= B0:
            for i in d.page_in.get(t, []):
                if i not in resident:
                    steps.append(Step(t, "page_in", i, _why_back(i, t, g, d, "page in")))
                    resident.add(i)
            for i in sorted(d.recompute.get(t, []), key=order.__getitem__):
                if i not in resident:
                    steps.append(Step(t, "recompute", i, _why_back(i, t, g, d, "recompute")))
                    resident.add(i)
        steps.append(Step(t, "compute", node.name, node.source))
        if node.name in dset:
            resident.add(node.name)
            if node.name in d.page_out:
                steps.append(Step(t, "page_out", node.name, "stored now, paged in when backward needs it"))
        # Frees at the end of the stage.
        for name in sorted(fixed_end.get(t, [])):
            steps.append(Step(t, "free", name, "last use"))
        if t < B0 - 1:
            gone = [i for i in resident if t >= lv.end[i] and i not in d.keep]
        else:
            held = d.resident.get(t + 1, set())
            gone = [i for i in resident if t + 1 > lv.window_end[i] or i not in held]
        for i in sorted(gone, key=order.__getitem__):
            why = "last use" if t >= lv.window_end[i] else "freed to fit the budget"
            steps.append(Step(t, "free", i, why))
            resident.discard(i)
    return steps
