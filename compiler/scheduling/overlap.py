"""Overlap paging with compute: page-ins start earlier (read ahead) and frees of paged-out tensors come later
(write behind), so that the Python runtime's reader and writer threads work while nodes compute.

A tensor held longer is counted longer: a page-in moved to the start of an earlier stage s counts its tensor in
every instant of stages s..t-1, a free moved to the end of a later stage e' counts it through stages e+1..e',
exactly as the validator, and the runtime's ledger, count them: the steps are the memory model, so all three
keep agreeing to the byte. The pass never raises the schedule's peak (a stage takes the tensor only if its own
peak plus the tensor stays within `limit`, by default the schedule's peak), keeps every tensor's steps in their
order (a free stays before the tensor's next step, a page-in after its previous one), and moves a step only as
far as the target says the transfer needs: until the compute time of the stages it overlaps covers the
transfer's time. Energy and the serial time model are unchanged (the overlap is a gain the runtime may or may
not get, so the prediction does not count on it). The C runtime pages synchronously: its schedules are left as
they are.
"""
from __future__ import annotations

from dataclasses import replace

from edgetrain.compiler.graph.ir import TrainingGraph
from .steps import Step
from .validator import validate


def overlap_paging(g: TrainingGraph, steps: list[Step], target, limit: int | None = None) -> list[Step]:
    """`steps` with frees written behind, then page-ins read ahead, as the rules above allow (a new list)."""
    peaks = list(validate(g, steps, target, None).stage_peaks)
    limit = max(peaks) if limit is None else limit
    index = {n.name: k for k, n in enumerate(g.nodes)}
    size = lambda name: g.nodes[index[name]].bytes  # noqa: E731
    stage = {k: st.stage for k, st in enumerate(steps)}  # position in `steps` -> its stage after the pass

    def take(first: int, last: int, nbytes: int) -> None:
        for u in range(first, last + 1):
            peaks[u] += nbytes

    # Write behind: a free right after the tensor's page-out (no step of it between) waits for the write.
    following: dict[int, int] = {}  # position of a step -> stage of the same tensor's next step
    later: dict[str, int] = {}
    for k in range(len(steps) - 1, -1, -1):
        if steps[k].tensor in later:
            following[k] = later[steps[k].tensor]
        later[steps[k].tensor] = steps[k].stage
    paged: set[str] = set()
    for k, st in enumerate(steps):
        if st.action == "page_out":
            paged.add(st.tensor)
            continue
        if st.action == "free" and st.tensor in paged and k in following:
            b, e = size(st.tensor), st.stage
            need, covered = target.page_out_time_s(b), 0.0
            while e + 1 < following[k] and covered < need and peaks[e + 1] + b <= limit:
                e += 1
                covered += g.nodes[e].time_s
            take(st.stage + 1, e, b)
            stage[k] = e
        paged.discard(st.tensor)
    # Read ahead: a page-in starts once the tensor's previous step (its free, or a recompute) is done.
    last: dict[str, int] = {}
    for k, st in enumerate(steps):
        if st.action == "page_in" and st.tensor in last:
            b, s = size(st.tensor), st.stage
            need, covered = target.page_in_time_s(b), 0.0
            while s - 1 > last[st.tensor] and covered < need and peaks[s - 1] + b <= limit:
                s -= 1
                covered += g.nodes[s].time_s
            take(s, st.stage - 1, b)
            stage[k] = s
        last[st.tensor] = stage[k]
    return _placed(steps, stage)


def _placed(steps: list[Step], stage: dict[int, int]) -> list[Step]:
    """The steps with moved ones at their new stage: a page-in opens it, a free closes it."""
    opens: dict[int, list[Step]] = {}
    closes: dict[int, list[Step]] = {}
    for k, st in enumerate(steps):
        s = stage[k]
        if s < st.stage:
            opens.setdefault(s, []).append(replace(st, stage=s, reason=f"{st.reason}; read ahead from stage {s}"))
        elif s > st.stage:
            closes.setdefault(s, []).append(replace(st, stage=s, reason=f"{st.reason}; held to stage {s} while "
                                                                        "its page-out is written"))
    out: list[Step] = []
    for k, st in enumerate(steps):
        if st.stage in opens and (not out or out[-1].stage != st.stage):
            out += opens.pop(st.stage)
        if stage[k] == st.stage:
            out.append(st)
        if st.stage in closes and (k + 1 == len(steps) or steps[k + 1].stage != st.stage):
            out += closes.pop(st.stage)
    return out
