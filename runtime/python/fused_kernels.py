"""Fused kernels: a chain of pointwise aten ops run as one generated kernel (torch's inductor), compiled at its
first call and kept for the process (per chain, device and operand layouts).

A fused node's attrs hold its chain: {"chain": [{"op", "args", "kwargs"}, ...]}, each step's arguments in
aten_call.py's markers, {"$t": k} the node's k-th operand and {"$c": j} the output of step j; the last step's
output is the node's. The kernel returns that one tensor, freshly allocated, and nothing else: the steps between
never exist in memory (inductor computes the chain in one loop), so the plan's ledger, which counts the node's
output alone, counts every byte the call allocates (tests/test_fused_kernels.py holds it to that).

A batch norm that recomputes from its held statistics (compiler/graph/norm_recompute.py) has two: its "chain"
is its first computation, torch's own ops run as they are (the batch norm, then its activation in place on its
output; {"$c": j, "item": i} item i of step j, a last {"returns": [...]} the node's outputs), and its "recompute"
{"args", "chain"} the normalise (and activation) pass as one generated kernel, its arguments the node's operand
and the statistics it kept ({"$aux": i}).

A generated kernel is not bitwise eager's (vectorised exp, reordered arithmetic): a plan with fused nodes is
checked against autograd within FUSED_RTOL (compiler/workbench/run.py says so in its report).
"""
from __future__ import annotations

import json

import torch

from . import aten_call

FUSED_OP = "fused.kernel"  # a plan node's op for a fused chain (not an aten op)
# The check's tolerance on a plan with fused kernels: inductor's float32 chains differ from eager's in the last
# bits (measured after 3 SGD steps: the peers Llama, 71 kernels, max relative error 1e-5, max absolute 6e-8;
# tests/user_models.py:gated_mlp 4e-7), kept 100x wider for longer runs and other models.
FUSED_RTOL, FUSED_ATOL = 1e-3, 1e-5

_COMPILED: dict[tuple, object] = {}  # (chain as JSON, device, operands' layouts) -> the compiled kernel


def _state_names(v, found: list) -> None:
    """The parameters and buffers a chain reads, in order of first reading ("$p"/"$b", name)."""
    if isinstance(v, dict):
        for key in ("$p", "$b"):
            if key in v and (key, v[key]) not in found:
                found.append((key, v[key]))
        for x in v.values():
            _state_names(x, found)
    elif isinstance(v, list):
        for x in v:
            _state_names(x, found)


def _chain_fn(chain: list, state: list, device):
    """The chain as a Python function of its operands and then the state it reads (aten ops called in order)."""
    returns = chain[-1]["returns"] if "returns" in chain[-1] else None
    steps = [(aten_call.resolve(s["op"]), s.get("args", []), s.get("kwargs") or {}) for s in chain if "op" in s]

    def put(v, ins, outs, n):
        if isinstance(v, dict):
            if "$c" in v:
                return outs[v["$c"]] if "item" not in v else outs[v["$c"]][v["item"]]
            if "$t" in v:
                return ins[v["$t"]]
            if "$p" in v or "$b" in v:  # a parameter or buffer: an input of the kernel, never a constant of it
                key = ("$p", v["$p"]) if "$p" in v else ("$b", v["$b"])
                t = ins[n + state.index(key)]
                for step in v.get("view") or ():
                    t = t[step[1]] if step[0] == "item" else \
                        aten_call.resolve(step[0])(t, *(step[1] if len(step) > 1 else ()))
                return t
            return aten_call.fill(v, ins, {}, {}, None, device)
        if isinstance(v, list):
            return [put(x, ins, outs, n) for x in v]
        return v

    def run(*ins):
        n = len(ins) - len(state)  # the node's operands, then its state
        outs = []
        for fn, args, kwargs in steps:
            outs.append(fn(*[put(a, ins, outs, n) for a in args],
                           **{k: put(v, ins, outs, n) for k, v in kwargs.items()}))
        return outs[-1] if returns is None else tuple(put(v, ins, outs, n) for v in returns)

    return run


class Kernel:
    """A chain's kernel: called on the node's operands; the parameters and buffers it reads are passed after
    them at each call (they change in place between steps). Inductor compiles it for the operands' layouts at
    the first call that has them, straight from the chain's FX graph (make_fx), without torch.compile's guards:
    a call costs ~10 us over the kernel where torch.compile's cost ~100 us, more than a fused chain of small
    tensors saves. `eager`: the aten ops one by one (eager's bits, each step's output allocated)."""

    def __init__(self, chain: list, params: dict, buffers: dict, device, eager: bool = False) -> None:
        names: list = []
        _state_names(chain, names)
        self.state = [params[n] if k == "$p" else buffers[n] for k, n in names]
        self.fn = _chain_fn(chain, names, device)
        self.eager = eager
        self.key = (json.dumps(chain, sort_keys=True), str(device))
        self.last = None  # (layouts, kernel) of the last call: a plan calls each node alike every step

    def __call__(self, *ins):
        args = (*ins, *self.state)
        if self.eager:
            return self.fn(*args)
        layouts = tuple((t.shape, t.stride(), t.dtype) for t in args)
        last = self.last
        if last is None or last[0] != layouts:
            last = self.last = (layouts, _compiled(self.key + (layouts,), self.fn, args))
        return last[1](*args)


def _compiled(key: tuple, fn, args: tuple):
    k = _COMPILED.get(key)
    if k is None:
        from torch.fx.experimental.proxy_tensor import make_fx

        k = _COMPILED[key] = torch._inductor.compile(make_fx(fn)(*args), list(args))
    return k


class Call(aten_call.Call):
    """A fused node's call in aten_call.Call's form: its arguments (operands, then aux items) passed to the kernel
    in order. `first`: the node's first computation, else a recompute (they differ where the node has a
    "recompute": a batch norm's first computation runs torch's ops, its recompute the generated kernel)."""

    def __init__(self, attrs: dict, params: dict, buffers: dict, device, eager: bool = False,
                 first: bool = True) -> None:
        self.op, self.params, self.buffers, self.device = FUSED_OP, params, buffers, device
        chain, args = attrs["chain"], attrs.get("args", [])
        again = attrs.get("recompute")
        if again is not None and first:
            eager = True  # the statistics and running statistics torch's own, bit for bit
        elif again is not None:
            chain, args = again["chain"], again["args"]
        self.fn = Kernel(chain, params, buffers, device, eager)
        self.args = [None] * len(args)
        self.operands = tuple((pos, v["$t"]) for pos, v in enumerate(args) if "$t" in v)
        self.slots = tuple((pos, v) for pos, v in enumerate(args) if "$t" not in v)  # aux items, per call
        self.kwargs, self.kwargs_template, self.seed_key, self.mask = {}, None, None, None
