"""Run one aten op of a plan: the op named in the plan, its literal arguments with the plan's tensors put in.

A plan's arguments are JSON: numbers, lists, None, and markers for what is not a literal:
{"$t": k} the k-th tensor operand, {"$p": name} a parameter, {"$b": name} a buffer (each with an optional
"view" chain), {"$aux": k} item k of the statistics the forward node kept for this backward node,
{"$empty": shape, "dtype": ...} a tensor with no elements, {"$own": true} (in an op fused after the node's
first op) what that first op holds,
{"$dtype": "float32"}, {"$device": ...} (the runtime's own device), {"$layout": ...}, {"$mf": ...}.
A view chain is a list of [op, args] (an aten view op applied to the tensor) or ["item", k].
"""
from __future__ import annotations

import contextlib
import zlib
from functools import lru_cache

import torch

# Ops that draw random numbers: run under a generator seeded from (seed, step, node), so a recompute draws
# the same mask as the first computation and the exactness reference can draw it too.
RANDOM_OPS = frozenset({"aten.native_dropout.default", "aten.bernoulli.default", "aten.bernoulli.p",
                        "aten.rand_like.default", "aten.randn_like.default", "aten.rand.default",
                        "aten.randn.default", "aten.randint_like.default"})


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
    """Draw random numbers from a generator of their own, fixed by (seed, step, key)."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices, device_type=device.type):
        torch.manual_seed(seed_for(seed, step, key))
        yield


def apply_view(t, view) -> torch.Tensor:
    """A tensor (or an item of a tuple) seen through a view chain; views never copy."""
    for v in view or ():
        if v[0] == "item":
            t = t[v[1]]
        else:
            args = v[1] if len(v) > 1 else ()
            t = resolve(v[0])(t, *[_plain(a) for a in args])
    return t


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


CONVOLUTION_BACKWARD = "aten.convolution_backward.default"


def call(op: str, attrs: dict, ins: list, params: dict, buffers: dict, aux, device, seed: int, step: int,
         own=None) -> list:
    """Run a plan node's op; returns every output of the op (a one-element list for a single tensor).
    `own`: what the node's first op holds, for the ops fused after it."""
    fn = _kernel(op)
    args = fill(attrs.get("args", []), ins, params, buffers, aux, device, own)
    kwargs = attrs.get("kwargs")
    kwargs = fill(kwargs, ins, params, buffers, aux, device, own) if kwargs else {}
    if "seed_key" in attrs:
        with seeded(seed, step, attrs["seed_key"], device):
            res = fn(*args, **kwargs)
    else:
        res = fn(*args, **kwargs)
    outs = list(res) if isinstance(res, (tuple, list)) else [res]
    if op == CONVOLUTION_BACKWARD:  # oneDNN returns gradients its output mask left out: the kernel's scratch
        mask = args[10] if len(args) > 10 else kwargs["output_mask"]
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


def held(outs: list, keep):
    """What the node keeps of its op's outputs (`held_items`): a tensor, a tuple of them (a list `keep`), or None."""
    items = held_items(keep)
    if not items:
        return None
    return tuple(outs[k] for k in items) if isinstance(keep, list) else outs[items[0]]


def update_value(outs: list, update: dict):
    """The tensor an update reads: an output of the op, through the update's view chain."""
    return apply_view(outs[0] if update.get("item") is None else outs[update["item"]], update.get("view"))


# An output an op drops that is at most this share of its largest output (a batch-norm's new running
# statistics beside its activations) counts as the op's internal scratch, which no memory model counts.
SCRATCH_SHARE = 64


def dropped_bytes(outs: list, keep, aux=()) -> int:
    """Bytes of the outputs an op makes and the node drops at once (its transient), the scratch excepted.
    `outs` may be real or fake tensors: the compiler and the runtime count with this one rule."""
    sizes = [o.numel() * o.element_size() if isinstance(o, torch.Tensor) else 0 for o in outs]
    kept = {*held_items(keep), *aux}
    largest = max(sizes, default=0)
    return sum(b for k, b in enumerate(sizes) if k not in kept and b * SCRATCH_SHARE > largest)
