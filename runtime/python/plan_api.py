"""What a generated plan.py is written in: torch's ops called on named tensors, one line per schedule step.

    from edgetrain.runtime.python.plan_api import aten, buffer, out, param

    p_fc_weight = param("fc.weight")                 # bound once, at import

    def train_step(rt):
        input = rt.load_input()
        addmm = rt.call("addmm", aten.addmm.default, p_fc_bias, input, p_fc_weight.view(aten.t.default))
        relu = rt.call("relu", aten.relu.default, addmm, overwrite=addmm)
        rt.free(addmm)  # last use

A call names its node, the aten op (torch.ops.aten's own object) and the op's arguments as torch takes them:
tensors the plan holds (`Ref`, returned by `rt.call`), parameters and buffers (`param`, `buffer`), literals,
torch's dtypes and formats, `rt.device`. What the schedule says about the call beyond the op's arguments comes
as keywords (`NODE_KEYWORDS`); every other keyword is the op's own. `node_of` turns a call back into the
schedule node's form (operands, attrs, aux_of; runtime/python/aten_call.py's markers), which the runtime prepares
once (prepared.py): the readable call and the schedule's node run the same kernels on the same arguments.
"""
from __future__ import annotations

import math
import types

import torch

from . import patch_forward  # noqa: F401  registers edgetrain.patch_forward, which plans may call
from . import q8_ops  # noqa: F401  registers edgetrain.q8_*, an int8 prefix's ops
from .fused_kernels import FUSED_OP


def _lazy(name: str, find) -> types.ModuleType:
    """A namespace whose attributes `find` makes on first use and keeps: a module, so a kept one is read at a
    module's attribute speed (torch.ops.aten resolves every `aten.<op>` anew: 0.4 us, a thousand a step)."""
    ns = types.ModuleType(name)

    def __getattr__(attr: str):  # only for an attribute not kept yet
        if attr.startswith("__"):
            raise AttributeError(attr)
        value = find(attr)
        setattr(ns, attr, value)
        return value

    ns.__getattr__ = __getattr__
    return ns


# aten.relu.default is torch's own OpOverload, looked up once
aten = _lazy("aten", lambda op: _lazy(f"aten.{op}", lambda overload: getattr(getattr(torch.ops.aten, op), overload)))

# Keywords of `rt.call` that describe the node, not the op (no aten op has an argument of these names). `q8`: an int8
# node's quantisation (its attrs["q8"]), which the runtime hands its op (q8_ops.py) as JSON.
NODE_KEYWORDS = frozenset({"keep", "aux", "updates", "then", "scratch", "overwrite", "into", "loss_item", "seed_key",
                           "q8"})


def _view(seen: dict, prefix: tuple, op, args: tuple) -> "View":
    """prefix seen through (op, args), kept in `seen` where the arguments are tuples and numbers."""
    key = (id(op), args)  # torch's registered ops live as long as the process; hashing one is slow
    try:
        return seen[key]
    except KeyError:
        v = seen[key] = View((*prefix, (op, args)))
        return v
    except TypeError:  # an argument that is a list: a view of its own each time
        return View((*prefix, (op, args)))


class _Viewable:
    """What a plan reads through views (`x.view(op, *args)`) and items (`x[k]`). A view whose arguments are
    tuples and numbers is kept: the same object at every step, so a call compares with the one it was prepared
    from at once, and the plan builds nothing per step for it."""
    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: dict = {}

    def __getitem__(self, k: int) -> "View":
        """Output k of a node that holds several (a tuple)."""
        v = self._seen.get(k)
        if v is None:
            v = self._seen[k] = View((self, ("item", k)))
        return v

    def view(self, op, *args) -> "View":
        """Seen through an aten view op (it aliases the tensor, never copies)."""
        try:  # `_view`, inlined: a plan reads hundreds of views a step
            return self._seen[id(op), args]
        except (KeyError, TypeError):
            return _view(self._seen, (self,), op, args)


class Ref(_Viewable):
    """A tensor the plan holds, by its node's name: a handle, never the tensor (the runtime holds that)."""
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def __repr__(self) -> str:
        return f"<tensor {self.name}>"


class AuxRef(Ref):
    """The statistics a forward node keeps for its backward node (`aux=`); `[k]` reads item k of them."""
    __slots__ = ()

    def __getitem__(self, k: int) -> "AuxItem":
        item = self._seen.get(k)
        if item is None:
            item = self._seen[k] = AuxItem((self, k))
        return item


class _State(_Viewable):
    __slots__ = ("name",)
    kind = ""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def __repr__(self) -> str:
        return f"{self.kind}({self.name!r})"


class Param(_State):
    __slots__ = ()
    kind = "param"


class Buffer(_State):
    __slots__ = ()
    kind = "buffer"


def param(name: str) -> Param:
    """A parameter of the model, by its `named_parameters()` name."""
    return Param(name)


def buffer(name: str) -> Buffer:
    """A buffer of the model, by its `named_buffers()` name."""
    return Buffer(name)


class _Outputs(_Viewable):
    """`out`: the output of the op a keyword belongs to, `out[k]` item k of its outputs (`updates=` reads its
    gradients there)."""
    __slots__ = ()

    def view(self, op, *args) -> "View":
        return _view(self._seen, (self, ("item", None)), op, args)

    def __repr__(self) -> str:
        return "out"


class _Held(_Viewable):
    """`held`: in an op fused after a node's own (`then=`), what the node's own op holds."""
    __slots__ = ()

    def __repr__(self) -> str:
        return "held"


out, held = _Outputs(), _Held()


class View(tuple):
    """(base, step, ...): a tensor seen through a chain of steps, each ("item", k) or (aten view op, args).
    A tuple, so that comparing a call with the one it was prepared from stays in C; it keeps the views made
    from it in its `__dict__`."""

    def view(self, op, *args) -> "View":
        try:  # `_view`, inlined: a plan reads hundreds of views a step
            return self._seen[id(op), args]
        except AttributeError:
            self._seen = {}
        except (KeyError, TypeError):
            pass
        return _view(self._seen, self, op, args)

    def item(self, k: int) -> "View":
        """Output k of a view that yields several (`unbind`, `split`): `[k]` would index this tuple itself."""
        try:
            return self._seen["item", k]
        except AttributeError:
            self._seen = {}
        except KeyError:
            pass
        v = self._seen["item", k] = View((*self, ("item", k)))
        return v


class AuxItem(tuple):
    """(aux ref, k): item k of the statistics a forward node kept."""
    __slots__ = ()


class Empty(tuple):
    """(shape, dtype): a tensor with no elements, made where it is read."""
    __slots__ = ()


def empty(shape, dtype) -> Empty:
    return Empty((shape, dtype))


class Fused(tuple):
    """(op, args, keywords): an op run right after the node's own, holding nothing (`then=`)."""
    __slots__ = ()


def fused(op, *args, **keywords) -> Fused:
    return Fused((op, args, keywords))


class Kernel:
    """A fused node's kernel (`kernel(chain)`): its chain of pointwise aten ops in the schedule's form
    (runtime/python/fused_kernels.py), called like an op on the node's operands. Bound once, at import."""
    __slots__ = ("chain",)

    def __init__(self, chain: list) -> None:
        self.chain = chain

    def __repr__(self) -> str:
        return "kernel(" + ", ".join(s["op"] for s in self.chain) + ")"


def kernel(chain: list) -> Kernel:
    return Kernel(chain)


# -- a call back into the schedule node's form ---------------------------------------------------------------

def op_name(op) -> str:
    """`aten.relu.default` for torch.ops.aten.relu.default."""
    if not isinstance(op, torch._ops.OpOverload):
        raise TypeError(f"{op!r} is not a torch op overload (write aten.<op>.<overload>)")
    return str(op)


def _steps(chain) -> list:
    return [["item", s[1]] if s[0] == "item" else [op_name(s[0]), [_literal(a) for a in s[1]]] for s in chain]


def _literal(v):
    """A view op's argument or any literal as the schedule writes it."""
    if isinstance(v, bool) or v is None or isinstance(v, (int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else {"$float": repr(v)}
    if isinstance(v, (list, tuple)):  # a view's shape may be a tuple
        return [_literal(x) for x in v]
    if isinstance(v, torch.dtype):
        return {"$dtype": str(v).removeprefix("torch.")}
    if isinstance(v, torch.device):
        return {"$device": str(v)}
    if isinstance(v, torch.layout):
        return {"$layout": str(v).removeprefix("torch.")}
    if isinstance(v, torch.memory_format):
        return {"$mf": str(v).removeprefix("torch.")}
    raise TypeError(f"argument {v!r} of type {type(v).__name__} is not a literal a plan can pass")


class _Node:
    """The operands and the aux node a call reads, gathered while its arguments are converted."""

    def __init__(self) -> None:
        self.inputs: list = []
        self.aux_of: str | None = None

    def ref(self, ref: Ref, chain, reuse: bool) -> dict:
        entry = ref.name if not chain else {"t": ref.name, "view": _steps(chain)}
        if reuse and entry in self.inputs:  # an op fused after the node's own reads the node's operands
            return {"$t": self.inputs.index(entry)}
        self.inputs.append(entry)
        return {"$t": len(self.inputs) - 1}

    def arg(self, v, reuse: bool = False):
        kind = type(v)
        if kind is Ref:
            return self.ref(v, (), reuse)
        if kind is View:
            base, chain = v[0], v[1:]
            if type(base) is Ref:
                return self.ref(base, chain, reuse)
            if isinstance(base, _State):
                marker = {"$p" if base.kind == "param" else "$b": base.name}
            elif base is held:
                marker = {"$own": True}
            else:
                raise TypeError(f"{base!r} cannot be viewed in an op's arguments")
            return {**marker, "view": _steps(chain)}
        if isinstance(v, _State):
            return {"$p" if v.kind == "param" else "$b": v.name}
        if v is held:
            return {"$own": True}
        if kind is AuxItem:
            aux_of = v[0].name.removesuffix(".aux")
            if self.aux_of not in (None, aux_of):
                raise ValueError(f"reads the statistics of both '{self.aux_of}' and '{aux_of}'")
            self.aux_of = aux_of
            return {"$aux": v[1]}
        if kind is Empty:
            return {"$empty": list(v[0]), "dtype": str(v[1]).removeprefix("torch.")}
        if kind is list:
            return [self.arg(x, reuse) for x in v]
        if isinstance(v, _Viewable):
            raise TypeError(f"{v!r} cannot be an op's argument here")
        return _literal(v)

    def call(self, args, kwargs, reuse: bool = False) -> dict:
        attrs: dict = {"args": [self.arg(a, reuse) for a in args]}
        if kwargs:
            attrs["kwargs"] = {k: self.arg(v, reuse) for k, v in kwargs.items()}
        return attrs


def _updates(updates) -> list[dict]:
    """{param or buffer: out[k] (seen through views)} as the schedule's update list."""
    if not isinstance(updates, dict):
        raise TypeError("updates= is a dict {param or buffer: out[k]}")
    specs = []
    for target, src in updates.items():
        if src is out:
            src = View((out, ("item", None)))
        if not isinstance(target, _State) or type(src) is not View or src[0] is not out or src[1][0] != "item":
            raise TypeError(f"updates= maps a param or buffer to out or out[k], not {target!r}: {src!r}")
        spec: dict = {"item": src[1][1]}
        if len(src) > 2:
            spec["view"] = _steps(src[2:])
        spec[target.kind] = target.name
        specs.append(spec)
    return specs


def node_of(op, args: tuple, keywords: dict) -> tuple[str, list, dict, str | None]:
    """(op name, operands, attrs, aux_of) of a call: the schedule node it was written from. TypeError or
    ValueError names what the call cannot pass."""
    node = _Node()
    meta = {k: keywords[k] for k in keywords if k in NODE_KEYWORDS}
    attrs = node.call(args, {k: v for k, v in keywords.items() if k not in NODE_KEYWORDS})
    if type(op) is Kernel:
        if meta:
            raise TypeError(f"a fused kernel's call takes its operands only, not {sorted(meta)}")
        attrs["chain"] = op.chain
        return FUSED_OP, node.inputs, attrs, node.aux_of
    if "keep" in meta:
        attrs["keep"] = meta["keep"]
    if "aux" in meta:
        attrs["aux"] = list(meta["aux"])
    if "scratch" in meta:
        attrs["scratch"] = meta["scratch"]
    if "updates" in meta:
        attrs["updates"] = _updates(meta["updates"])
    if "seed_key" in meta:
        attrs["seed_key"] = meta["seed_key"]
    if "q8" in meta:
        attrs["q8"] = meta["q8"]
    if "loss_item" in meta:
        attrs["loss_item"] = meta["loss_item"]
    if "then" in meta:
        subs = []
        for f in meta["then"]:
            if type(f) is not Fused:
                raise TypeError(f"then= lists fused(op, ...) calls, not {f!r}")
            sub_op, sub_args, sub_kw = f
            sub_meta = {k: sub_kw[k] for k in sub_kw if k in NODE_KEYWORDS}
            if set(sub_meta) - {"updates", "scratch"}:
                raise TypeError(f"a fused op takes updates= and scratch= only, not {sorted(sub_meta)}")
            sub = {"op": op_name(sub_op),
                   **node.call(sub_args, {k: v for k, v in sub_kw.items() if k not in NODE_KEYWORDS}, reuse=True),
                   "keep": "none"}
            if "updates" in sub_meta:
                sub["updates"] = _updates(sub_meta["updates"])
            if "scratch" in sub_meta:
                sub["scratch"] = sub_meta["scratch"]
            subs.append(sub)
        attrs["then"] = subs
    if "overwrite" in meta:
        dying = meta["overwrite"]
        dying = list(dying) if isinstance(dying, (list, tuple)) else [dying]
        if any(type(r) is not Ref or r.name not in node.inputs for r in dying):
            raise ValueError(f"overwrite= names operands of the call as they are, not {dying!r}")
        attrs["dying"] = [node.inputs.index(r.name) for r in dying]
    if "into" in meta:
        r = meta["into"]
        if type(r) is not Ref or r.name not in node.inputs:
            raise ValueError(f"into= names an operand of the call as it is, not {r!r}")
        attrs["into"] = node.inputs.index(r.name)
    return op_name(op), node.inputs, attrs, node.aux_of
