"""The kernels eager autograd runs, kept or put back where the trace would write another form of the same math.

Interpolation: traced, torch runs `F.interpolate` as Python decompositions (index arithmetic) registered for its
Python dispatcher, where eager runs the C++ kernel (`upsample_bilinear2d` and its backward); the backward of the
two differs by up to 2.9e-6 on a 4x4 bilinear upsampling's weight gradient. `eager_upsampling` lifts those
decompositions while a trace runs, so the graph holds eager's kernels.

SiLU and Mish: traced, autograd's formulas see functional tensors, which they treat as tensor subclasses: for SiLU and Mish they
then write the derivative as a chain of elementwise ops (the twice-differentiable form) where eager autograd runs one
fused kernel (`silu_backward`, `mish_backward`). The two round differently (a weight gradient through a 16x16 SiLU
moves by up to 3.6e-7), and Adam turns a gradient that is noise around 0 (a batch-norm bias before another
batch norm) into a whole step of either sign. Each pattern below is the chain torch 2.13 writes, the replacement
the fused kernel of the same (grad, input).
"""
from __future__ import annotations

import contextlib

import torch
import torch.fx as fx
from torch._C import DispatchKey
from torch.fx.subgraph_rewriter import replace_pattern_with_filters

aten = torch.ops.aten


def _one_minus(t):
    return aten.sub.Tensor(aten.fill.Scalar(aten.empty_like.default(t, memory_format=torch.preserve_format), 1), t)


def _silu_chain(grad, x):
    s = aten.sigmoid.default(x)
    return aten.mul.Tensor(grad, aten.mul.Tensor(s, aten.add.Scalar(aten.mul.Tensor(x, _one_minus(s)), 1)))


def _silu_kernel(grad, x):
    return aten.silu_backward.default(grad, x)


def _mish_chain(grad, x):
    t = aten.tanh.default(aten.softplus.default(x))
    s = aten.sigmoid.default(x)
    inner = aten.mul.Tensor(aten.mul.Tensor(x, s), _one_minus(aten.mul.Tensor(t, t)))
    return aten.mul.Tensor(grad, aten.add.Tensor(t, inner))


def _mish_kernel(grad, x):
    return aten.mish_backward.default(grad, x)


PATTERNS = ((_silu_chain, _silu_kernel), (_mish_chain, _mish_kernel))
_PYTHON_KEYS = (DispatchKey.CompositeImplicitAutograd, DispatchKey.Autograd)


@contextlib.contextmanager
def eager_upsampling():
    """While the context lasts, every aten upsampling op runs its C++ kernels as eager does, not torch's Python
    decomposition of it (restored after)."""
    lifted = []
    for name in dir(torch.ops.aten):
        if "upsample" not in name:
            continue
        packet = getattr(torch.ops.aten, name)
        for overload in packet.overloads():
            op = getattr(packet, overload)
            lifted += [(op, key, op.py_kernels.pop(key)) for key in _PYTHON_KEYS if key in op.py_kernels]
            op._dispatch_cache.clear()
    try:
        yield
    finally:
        for op, key, kernel in lifted:
            op.py_kernels[key] = kernel
            op._dispatch_cache.clear()


def eager_backward_kernels(gm: fx.GraphModule) -> int:
    """Replace each chain with its fused kernel, in place; returns how many were replaced. The kernel's node takes
    the replaced output's metadata (its value's shape and dtype, its place in the step)."""
    if not any(n.op == "call_function" and n.target in (aten.silu.default, aten.mish.default)
               for n in gm.graph.nodes):
        return 0
    gm.graph.eliminate_dead_code()  # the detached copies autograd leaves would keep a chain's nodes from matching
    done = 0
    for pattern, kernel in PATTERNS:
        for match in replace_pattern_with_filters(gm, pattern, kernel):
            out = next(n for n in match.replacements if n.op == "call_function")
            old = match.nodes_map[match.anchor]
            out.meta = dict(old.meta)
            done += 1
    gm.recompile()
    return done
