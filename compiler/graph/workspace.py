"""Kernel scratch: the bytes an aten kernel allocates and frees inside itself, beyond the outputs it returns.

One rule per op class, a pure function of the op, its operands' shapes and dtypes and the runtime's intra-op
threads, so a budget, a schedule and a plan do not move from run to run. The rules were fitted to the process's
resident-set high-water growth over each node of the zoo's models and over single ops, on an x86-64 CPU
(torch's oneDNN convolutions, AVX2) with glibc malloc made to return every freed block at once;
`benchmarks/workspace.py` measures them again and checks each rule is not below (docs/memory-model.md):

- convolution forward: oneDNN re-lays the weight out in its blocked format and one activation (the input, or
  the output it writes blocked and copies back) beside it: weight + the larger of input and output. A
  transposed convolution runs the backward-data kernel: the backward's activation term;
- convolution backward: the weight re-laid out and two activation-sized buffers (the blocked input and output
  gradient, or the input gradient written blocked): weight + 2 x the larger of input and output gradient. With
  T threads oneDNN may sum the weight gradient from one weight-sized buffer per thread: T x weight (measured
  4 x weight at 4 threads on 512 -> 512 3x3 over 2x2 maps);
- both: an eighth of the activation term more (a convolution's figure moved by up to 12% of it, 0.25 MB, from
  run to run), and 64 KiB per thread past the first (its own blocks; at most 74 KB measured);
- every other op measured no scratch beyond the pages its outputs map (elementwise ops, batch norm, pooling,
  matrix products, softmax, layer norm): none.

Batch 1 and pointwise convolutions measured far less than the rule (oneDNN then keeps the plain layout): the
rule stays an upper bound rather than follow each of oneDNN's choices. Plans are compiled for the runtime's
plan thread count (runtime/python/threads.py: 1), which `edgetrain run` pins for every plan it trains on the CPU. The term is for the targets torch's kernels train on (Raspberry Pi, Jetson,
host: `applies`); the C runtime's kernels have no scratch (`c_lower.py` sets every workspace to the streamed
weights alone), and a microcontroller profile's graph has none even in a Python plan.
"""
from __future__ import annotations

from edgetrain.runtime.python.threads import PLAN_THREADS

from .ir import TensorSpec

CONVOLUTION = "aten.convolution.default"
CONVOLUTION_BACKWARD = "aten.convolution_backward.default"
WITH_SCRATCH = (CONVOLUTION, CONVOLUTION_BACKWARD)  # the ops a rule names; every other op's scratch is 0
THREAD_BYTES = 64 * 1024  # each intra-op thread past the first: its own blocks of the activations, at most
SLACK = 8  # 1/SLACK of the activation term more: a convolution's figure moved by 12% of it from run to run


def _bytes(t) -> int:
    return t.bytes if isinstance(t, TensorSpec) else 0


def applies(target) -> bool:
    """Kernel scratch is counted for the targets torch's kernels train on (Raspberry Pi, Jetson, host); a
    microcontroller profile's graph models its C kernels, which have none, even in a Python plan."""
    return getattr(target, "family", None) != "mcu"


def kernel_scratch_bytes(op: str, args: list, out_bytes: int, threads: int = PLAN_THREADS) -> int:
    """Bytes `op` holds inside its kernel beyond its outputs, run with `threads` intra-op threads; `args` are its
    positional arguments, tensors as TensorSpec; `out_bytes` its (first) output's bytes, as traced."""
    per_thread = (threads - 1) * THREAD_BYTES
    if op == CONVOLUTION:
        x, w, transposed = args[0], args[1], args[6]
        act = max(_bytes(x), out_bytes)
        # A transposed convolution runs oneDNN's backward-data kernel: the backward's activation term.
        act *= 2 if transposed else 1
        return _bytes(w) + act + act // SLACK + per_thread
    if op == CONVOLUTION_BACKWARD:
        go, x, w = args[:3]
        act = 2 * max(_bytes(x), _bytes(go))
        # With several threads the weight gradient may be summed from one weight-sized buffer per thread.
        return threads * _bytes(w) + act + act // SLACK + per_thread
    return 0

