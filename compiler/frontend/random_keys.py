"""Every random draw of a training step, keyed so that the plan and the exactness reference draw the same numbers.

A draw is an aten op torch tags `nondeterministic_seeded` (dropout, bernoulli, rand, ... and an attention kernel
whose `dropout_p` is not 0). The runtime runs each such node under a generator seeded by (seed, step, key), so a
recompute draws again what the first computation drew; the reference, plain autograd on the user's model, draws
each of its random ops from the generator of the same key.

Keys come from the modules that draw: an nn.Dropout by its name; an F.dropout call by the module whose forward
calls it (`enc:F.dropout`; `F.dropout` in the model's own forward); any other random op by its module and op
(`h.0.attn:native_dropout`, the dropout inside attention; `blocks.1.drop_path:bernoulli_`, a drop-path's mask);
`#k` marks a key's k-th draw of a step. One forward of the model records the keys in the order it draws
(`KeyedRandom` with `calls`), and the k-th random node of the traced graph takes the k-th key (`graph_keys`).
"""
from __future__ import annotations

import contextlib

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

_SEEDED = torch.Tag.nondeterministic_seeded


def draws_random(op, args=(), kwargs=None) -> bool:
    """Whether an aten op call draws random numbers: torch's tag, less an attention kernel with `dropout_p` 0 (CPU
    flash attention carries the tag for the dropout it may do) and a backward, which replays its forward's draw."""
    if not isinstance(op, torch._ops.OpOverload) or _SEEDED not in op.tags or "backward" in op.name():
        return False
    names = [a.name for a in op._schema.arguments]
    if "dropout_p" in names:
        i = names.index("dropout_p")
        p = (kwargs or {}).get("dropout_p", args[i] if i < len(args) else 0.0)
        return not (isinstance(p, (int, float)) and p == 0)
    return True


def _dropout_args(func, args, kwargs) -> tuple:
    """(input, p, training) of an F.dropout(input, p=0.5, training=True, inplace=False) or
    torch.dropout(input, p, train) call."""
    names = ("input", "p", "training") if func is F.dropout else ("input", "p", "train")
    bound = dict(zip(names, args))
    bound.update({k: v for k, v in kwargs.items() if k in names})
    return bound.get("input"), bound.get("p", 0.5), bound.get(names[2], True)


def _sdpa_dropout(args, kwargs) -> float:
    p = kwargs.get("dropout_p", args[4] if len(args) > 4 else 0.0)
    return p if isinstance(p, (int, float)) else 0.0


class _Draws:
    """What both modes share: the modules running (outermost first), and the draws of this step."""

    def __init__(self, model: nn.Module, calls: list | None, clock, hashed: bool) -> None:
        self.model, self.calls, self.clock, self.hashed = model, calls, clock, hashed
        self.stack: list[tuple[str, nn.Module]] = []
        self.counts: dict[str, int] = {}  # record mode: draws of each key so far
        self.pending: str | None = None  # the key an F.dropout call gives the draw it makes

    def module(self) -> tuple[str, nn.Module | None]:
        return self.stack[-1] if self.stack else ("", None)

    def take(self, key: str) -> str:
        """The key of this draw, `#k` added for a key's k-th draw in the step; recorded when recording."""
        counts = self.counts if self.clock is None else self.clock[2]
        counts[key] = counts.get(key, 0) + 1
        key = key if counts[key] == 1 else f"{key}#{counts[key]}"
        if self.calls is not None:
            self.calls.append(key)
        return key


class _Functional(TorchFunctionMode):
    """F.dropout (and torch.dropout) and attention with a dropout run under the Python dispatcher, as the trace runs
    them: a dropout is then torch's native_dropout, the op the graph holds, rounding for rounding (eager's C++ path
    draws with bernoulli_ and scales apart; an in-place dropout runs that path in both). An F.dropout's draw is keyed
    by the module that calls it."""

    def __init__(self, draws: _Draws) -> None:
        super().__init__()
        self.d = draws

    def __torch_function__(self, func, types, args=(), kwargs=None):
        from torch._dispatch.python import enable_python_dispatcher

        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention and _sdpa_dropout(args, kwargs) > 0:
            with enable_python_dispatcher():
                return func(*args, **kwargs)
        if func is not F.dropout and func is not torch.dropout:
            return func(*args, **kwargs)
        x, p, training = _dropout_args(func, args, kwargs)
        if not isinstance(x, torch.Tensor) or not isinstance(p, (int, float)) or not 0 < p < 1 or not training:
            return func(*args, **kwargs)  # the identity, or torch's own message for a bad p
        name, mod = self.d.module()
        self.d.pending = name if isinstance(mod, nn.Dropout) else f"{name}:F.dropout" if name else "F.dropout"
        try:
            with enable_python_dispatcher():
                return func(*args, **kwargs)
        finally:
            self.d.pending = None


class _Ops(TorchDispatchMode):
    """Every random aten op: drawn as it is when recording, else from the generator of (seed, step, key), or (hashed)
    a native_dropout as the C runtime draws it. Keyed by the F.dropout that makes it, else by its module and op."""

    def __init__(self, draws: _Draws) -> None:
        super().__init__()
        self.d = draws

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not draws_random(func, args, kwargs):
            return func(*args, **kwargs)
        name, _ = self.d.module()
        op = func._schema.name.split("::")[-1]
        key = self.d.take(self.d.pending or (f"{name}:{op}" if name else op))
        self.d.pending = None
        if self.d.clock is None:
            return func(*args, **kwargs)
        if self.d.hashed and func is torch.ops.aten.native_dropout.default:
            return _hashed_dropout(self.d.clock, key, *args[:2])
        from edgetrain.runtime.python.aten_call import seeded

        seed, step, _ = self.d.clock
        x = next((a for a in args if isinstance(a, torch.Tensor)), None)
        device = x.device if x is not None else torch.device(kwargs.get("device") or "cpu")  # torch.rand(..., device=)
        with seeded(seed, step, key, device):
            return func(*args, **kwargs)


def _hashed_dropout(clock, key: str, x: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The C runtime's dropout (runtime/c/kernels/dropout.h): its hashed mask, and x * keep * scale."""
    from . import dropout_mask

    seed, step, _ = clock
    keep = dropout_mask.keep_mask(seed, step, key, p, x.numel())
    m = torch.from_numpy(keep).to(device=x.device).reshape(x.shape)
    return x * m.to(x.dtype) * dropout_mask.scale(p), m


class KeyedRandom:
    """Every random draw of a model's forward, keyed by the module that draws it.

    `calls` given: record the keys in the order drawn (the ops run as they are). `clock` given ([seed, step,
    counts], counts reset per step): draw each from the generator the runtime seeds for the same key, or
    (`hashed`, for C firmware) a dropout from the C runtime's hashed mask."""

    def __init__(self, model: nn.Module, calls: list | None = None, clock=None, hashed: bool = False) -> None:
        self.d = _Draws(model, calls, clock, hashed)
        self._stack: contextlib.ExitStack | None = None

    def __enter__(self):
        stack = contextlib.ExitStack()
        for name, m in self.d.model.named_modules():
            if name:
                stack.callback(m.register_forward_pre_hook(
                    lambda mod, args, name=name: self.d.stack.append((name, mod))).remove)
                stack.callback(m.register_forward_hook(lambda *_: _pop(self.d.stack), always_call=True).remove)
        stack.enter_context(_Functional(self.d))
        stack.enter_context(_Ops(self.d))
        self._stack = stack
        return self

    def __exit__(self, *exc):
        stack, self._stack = self._stack, None
        return stack.__exit__(*exc)


def _pop(stack: list) -> None:
    stack.pop()  # a forward hook that returned the popped entry would replace the module's output


def random_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    """The graph's random ops, in the order the trace ran them."""
    return [n for n in gm.graph.nodes if n.op == "call_function" and draws_random(n.target, n.args, n.kwargs)]


def graph_keys(gm: fx.GraphModule, calls: list[str]) -> dict[str, str]:
    """The k-th random node of the graph takes the k-th key of a forward's draws; none when the two do not pair
    one to one (the nodes then keep their own names, which `run --check` refuses to compare)."""
    nodes = random_nodes(gm)
    if len(calls) != len(nodes):
        return {}
    return {n.name: key for n, key in zip(nodes, calls)}
