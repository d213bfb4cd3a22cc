"""Replays a schedule against the DAG and the budget, independently of the schedulers.

It knows only the graph, the steps and the target: every operand must be resident when read, a recompute
must come before the SGD update of the node's own parameters (else it would use new weights), a page-in
needs a stored copy (and, strict, every stored copy is paged in), memory (state + resident tensors + the
running node's output and workspace) must never exceed the budget, and every tensor must be freed by the
end. It returns peak, time and energy. A node's streamed weights are its workspace, and their page-in is
in its time and energy and in the paged bytes. A node that writes its output into an operand (`Node.into`)
takes that operand's bytes: the operand must be resident with as many bytes, is never read or paged again,
and is freed (releasing nothing) within the same stage.
"""
from __future__ import annotations

from dataclasses import dataclass

from edgetrain.compiler.errors import OverBudgetError, ValidationError
from edgetrain.compiler.graph.costs import stream_in
from edgetrain.compiler.graph.inplace import dropped_output_bytes
from edgetrain.compiler.graph.ir import IN_STORAGE, TrainingGraph


@dataclass
class Report:
    peak_bytes: int
    peak_stage: int
    time_s: float
    energy_j: float
    compute_time_s: float
    paging_time_s: float
    recomputes: int
    page_ins: int
    page_outs: int
    paged_bytes: int
    stage_peaks: list[int]

    def to_json(self) -> dict:
        d = dict(self.__dict__)
        d.pop("stage_peaks")
        return d


def validate(g: TrainingGraph, steps: list, target, budget_bytes: int | None, *,
             strict: bool = False) -> Report:
    """Replay `steps`; raise ValidationError at the first broken rule. `strict` (what every scheduler asks
    for) also rejects a page-out never paged in: wasteful rather than wrong, so a schedule file written
    before the schedulers dropped them still runs."""
    index = {n.name: i for i, n in enumerate(g.nodes)}
    resident: dict[str, int] = {}
    stored: set[str] = set()
    paged_in: set[str] = set()
    computed: set[str] = set()
    overwritten: dict[str, str] = {}  # operand -> the node that wrote its output into it (within this stage)
    updated_params: set[str] = set()  # parameters the optimizer has changed (a graph captured from torch)
    live = g.state_bytes
    peak, peak_stage = live, 0
    stage_peaks = [0] * len(g.nodes)
    time_s = energy = paging_time = 0.0
    recomputes = page_ins = page_outs = paged = 0
    last_stage = -1

    def fail(k: int, step, msg: str, kind=ValidationError) -> ValidationError:
        return kind(f"step {k} (stage {step.stage}, {step.action} {step.tensor}): {msg}")

    for k, st in enumerate(steps):
        if st.stage < last_stage:
            raise fail(k, st, "stages out of order")
        if st.stage > last_stage and overwritten:
            x, by = next(iter(overwritten.items()))
            raise fail(k, st, f"{x}, which {by} wrote its output into, was not freed within its stage")
        last_stage = st.stage
        if st.tensor in overwritten and st.action != "free":
            raise fail(k, st, f"{st.tensor} was overwritten by {overwritten[st.tensor]}'s output")
        if st.action in ("compute", "recompute"):
            if st.tensor not in index:
                raise fail(k, st, "unknown node")
            n = g.nodes[index[st.tensor]]
            if st.action == "compute":
                if n.name in computed:
                    raise fail(k, st, "computed twice; a second computation must be a recompute")
                if index[n.name] != st.stage:
                    raise fail(k, st, f"node {n.name} belongs to stage {index[n.name]}")
            else:
                if not n.recomputable or n.name not in computed:
                    raise fail(k, st, "only a forward node computed before can be recomputed")
                if updated_params.intersection(n.params):
                    raise fail(k, st, "recompute after the node's parameters were updated would not be exact")
                if n.name in resident:
                    raise fail(k, st, "recompute of a tensor that is resident")
            for r in n.inputs:  # the input batch read from storage by its readers is never resident
                if r.name not in resident and not g.nodes[index[r.name]].attrs.get(IN_STORAGE):
                    raise fail(k, st, f"operand {r.name} is not resident")
            if n.aux_of and f"{n.aux_of}.aux" not in resident:
                raise fail(k, st, f"statistics {n.aux_of}.aux are not resident")
            into = n.into
            out_bytes = n.bytes or dropped_output_bytes(n)  # a dropped output is in the workspace
            if into is not None and resident[into] != out_bytes:
                raise fail(k, st, f"its output ({out_bytes} B) cannot take the {resident[into]} B of {into}")
            shared = out_bytes if into is not None else 0
            new = n.bytes - shared + (n.aux_bytes if st.action == "compute" else 0)
            at_node = live + new + n.transient_bytes
            if budget_bytes is not None and at_node > budget_bytes:
                raise fail(k, st, f"memory {at_node} B exceeds the budget of {budget_bytes} B", OverBudgetError)
            if at_node > peak:
                peak, peak_stage = at_node, st.stage
            stage_peaks[st.stage] = max(stage_peaks[st.stage], at_node)
            if n.bytes:
                resident[n.name] = n.bytes
            if into is not None:  # its bytes are the output's now
                resident[into] = 0
                overwritten[into] = n.name
            if st.action == "compute" and n.aux_bytes:
                resident[f"{n.name}.aux"] = n.aux_bytes
            live += new
            computed.add(n.name)
            updated_params.update(n.updates)
            again = st.action == "recompute"  # a recompute may cost less than the first computation
            time_s += n.rec_time_s if again else n.time_s  # with its streamed weights' page-in (paging_time too)
            energy += n.rec_energy_j if again else n.energy_j
            if n.streamed:
                streamed, dt, _ = stream_in(g, n, target)
                paged += streamed
                paging_time += dt
            recomputes += st.action == "recompute"
        elif st.action == "page_out":
            if st.tensor not in resident:
                raise fail(k, st, "page-out of a tensor that is not resident")
            b = resident[st.tensor]
            stored.add(st.tensor)
            dt = target.page_out_time_s(b)
            time_s += dt
            paging_time += dt
            energy += target.page_out_energy_j(b)
            page_outs += 1
            paged += b
        elif st.action == "page_in":
            if st.tensor not in stored:
                raise fail(k, st, "page-in of a tensor that was never paged out")
            if st.tensor in resident:
                raise fail(k, st, "page-in of a tensor that is resident")
            b = g.nodes[index[st.tensor]].bytes
            if budget_bytes is not None and live + b > budget_bytes:
                raise fail(k, st, f"memory {live + b} B exceeds the budget of {budget_bytes} B", OverBudgetError)
            resident[st.tensor] = b
            paged_in.add(st.tensor)
            live += b
            peak = max(peak, live)
            stage_peaks[st.stage] = max(stage_peaks[st.stage], live)
            dt = target.page_in_time_s(b)
            time_s += dt
            paging_time += dt
            energy += target.page_in_energy_j(b)
            page_ins += 1
            paged += b
        elif st.action == "free":
            if st.tensor not in resident:
                raise fail(k, st, "free of a tensor that is not resident")
            live -= resident.pop(st.tensor)
            overwritten.pop(st.tensor, None)
        else:
            raise fail(k, st, f"unknown action {st.action!r}")
    missing = [n.name for n in g.nodes if n.name not in computed]
    if missing:
        raise ValidationError(f"nodes never computed: {missing[:5]}")
    if resident:
        raise ValidationError(f"tensors still resident at the end of the step: {sorted(resident)[:5]}")
    useless = sorted(stored - paged_in)
    if useless and strict:
        raise ValidationError(f"paged out but never paged in: {useless[:5]} (time and energy for nothing)")
    return Report(peak_bytes=peak, peak_stage=peak_stage, time_s=time_s, energy_j=energy,
                  compute_time_s=time_s - paging_time, paging_time_s=paging_time, recomputes=recomputes,
                  page_ins=page_ins, page_outs=page_outs, paged_bytes=paged, stage_peaks=stage_peaks)
