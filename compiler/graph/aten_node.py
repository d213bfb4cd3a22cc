"""What one op of torch's joint graph says about itself: its name, its values' specs, its arguments as plan
literals, its FLOPs and its kernel scratch. Pure functions of an fx node (and its traced metadata)."""
from __future__ import annotations

from math import isfinite, prod

import torch
import torch.fx as fx
from torch.utils.flop_counter import flop_registry

from edgetrain.compiler.errors import UnsupportedModelError
from edgetrain.runtime.python.kernel_scratch import WITH_SCRATCH
from edgetrain.runtime.python.threads import PLAN_THREADS

from .ir import DTYPE_BYTES, TensorSpec
from .workspace import kernel_scratch_bytes

ALIASES = {"aten.detach.default", "aten.alias.default"}
VIEWS = {"aten._unsafe_view.default"}  # a view torch's schema does not mark as one


def dtype_name(t) -> str:
    return str(t.dtype).removeprefix("torch.")


def spec_of(t) -> TensorSpec:
    dt = dtype_name(t)
    if dt not in DTYPE_BYTES:
        raise UnsupportedModelError(f"tensors of dtype {dt} are not supported (supported: {', '.join(DTYPE_BYTES)})")
    return TensorSpec(tuple(int(s) for s in t.shape), dt)


def numel(t) -> int:
    return prod(int(s) for s in t.shape) if isinstance(t, torch.Tensor) else 0


def literal(a, where: str):
    """A non-tensor argument as JSON."""
    if isinstance(a, float) and not isfinite(a):  # JSON has no infinity (attention's mask fill is -inf)
        return {"$float": repr(a)}
    if a is None or isinstance(a, (bool, int, float, str)):
        return a
    if isinstance(a, (list, tuple)):
        return [literal(x, where) for x in a]
    if isinstance(a, torch.dtype):
        return {"$dtype": str(a).removeprefix("torch.")}
    if isinstance(a, torch.device):
        return {"$device": str(a)}
    if isinstance(a, torch.layout):
        return {"$layout": str(a).removeprefix("torch.")}
    if isinstance(a, torch.memory_format):
        return {"$mf": str(a).removeprefix("torch.")}
    raise UnsupportedModelError(f"{where}: argument {a!r} of type {type(a).__name__} cannot be written to a plan")


def op_name(target) -> str:
    """`aten.<op>.<overload>` of an fx node's target (its own text for a non-aten target)."""
    if not hasattr(target, "_schema"):
        return str(target)
    return f"aten.{target._schema.name.split('::')[1]}.{target._overloadname}"


def is_view(target) -> bool:
    name = op_name(target)
    return name in ALIASES or name in VIEWS or bool(getattr(target, "is_view", False))


def op_flops(node: fx.Node, outs: list) -> int:
    """Torch's flop counter where it knows the op, else elements read and written."""
    target = node.target
    formula = flop_registry.get(getattr(target, "overloadpacket", target))
    if formula is not None:
        def val(a):
            if isinstance(a, fx.Node):
                return a.meta.get("val")
            return [val(x) for x in a] if isinstance(a, (list, tuple)) else a

        try:
            args = [val(a) for a in node.args]
            kwargs = {k: val(v) for k, v in node.kwargs.items()}
            out = node.meta.get("val")
            return int(formula(*args, out_val=out, **kwargs))
        except Exception:  # a formula that does not take this overload's arguments: the generic rule
            pass
    read = sum(numel(a.meta.get("val")) for a in node.all_input_nodes)
    return read + sum(numel(o) for o in outs)


def op_scratch(node: fx.Node, threads: int = PLAN_THREADS) -> int:
    """The op's kernel scratch (workspace.py), from its operands' shapes, run with `threads` intra-op threads."""
    name = op_name(node.target)
    if name not in WITH_SCRATCH:
        return 0

    def spec(a):
        v = a.meta.get("val") if isinstance(a, fx.Node) else a
        return spec_of(v) if isinstance(v, torch.Tensor) else v

    out = node.meta.get("val")
    out = out[0] if isinstance(out, (tuple, list)) else out
    out_bytes = spec_of(out).bytes if isinstance(out, torch.Tensor) else 0
    return kernel_scratch_bytes(name, [spec(a) for a in node.args], out_bytes, threads)


CONV_WEIGHT_ARG = {"aten.convolution.default": 1, "aten.convolution_backward.default": 2}  # the weight's position


def weight_rows(n, rows: int) -> tuple[int, int] | None:
    """The rows of its weight (of `rows` rows) a convolution or its backward node `n` reads (read_rows)."""
    return read_rows(n.attrs["args"][CONV_WEIGHT_ARG[n.op]], rows)


def read_rows(arg: dict, rows: int) -> tuple[int, int] | None:
    """The rows [r0, r1) of a parameter of `rows` rows that an operand `{"$p": name, "view": ...}` reads: all, or
    one slice along dim 0 with step 1; None for any other view."""
    view = [list(v) for v in arg.get("view", ())]
    if not view:
        return 0, rows
    if len(view) != 1 or view[0][0] != "aten.slice.Tensor":
        return None
    args = list(view[0][1])
    dim, start, end, step = args[0], args[1], args[2], args[3] if len(args) > 3 else 1
    if dim != 0 or step != 1:
        return None
    r0, r1 = max(0, min(start, rows)), max(0, min(end, rows))
    return (r0, r1) if r0 < r1 else None
