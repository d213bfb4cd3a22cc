"""Run one aten op of a plan: the op named in the plan, its literal arguments with the plan's tensors put in.
A `Call` reads the literal arguments once; `run` puts in each call's tensors.

A plan's arguments are JSON: numbers, lists, None, and markers for what is not a literal:
{"$t": k} the k-th tensor operand, {"$p": name} a parameter, {"$b": name} a buffer (each with an optional
"view" chain), {"$aux": k} item k of the statistics the forward node kept for this backward node,
{"$empty": shape, "dtype": ...} a tensor with no elements, {"$own": true} (in an op fused after the node's
first op) what that first op holds,
{"$dtype": "float32"}, {"$device": ...} (the runtime's own device), {"$layout": ...}, {"$mf": ...},
{"$float": "-inf"} (a float JSON cannot write).
A view chain is a list of [op, args] (an aten view op applied to the tensor) or ["item", k].
"""
from __future__ import annotations

import contextlib
import zlib
from functools import lru_cache

import torch

from .kernel_scratch import CONVOLUTION_BACKWARD, MASK_AT


@lru_cache(maxsize=None)
def resolve(op: str):
    """`aten.convolution.default` -> torch.ops.aten.convolution.default."""
    try:
        ns, name, overload = op.split(".")
        return getattr(getattr(getattr(torch.ops, ns), name), overload)
    except (ValueError, AttributeError):
        raise KeyError(f"no aten op named '{op}' in this torch ({torch.__version__})") from None


@lru_cache(maxsize=None)
def _kernel(op: str):
    """The op's C++ entry point (what OpOverload.__call__ forwards to, without that Python frame)."""
    return resolve(op)._op


def seed_for(seed: int, step: int, key: str) -> int:
    return zlib.crc32(f"{int(seed)}:{int(step)}:{key}".encode())


@contextlib.contextmanager
def seeded(seed: int, step: int, key: str, device: torch.device):
    """Draw random numbers from a generator of their own, fixed by (seed, step, key): a node that draws (the plan gives
    it a `seed_key`) draws the same numbers on a recompute, and the exactness reference can draw them too."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices, device_type=device.type):
        torch.manual_seed(seed_for(seed, step, key))
        yield


def prepared_view(view) -> tuple | None:
    """A view chain read once: per step (None, item index) or (the view op's kernel, its other arguments)."""
    if not view:
        return None
    return tuple((None, v[1]) if v[0] == "item" else
                 (_kernel(v[0]), tuple(_plain(a) for a in (v[1] if len(v) > 1 else ()))) for v in view)


def view_of(t, steps) -> torch.Tensor:
    """A tensor (or an item of a tuple) seen through a prepared view chain; views never copy."""
    for fn, a in steps:
        t = t[a] if fn is None else fn(t, *a)
    return t


def apply_view(t, view) -> torch.Tensor:
    """A tensor (or an item of a tuple) seen through a view chain; views never copy."""
    return view_of(t, prepared_view(view) or ())


def _plain(a):
    """A view argument: lists stay lists (aten takes int[] as a list)."""
    if isinstance(a, tuple):
        return [_plain(x) for x in a]
    return a


_SPECIAL = {
    "$dtype": lambda v, dev: getattr(torch, v),
    "$device": lambda v, dev: dev,
    "$layout": lambda v, dev: getattr(torch, v),
    "$mf": lambda v, dev: getattr(torch, v),
    "$float": lambda v, dev: float(v),  # inf, -inf or nan, which JSON cannot write
}


def fill(template, tensors, params, buffers, aux, device, own=None):
    """The op's arguments: the template with each marker replaced by its tensor or value."""
    kind = type(template)
    if kind is list:  # an op's argument list: operands and plain literals inline (hundreds of ops a step)
        out = []
        for v in template:
            k = type(v)
            if k is dict and "$t" in v:
                out.append(tensors[v["$t"]])
            elif k is int or k is float or k is bool or v is None:
                out.append(v)
            else:
                out.append(fill(v, tensors, params, buffers, aux, device, own))
        return out
    if isinstance(template, dict):
        if "$t" in template:
            return tensors[template["$t"]]
        if "$own" in template:  # an op fused after another reads what that one made
            return apply_view(own, template.get("view"))
        if "$p" in template:
            return apply_view(params[template["$p"]], template.get("view"))
        if "$b" in template:
            return apply_view(buffers[template["$b"]], template.get("view"))
        if "$aux" in template:
            return aux[template["$aux"]]
        if "$empty" in template:  # a tensor with no elements
            return torch.empty(template["$empty"], dtype=getattr(torch, template["dtype"]), device=device)
        for key, make in _SPECIAL.items():
            if key in template:
                return make(template[key], device)
        return {k: fill(v, tensors, params, buffers, aux, device, own) for k, v in template.items()}
    if isinstance(template, (list, tuple)):
        return [fill(v, tensors, params, buffers, aux, device, own) for v in template]
    return template


PER_CALL = "per call"  # a mask read from each call's arguments


def _per_call(v) -> bool:
    """Whether an argument template holds what differs from call to call: an operand, an aux item, what a fused
    op's first op made, or a fresh empty tensor (parameters, buffers and literals do not)."""
    if isinstance(v, dict):
        return any(k in v for k in ("$t", "$aux", "$own", "$empty")) or any(_per_call(x) for x in v.values())
    if isinstance(v, (list, tuple)):
        return any(_per_call(x) for x in v)
    return False


class Call:
    """One aten op of a plan node, with what is the same at every call read once (`prepare`): its kernel, its
    arguments with literals, parameters and buffers put in (they are updated in place, never replaced), and
    where each operand goes. Only operands, aux items and the like are filled per call (`run`). KeyError names
    an unknown op, parameter or buffer."""
    __slots__ = ("op", "fn", "args", "operands", "slots", "kwargs", "kwargs_template", "seed_key", "mask",
                 "params", "buffers", "device")

    def __init__(self, op: str, attrs: dict, params: dict, buffers: dict, device) -> None:
        self.op, self.fn = op, _kernel(op)
        self.params, self.buffers, self.device = params, buffers, device
        self.args, operands, slots = [], [], []
        for pos, v in enumerate(attrs.get("args", [])):
            if type(v) is dict and "$t" in v:  # most arguments that change: an operand as it is
                operands.append((pos, v["$t"]))
                v = None
            elif _per_call(v):
                slots.append((pos, v))
                v = None
            else:
                v = fill(v, (), params, buffers, None, device)
            self.args.append(v)
        self.operands, self.slots = tuple(operands), tuple(slots)
        kwargs = attrs.get("kwargs") or {}
        self.kwargs_template = kwargs if _per_call(kwargs) else None
        self.kwargs = {} if self.kwargs_template is not None else fill(kwargs, (), params, buffers, None, device)
        self.seed_key = (attrs["seed_key"],) if "seed_key" in attrs else None
        self.mask = None  # oneDNN returns gradients its output mask left out: the kernel's scratch
        if op == CONVOLUTION_BACKWARD:
            template = attrs.get("args", [])
            mask = template[MASK_AT] if len(template) > MASK_AT else kwargs.get("output_mask")
            static = isinstance(mask, list) and not _per_call(mask)  # else read from each call's arguments
            self.mask = tuple(fill(mask, (), params, buffers, None, device)) if static else PER_CALL


def run(c: Call, ins: list, aux, seed: int, step: int, own=None) -> list:
    """Run a prepared op on this call's operands; returns every output of the op (a one-element list for a single
    tensor). `own`: what the node's first op holds, for the ops fused after it."""
    args = c.args
    if c.operands or c.slots:
        args = args.copy()
        for pos, k in c.operands:
            args[pos] = ins[k]
        for pos, v in c.slots:
            args[pos] = fill(v, ins, c.params, c.buffers, aux, c.device, own)
    kwargs = c.kwargs
    if c.kwargs_template is not None:
        kwargs = fill(c.kwargs_template, ins, c.params, c.buffers, aux, c.device, own)
    if c.seed_key is not None:
        with seeded(seed, step, c.seed_key[0], c.device):
            res = c.fn(*args, **kwargs)
    else:
        res = c.fn(*args, **kwargs)
    outs = list(res) if isinstance(res, (tuple, list)) else [res]
    if c.mask is not None:
        mask = c.mask if c.mask is not PER_CALL else (args[MASK_AT] if len(args) > MASK_AT else kwargs["output_mask"])
        outs = [o if want else None for o, want in zip(outs, mask)]
    return outs


def held_items(keep) -> tuple:
    """The output items a node holds, by its `keep`: the single result (None), one output (an index), several
    (a list of indices), or none ("none" or [])."""
    if keep is None:
        return (0,)
    if keep == "none":
        return ()
    return tuple(keep) if isinstance(keep, list) else (keep,)


# An output an op drops that is at most this share of its largest output (a batch-norm's new running
# statistics beside its activations) counts as the op's internal scratch, which no memory model counts.
SCRATCH_SHARE = 64


def dropped_bytes(outs: list, keep, aux=()) -> int:
    """Bytes of the outputs an op makes and the node drops at once (its transient), the scratch excepted.
    `outs` may be real or fake tensors: the compiler and the runtime count with this one rule."""
    return dropped_among(outs, {*held_items(keep), *aux})


def dropped_among(outs: list, kept) -> int:
    """`dropped_bytes` with the items the node keeps (held or aux) given as a set."""
    sizes = [o.nbytes if isinstance(o, torch.Tensor) else 0 for o in outs]  # numel x element size
    largest = max(sizes, default=0)
    return sum(b for k, b in enumerate(sizes) if k not in kept and b * SCRATCH_SHARE > largest)
