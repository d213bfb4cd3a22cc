"""Liveness of every tensor in the training DAG: what the schedulers decide about, and what is fixed.

A *decision tensor* is an output of the input or of a forward node that some backward stage still needs,
directly or to recompute something it needs. Everything else has a fixed life: from the stage that
produces it to the stage of its last reader (gradients, labels, batch-norm statistics, forward tensors
used only in the forward pass). The memory model: a tensor is resident from the step that makes it
(compute, recompute, page-in) to the end of the stage that frees it; the peak of stage t is reached while
node t runs: everything resident, plus node t's output and workspace. A node that writes its output into an
operand dying there (graph/inplace.py) adds no bytes for it: the output takes the operand's (`shared`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .ir import TrainingGraph


@dataclass
class Liveness:
    T: int  # stages
    L: int  # the loss stage
    size: dict[str, int]
    prod: dict[str, int]  # first stage at which a tensor exists
    end: dict[str, int]  # fixed tensors: last stage alive; decision tensors: last forward-pass use (<= L)
    decision: list[str]  # decision tensors in forward order
    window_end: dict[str, int]  # decision tensor -> last backward stage that needs it (E_i)
    recompute_until: dict[str, int]  # decision tensor -> last stage a recompute is exact (before its SGD)
    needs: dict[int, list[str]] = field(default_factory=dict)  # backward stage -> decision tensors it reads
    inputs_of: dict[str, list[str]] = field(default_factory=dict)  # tensor -> decision tensors it is made of
    static: list[int] = field(default_factory=list)  # bytes fixed at each stage's peak
    state_bytes: int = 0
    max_workspace_bytes: int = 0  # the largest transient: a layer's gradients while fused SGD applies them
    shared: dict[int, int] = field(default_factory=dict)  # stage -> bytes its output takes from a dying operand

    @property
    def fixed_bytes(self) -> int:
        """What no schedule can avoid besides activations: state plus the largest gradient workspace."""
        return self.state_bytes + self.max_workspace_bytes

    def before_node(self, g, t: int) -> int:
        """Fixed bytes during stage t before node t runs (its output and workspace do not exist yet):
        what recomputes and page-ins of the stage stand on (an operand the node writes into is still its own)."""
        return self.static[t] - g.nodes[t].transient_bytes - g.nodes[t].bytes + self.shared.get(t, 0)

    @property
    def B0(self) -> int:
        """The first backward stage."""
        return self.L + 1

    def recomputable(self, name: str) -> bool:
        return self.recompute_until.get(name, -1) >= self.B0


def analyze(g: TrainingGraph) -> Liveness:
    T, L = len(g.nodes), g.loss_stage
    users = g.consumers()
    size = {n.name: n.bytes for n in g.nodes}
    prod = {n.name: t for t, n in enumerate(g.nodes)}
    update_stage = {}  # forward node -> the first stage that updates one of its parameters
    param_update = {}  # parameter -> the stage of its optimizer step
    for t, n in enumerate(g.nodes):
        for p in n.updates:
            param_update.setdefault(p, t)
    for n in g.nodes:
        stages = [param_update[p] for p in n.params if p in param_update]
        if stages and n.kind in ("forward", "loss"):
            update_stage[n.name] = min(stages + [update_stage.get(n.name, len(g.nodes))])
        if n.aux_of:
            size[f"{n.aux_of}.aux"] = g.node(n.aux_of).aux_bytes

    # Last backward need of each forward tensor, through recompute chains (reverse topological order).
    window_end: dict[str, int] = {}
    for n in reversed(g.nodes[: L + 1]):
        if n.kind not in ("input", "forward") or n.bytes == 0:
            continue
        direct = [s for s in users[n.name] if s > L]
        via = [window_end[g.nodes[s].name] for s in users[n.name]
               if s <= L and g.nodes[s].name in window_end and g.nodes[s].kind == "forward"]
        e = max(direct + via, default=-1)
        if e > L:
            window_end[n.name] = e
    decision = [n.name for n in g.nodes[: L + 1] if n.name in window_end]
    dset = set(decision)

    end: dict[str, int] = {}
    for t, n in enumerate(g.nodes):
        uses = users[n.name]
        if n.name in dset:
            end[n.name] = max([s for s in uses if s <= L] + [t])
        else:
            end[n.name] = max(uses + [t])
        if n.aux_of:  # the statistics live from the forward node to the backward node that reads them
            end[f"{n.aux_of}.aux"] = t
            prod[f"{n.aux_of}.aux"] = prod[n.aux_of]
    for n in g.nodes:  # aux never read by a backward node: freed with its stage
        if n.aux_bytes and f"{n.name}.aux" not in end:
            size[f"{n.name}.aux"] = n.aux_bytes
            prod[f"{n.name}.aux"] = prod[n.name]
            end[f"{n.name}.aux"] = prod[n.name]

    recompute_until = {}
    for name in decision:
        node = g.node(name)
        if node.recomputable:
            # An operand with a fixed life (the labels; nothing a schedule decides about) is gone after its last
            # reader: a recompute after that would read a freed tensor.
            fixed = [end[r.name] for r in node.inputs if r.name not in dset and size.get(r.name, 0)]
            if "recompute" in node.attrs:  # it recomputes from its own statistics: only while they are held
                fixed.append(end[f"{name}.aux"])
            recompute_until[name] = min([window_end[name], update_stage.get(name, T)] + fixed)
    needs = {t: [r.name for r in g.nodes[t].inputs if r.name in dset] for t in range(L + 1, T)}
    needs = {t: list(dict.fromkeys(v)) for t, v in needs.items()}
    inputs_of = {name: list(dict.fromkeys(r.name for r in g.node(name).inputs if r.name in dset))
                 for name in decision}

    state = g.state_bytes
    static = [state + g.nodes[t].transient_bytes for t in range(T)]
    for name, s in size.items():
        if s == 0:
            continue
        lo, hi = prod[name], end[name]
        for t in range(lo, hi + 1):
            static[t] += s
    # The output written into an operand that dies with the stage: one tensor's bytes there, not two.
    shared = {t: size[n.into] for t, n in enumerate(g.nodes) if n.into is not None}
    for t, s in shared.items():
        x = g.nodes[t].into  # only a tensor with a fixed life that ends here can be written over
        if x in dset or end[x] != t:
            why = "a schedule decides about" if x in dset else f"is read until stage {end[x]}"
            raise ValueError(f"node {g.nodes[t].name} writes into {x}, which {why}")
        static[t] -= s
    return Liveness(T=T, L=L, size=size, prod=prod, end=end, decision=decision, window_end=window_end,
                    recompute_until=recompute_until, needs=needs, inputs_of=inputs_of, static=static,
                    state_bytes=state, max_workspace_bytes=max(n.transient_bytes for n in g.nodes), shared=shared)
