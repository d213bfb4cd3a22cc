"""What bounds the smallest feasible budget: the stage whose working set no schedule can shrink, in words.

`min_budget` (budget.py) is the most any stage must hold: at a forward stage everything fixed there, at a
backward stage that plus the tensors its node reads. The stage where that maximum falls is the op to change
to train in less; `smallest_budget_bound` names it (node, op, the user's line) with its parts, and `remedies`
says what would lower it. Refusals below the smallest budget and `edgetrain inspect` call these.
"""
from __future__ import annotations

from dataclasses import dataclass

from edgetrain.compiler.graph.ir import TrainingGraph
from edgetrain.compiler.graph.liveness import Liveness


@dataclass(frozen=True)
class Bound:
    """The stage whose working set is the smallest feasible budget, and its parts in bytes."""

    stage: int
    node: str
    op: str
    kind: str  # forward, loss, backward
    source: str
    budget_bytes: int  # the smallest feasible budget: all of the below
    state_bytes: int  # parameters, optimizer state, buffers
    inputs_bytes: int  # what the node reads
    output_bytes: int  # what it makes (with statistics it keeps for its backward)
    scratch_bytes: int  # its workspace while it runs (a layer's gradients before fused SGD, kernel scratch)
    other_bytes: int  # other tensors alive there (gradients and activations waiting for their readers)
    updates_params: bool  # its workspace holds gradients of parameters it updates
    # "tiled": computed patch by patch already; "prefix": in a frozen prefix that can be; "trains": a forward node
    # that trains or is saved for a backward; else ""
    tiling: str = ""
    into: str | None = None  # the operand its output is written into (its bytes counted once, in the inputs)

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    def text(self) -> str:
        where = f" ({self.source})" if self.source else ""
        into = f" (written into its operand `{self.into}`)" if self.into else ""
        return (f"the smallest budget is bounded by node `{self.node}` ({self.op}, {self.kind}){where}: its inputs "
                f"{self.inputs_bytes} B + outputs {self.output_bytes} B{into} + scratch {self.scratch_bytes} B, beside "
                f"{self.state_bytes} B of parameters, optimizer state and buffers and {self.other_bytes} B of other "
                "tensors alive there")


def _needs(lv: Liveness) -> list[int]:
    """What each stage must hold whatever is recomputed or paged (`min_budget` is their most)."""
    return [lv.static[t] + (sum(lv.size[i] for i in lv.needs.get(t, ())) if t > lv.L else 0) for t in range(lv.T)]


def smallest_budget_bound(g: TrainingGraph, lv: Liveness) -> Bound:
    """The stage where `min_budget(lv)` is reached (the first, on ties)."""
    need = _needs(lv)
    return _bound_at(g, lv, need, max(range(lv.T), key=lambda k: (need[k], -k)))


def untiled_bound(g: TrainingGraph, lv: Liveness, with_input: bool = True) -> Bound:
    """The most a stage holds that no tiling replaces (a backward node, a forward node that trains or is saved, the
    prefix's end; the input batch unless `with_input` is False): no plan of `g` holds less, whatever is tiled,
    recomputed, paged or streamed (a streamed weight only adds its readers' workspace)."""
    from edgetrain.compiler.graph.tiling import tileable_stages

    need, tiled = _needs(lv), tileable_stages(g)
    stages = [t for t in range(lv.T) if t not in tiled and (with_input or g.nodes[t].kind != "input")]
    return _bound_at(g, lv, need, max(stages, key=lambda k: (need[k], -k)))


def _bound_at(g: TrainingGraph, lv: Liveness, need: list[int], t: int) -> Bound:
    n = g.nodes[t]
    read = list(dict.fromkeys(r.name for r in n.inputs)) + ([f"{n.aux_of}.aux"] if n.aux_of else [])
    inputs = sum(lv.size.get(r, 0) for r in read)
    taken = lv.shared.get(t, 0)  # an output written into an operand: its bytes counted once, in the inputs
    dropped = taken - n.bytes if taken > n.bytes else 0  # such an output dropped into the workspace (a gradient)
    output = n.bytes + n.aux_bytes - (taken - dropped)
    other = max(0, need[t] - lv.state_bytes - inputs - output - (n.transient_bytes - dropped))
    return Bound(stage=t, node=n.name, op=n.op, kind=n.kind, source=n.source, budget_bytes=need[t],
                 state_bytes=lv.state_bytes, inputs_bytes=inputs, output_bytes=output,
                 scratch_bytes=n.transient_bytes - dropped, other_bytes=other, updates_params=bool(n.updates),
                 tiling=tiling_of(g, t), into=n.into)


def tiling_of(g: TrainingGraph, t: int) -> str:
    """Whether stage `t` is computed patch by patch ("tiled"), lies in a frozen forward prefix that can be
    ("prefix"), is a forward node that trains or is saved for a backward ("trains"), or none of these ("")."""
    from edgetrain.compiler.graph.tiling import TILED_OP, tileable_stages

    n = g.nodes[t]
    if n.op == TILED_OP:
        return "tiled"
    if t in tileable_stages(g):
        return "prefix"
    trained = set(g.trainable_params)
    saved = any(r.name == n.name for m in g.nodes if m.kind == "backward" for r in m.inputs)
    return "trains" if n.kind == "forward" and (saved or trained & set(n.params)) else ""


def bound_text(g: TrainingGraph, lv: Liveness | None = None) -> str:
    """One sentence for a refusal: which op's working set bounds the smallest budget, and what would lower it."""
    from edgetrain.compiler.graph.liveness import analyze

    b = smallest_budget_bound(g, lv or analyze(g))
    text = b.text()
    return f"{text[0].upper()}{text[1:]}; to lower it: {remedies(b)}."


def remedies(b: Bound) -> str:
    """What would lower the smallest budget, most effective first."""
    ways = []
    if b.tiling == "prefix":
        ways.append("computing the frozen forward prefix up to this node patch by patch (compile does so by itself "
                    "when --budget is a size or auto below this bound and a tiling fits it)")
    elif b.tiling == "tiled":
        ways.append("a smaller --budget in bytes: this node is a frozen prefix computed patch by patch, and compile "
                    "picks the tiling with the fewest added FLOPs that fits the budget asked for (a finer grid or a "
                    "prefix that ends at a smaller tensor when asked for less)")
    elif b.tiling == "trains":
        ways.append("freezing the layers up to this one with --train, so that no gradient flows through them and "
                    "compile can compute them patch by patch")
    if b.updates_params and b.scratch_bytes >= max(b.inputs_bytes, b.output_bytes):
        ways.append("freeze this layer with --train (its scratch is its parameters' gradient)")
    if b.state_bytes >= b.budget_bytes // 2:
        ways.append("train fewer parameters with --train (last:N, patterns): parameters and optimizer state are "
                    "most of it")
    ways.append("a smaller --batch-size (the working set grows with it)")
    if b.kind == "backward":
        ways.append("freeze the layers up to this one with --train, so that no backward step runs through it")
    ways.append("a smaller input or narrower layer here")
    return "; ".join(ways)


def over_ram_text(g: TrainingGraph, lv: Liveness, ram_bytes: int, reserved_bytes: int, reserved_for: str,
                  device: str, input_in_storage: bool = False) -> str:
    """Why no plan of `g` trains within a device's `ram_bytes`, with `reserved_bytes` of it held for
    `reserved_for` (the input batch among them), when its fixed state alone overflows: its parts, and what the
    least working set no tiling or streaming splits holds were the input read from storage patch by patch (over
    the RAM too, or within it: then the input batch, read whole, is all that is in the way).
    `input_in_storage`: the runtime reads the batch so where a tiling of the frozen prefix can
    (graph/input_storage.py): it is then counted nowhere."""
    from edgetrain.compiler.graph.input_storage import tiles_can_read_input

    x = sum(n.bytes for n in g.nodes if n.kind == "input")
    stored = input_in_storage and tiles_can_read_input(g)
    fixed = lv.state_bytes + reserved_bytes - (x if stored else 0)
    b = untiled_bound(g, lv, with_input=False)
    need = b.budget_bytes + reserved_bytes - x
    tensors = b.budget_bytes - b.state_bytes
    where = f" ({b.source})" if b.source else ""
    into = f", its output written into `{b.into}`" if b.into else ""
    batch = (f"the input batch {x} B is not held: the frozen layers that read it are computed patch by patch and "
             "read it from storage" if stored else f"the input batch {x} B, which the first layer reads whole")
    head = (f"{g.model} cannot train on {device} in {_dtype(g)}: its fixed state alone takes {fixed} B of the "
            f"{ram_bytes} B of RAM ({batch}; the trainable weights {g.param_bytes} B, their optimizer state "
            f"{g.optimizer_bytes} B, buffers {g.buffer_bytes} B; {reserved_bytes - x} B more for {reserved_for})")
    holds = (f"node `{b.node}` ({b.op}, {b.kind}){where} holds {tensors} B of tensors at once (its inputs "
             f"{b.inputs_bytes} B + outputs {b.output_bytes} B{into} + scratch {b.scratch_bytes} B + {b.other_bytes} B "
             f"of others alive there) beside the {b.state_bytes} B of training state")
    if need <= ram_bytes and not stored:
        return (f"{head}. Only the input batch is in the way: were it read from storage patch by patch, no plan "
                f"would need more than the RAM for what no tiling or streaming splits ({need} B, {ram_bytes - need} B "
                f"under: {holds}), but the first layer reads it whole from RAM. What would fit: the input read patch "
                "by patch (the first layers frozen with --train, so that they can be tiled), 8-bit inputs and "
                "activations (a quarter), a smaller input or --batch-size.")
    room = ram_bytes - (reserved_bytes - x) - b.state_bytes
    fits = (f"at most {room} B of tensors there, {room / tensors:.0%} of what it holds (the trained layers' "
            "activations and gradients, which grow with the batch and the input's area; 8-bit ones take a quarter)"
            if room > 0 else "less training state: the trainable weights, their optimizer state and the buffers "
            "alone fill what the stack and the runtime leave")
    even = "" if stored else " even were the input read from storage patch by patch"
    return (f"{head}, and no plan holds less than {need} B{even}: {holds}, {max(need - ram_bytes, 0)} B over: only a "
            "frozen forward prefix is computed patch by patch, only frozen weights are streamed and only a CNN head "
            "of a frozen conv, a trained batch norm and a mean is computed by blocks of channels, so nothing splits "
            f"it. What would fit: {fits}; or fewer trained parameters with --train, or narrower layers there.")


def _dtype(g: TrainingGraph) -> str:
    kinds = sorted({n.dtype for n in g.nodes if n.kind == "forward" and n.dtype})
    return " and ".join(kinds) or "float32"
