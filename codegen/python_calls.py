"""A schedule node as a line of Python: its op called on named tensors (runtime/python/plan_api.py's language).

The node's operands become the plan's variables (named after their nodes), its attrs' markers become
parameters, buffers, views and torch's own objects, and what the schedule says beyond the op's arguments
becomes keywords. `plan_api.node_of` reads such a call back into the node it was written from (a test holds
the two to each other over the zoo's plans).
"""
from __future__ import annotations

import json
import keyword
import re

from edgetrain.runtime.python.fused_kernels import FUSED_OP
from edgetrain.runtime.python.plan_api import NODE_KEYWORDS

from .py_layout import Chain, Group, flat

# Names the plan itself uses: its globals, its imports and the builtins it calls.
_RESERVED = frozenset({"rt", "aten", "torch", "param", "buffer", "out", "held", "fused", "empty", "kernel", "PLAN",
                       "train_step", "float"}) | frozenset(keyword.kwlist)


class Names:
    """A unique Python identifier for every tensor, parameter and buffer name, the same for the same schedule,
    and what the plan's text uses: the parameters and buffers to bind, plan_api's markers, torch."""

    def __init__(self) -> None:
        self._of: dict[tuple[str, str], str] = {}
        self._taken: set[str] = set(_RESERVED)
        self.used: set = set()  # (kind, name) of parameters and buffers read; marker names; "torch"

    def declare(self, kind: str, name: str) -> str:
        key = (kind, name)
        if key not in self._of:
            base = {"param": "p_", "buffer": "b_"}.get(kind, "") + re.sub(r"\W", "_", name)
            if not base.isidentifier():
                base = "_" + base
            ident, k = base, 0
            while ident in self._taken:
                k += 1
                ident = f"{base}_{k}"
            self._taken.add(ident)
            self._of[key] = ident
        return self._of[key]

    def tensor(self, name: str) -> str:
        """A node's tensor ("relu"), or the statistics a node keeps ("bn.aux" -> bn_aux)."""
        return self.declare("tensor", name)

    def param(self, name: str) -> str:
        self.used.add(("param", name))
        return self.declare("param", name)

    def buffer(self, name: str) -> str:
        self.used.add(("buffer", name))
        return self.declare("buffer", name)

    def kernel(self, name: str) -> str:
        """The fused kernel of node `name`, bound at the plan's top."""
        self.used.add(("kernel", name))
        self.used.add("kernel")
        return self.declare("kernel", "k_" + name)

    def marker(self, word: str) -> str:
        self.used.add(word)
        return word

    def bound(self, kind: str) -> list[tuple[str, str]]:
        """(identifier, name) of every `kind` the plan reads, in the order declared."""
        return [(ident, name) for (k, name), ident in self._of.items() if k == kind and (k, name) in self.used]


def op_expr(op: str) -> str:
    """`aten.relu.default`; a part that is no identifier through getattr (the runtime refuses other
    namespaces than aten, naming the op)."""
    ns, *rest = op.split(".")
    expr = ns if ns == "aten" else f"torch.ops.{ns}"
    for part in rest:
        expr = f"{expr}.{part}" if part.isidentifier() and not keyword.iskeyword(part) else \
            f"getattr({expr}, {part!r})"
    return expr


def literal(v) -> str:
    """A plain value as Python (repr of a float round-trips exactly; strings in double quotes, escaped as JSON
    escapes them, which Python reads alike)."""
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, float) or isinstance(v, (bool, int)) or v is None:
        return repr(v)
    raise ValueError(f"{v!r} is not a literal of a plan")


class CallWriter:
    """Expressions of one node's call, its operands by the plan's variables."""

    def __init__(self, names: Names, node: dict) -> None:
        self.names, self.node = names, node

    def chain(self, base: str, view, lead: str = ""):
        """`base` seen through a view chain: items as [k], views as .view(op, args) (a `Chain` when several)."""
        links = []
        for step in view or ():
            if step[0] == "item" and not links:
                base = f"{base}[{step[1]}]"
            elif step[0] == "item":  # an output of a view that yields several (unbind, split)
                links.append(f".item({step[1]})")
            else:
                args = [op_expr(step[0]), *(self.view_arg(a) for a in (step[1] if len(step) > 1 else ()))]
                links.append(f".view({', '.join(args)})")
        return Chain(lead, base, tuple(links)) if len(links) > 1 else lead + base + "".join(links)

    def view_arg(self, a) -> str:
        """A view op's argument, its lists as tuples: the runtime keeps such a view (plan_api.py)."""
        if isinstance(a, list):
            return "(" + ", ".join(self.view_arg(x) for x in a) + ("," if len(a) == 1 else "") + ")"
        return flat(self.arg(a))

    def operand(self, ref) -> str:
        if isinstance(ref, str):
            return self.names.tensor(ref)
        return self.chain(self.names.tensor(ref["t"]), ref.get("view"))

    def arg(self, v):
        if isinstance(v, list):
            return Group("[", tuple(self.arg(x) for x in v), "]")
        if not isinstance(v, dict):
            return literal(v)
        if "$t" in v:
            return self.operand(self.node["inputs"][v["$t"]])
        if "$p" in v:
            return self.chain(self.names.param(v["$p"]), v.get("view"))
        if "$b" in v:
            return self.chain(self.names.buffer(v["$b"]), v.get("view"))
        if "$own" in v:
            return self.chain(self.names.marker("held"), v.get("view"))
        if "$aux" in v:
            return f"{self.names.tensor(self.node['aux_of'] + '.aux')}[{v['$aux']}]"
        if "$empty" in v:
            return f"{self.names.marker('empty')}({list(v['$empty'])}, {self.names.marker('torch')}.{v['dtype']})"
        if "$float" in v:
            return f"float({literal(v['$float'])})"
        if "$device" in v:
            return "rt.device"  # the runtime's own device
        for key in ("$dtype", "$layout", "$mf"):
            if key in v:
                return f"{self.names.marker('torch')}.{v[key]}"
        raise ValueError(f"node {self.node['name']}: argument {v!r} has no Python form")

    def arguments(self, attrs: dict) -> list:
        items = [self.arg(a) for a in attrs.get("args", [])]
        for k, v in (attrs.get("kwargs") or {}).items():
            if k in NODE_KEYWORDS:
                raise ValueError(f"node {self.node['name']}: the op's argument '{k}' is a keyword of rt.call")
            items.append(_keyword(k, self.arg(v)))
        return items

    def updates(self, specs: list[dict]) -> Group:
        entries = []
        for u in specs:
            target = self.names.param(u["param"]) if "param" in u else self.names.buffer(u["buffer"])
            src = self.names.marker("out") + ("" if u.get("item") is None else f"[{u['item']}]")
            entries.append(self.chain(src, u.get("view"), lead=f"{target}: "))
        return Group("updates={", tuple(entries), "}")

    def call(self, head: str, dying: list[int]) -> Group:
        """`head` (`rt.call(` or `rt.recompute(`) with the node's name, op, arguments and keywords."""
        node, attrs = self.node, self.node["attrs"]
        op = self.names.kernel(node["name"]) if node["op"] == FUSED_OP else op_expr(node["op"])
        items = [literal(node["name"]), op, *self.arguments(attrs)]
        known = {"args", "kwargs", "keep", "aux", "scratch", "updates", "then", "seed_key", "loss_item", "dying",
                 "into", "q8"}
        if node["op"] == FUSED_OP:
            known = {"args", "chain"}
        unknown = sorted(set(attrs) - known)
        if unknown:
            raise ValueError(f"node {node['name']}: attrs {unknown} have no Python form")
        if "keep" in attrs:
            keep = attrs["keep"]
            items.append(f"keep={literal(keep) if not isinstance(keep, list) else keep}")
        if "aux" in attrs:
            items.append(f"aux={list(attrs['aux'])!r}")
        if attrs.get("updates"):
            items.append(self.updates(attrs["updates"]))
        if attrs.get("then"):
            items.append(Group("then=[", tuple(self.fused(sub) for sub in attrs["then"]), "]"))
        if "into" in attrs:
            items.append(f"into={self.operand(node['inputs'][attrs['into']])}")
        if dying:
            refs = [self.operand(node["inputs"][k]) for k in dying]
            items.append(f"overwrite={refs[0]}" if len(refs) == 1 else f"overwrite=[{', '.join(refs)}]")
        for key in ("scratch", "seed_key", "loss_item"):
            if key in attrs:
                items.append(f"{key}={literal(attrs[key])}")
        if "q8" in attrs:  # an int8 node's quantisation: scales, zero points, requantisation (graph/quantize.py)
            items.append(_keyword("q8", layout(attrs["q8"])))
        return Group(head, tuple(items), ")")

    def fused(self, sub: dict) -> Group:
        extra = set(sub) - {"op", "args", "kwargs", "keep", "updates", "scratch"}
        if extra or sub.get("keep", "none") != "none":
            raise ValueError(f"node {self.node['name']}: fused op {sub['op']} has no Python form for {sorted(extra)}")
        items = [op_expr(sub["op"]), *self.arguments(sub)]
        if sub.get("updates"):
            items.append(self.updates(sub["updates"]))
        if sub.get("scratch"):
            items.append(f"scratch={sub['scratch']!r}")
        return Group(self.names.marker("fused") + "(", tuple(items), ")")


def layout(value):
    """A literal as a py_layout expression: lists and dicts may break at their commas."""
    if isinstance(value, dict):
        return Group("{", tuple(_entry(k, v) for k, v in value.items()), "}")
    if isinstance(value, (list, tuple)):
        return Group("[", tuple(layout(v) for v in value), "]")
    return literal(value)


def _entry(k, v):
    e, key = layout(v), literal(k)
    return Group(f"{key}: {e.open}", e.items, e.close) if isinstance(e, Group) else f"{key}: {e}"


def _keyword(k: str, value):
    if isinstance(value, Group):
        return Group(f"{k}={value.open}", value.items, value.close)
    if isinstance(value, Chain):  # a view chain passed by keyword (attention's attn_mask)
        return Chain(f"{k}={value.lead}", value.base, value.links)
    return f"{k}={value}"
