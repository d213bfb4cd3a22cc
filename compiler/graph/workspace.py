"""Kernel scratch: the bytes an aten kernel allocates and frees inside itself, beyond the outputs it returns.

One rule per op class, a pure function of the op and its operands' shapes and dtypes, so a budget, a schedule
and a plan do not move from run to run. The rules were fitted to the process's resident-set high-water growth
of each node of the zoo's models on an x86-64 CPU (torch's oneDNN convolutions, AVX2), with glibc malloc made
to return every freed block at once (`benchmarks/workspace.py` measures them again and checks each rule is
an upper bound; docs/memory-model.md has the figures):

- convolution forward: oneDNN re-lays the weight out in its blocked format and the activation (the input, or the
  output it writes blocked and copies back) beside it: weight + the larger of input and output. A pointwise
  convolution (1x1, stride 1, no padding, one group) runs as a matrix product on the plain layout: its weight
  at most;
- convolution backward: the weight re-laid out, and two activation-sized buffers (the blocked input and the
  blocked gradient of the output, or a gradient of the input written blocked): weight + 2 x the larger of input
  and output gradient. Pointwise: weight + the larger of the two;
- every other op of the zoo's graphs measured no scratch beyond a page or two (elementwise ops, batch norm,
  pooling, matrix products, attention at the zoo's sizes): none.

The term is for the Python runtime (Raspberry Pi, Jetson, host). The C runtime's kernels have no scratch
(`c_lower.py` sets every workspace to the streamed weights alone).
"""
from __future__ import annotations

from math import prod

from .ir import DTYPE_BYTES, TensorSpec

CONVOLUTION = "aten.convolution.default"
CONVOLUTION_BACKWARD = "aten.convolution_backward.default"


def _bytes(t) -> int:
    return prod(t.shape) * DTYPE_BYTES[t.dtype] if isinstance(t, TensorSpec) else 0


def kernel_scratch_bytes(op: str, args: list) -> int:
    """Bytes `op` holds inside its kernel beyond its outputs; `args` are its positional arguments, tensors as
    TensorSpec."""
    if op == CONVOLUTION:
        x, w, _bias, stride, padding, dilation, transposed, _out_pad, groups = args[:9]
        out = _conv_out_bytes(x, w, stride, padding, dilation, transposed, _out_pad, groups)
        return _bytes(w) + max(_bytes(x), out)
    if op == CONVOLUTION_BACKWARD:
        go, x, w, _bias_sizes, stride, padding, dilation, transposed, _out_pad, groups = args[:10]
        return _bytes(w) + 2 * max(_bytes(x), _bytes(go))
    return 0


def _conv_out_bytes(x: TensorSpec, w: TensorSpec, stride, padding, dilation, transposed, out_pad, groups) -> int:
    """Bytes of a convolution's output (aten's shape rule)."""
    spatial = []
    for i, n in enumerate(x.shape[2:]):
        k = dilation[i] * (w.shape[2 + i] - 1) + 1
        if transposed:
            spatial.append((n - 1) * stride[i] - 2 * padding[i] + k + out_pad[i])
        else:
            spatial.append((n + 2 * padding[i] - k) // stride[i] + 1)
    channels = w.shape[1] * groups if transposed else w.shape[0]
    return prod((x.shape[0], channels, *spatial)) * DTYPE_BYTES[x.dtype]
