"""Kernel scratch: the bytes a convolution allocates and frees inside its kernel, beyond the outputs it returns.

The rule (docs/memory-model.md; fitted to the resident-set high-water growth over single ops and the zoo's
nodes on an x86-64 CPU with torch's oneDNN convolutions) in bytes of the operands, so the compiler's memory
model and the local-learning step counter use one rule:

- forward: the weight re-laid out in oneDNN's blocked format + the larger of input and output (a transposed
  convolution runs the backward-data kernel: twice that);
- backward: T x weight (with T threads oneDNN may sum the weight gradient from one weight-sized buffer per
  thread: 4 x weight measured at 4 threads on 512 -> 512 3x3 over 2x2 maps) + 2 x the larger of input and
  output gradient (the blocked input and output gradient, or the input gradient written blocked);
- both: an eighth of the activation term more (a convolution's figure moved by up to 12% of it from run to
  run), and 64 KiB per thread past the first (its own blocks; at most 74 KB measured).
Every other op measured no scratch beyond the pages its outputs map.
"""
from __future__ import annotations

CONVOLUTION = "aten.convolution.default"
CONVOLUTION_BACKWARD = "aten.convolution_backward.default"
WITH_SCRATCH = (CONVOLUTION, CONVOLUTION_BACKWARD)  # the ops the rule names; every other op's scratch is 0
THREAD_BYTES = 64 * 1024  # each intra-op thread past the first: its own blocks of the activations, at most
SLACK = 8  # 1/SLACK of the activation term more: a convolution's figure moved by 12% of it from run to run


def convolution_scratch(x_bytes: int, w_bytes: int, out_bytes: int, transposed: bool, threads: int) -> int:
    act = max(x_bytes, out_bytes) * (2 if transposed else 1)
    return w_bytes + act + act // SLACK + (threads - 1) * THREAD_BYTES


def convolution_backward_scratch(grad_out_bytes: int, x_bytes: int, w_bytes: int, threads: int) -> int:
    act = 2 * max(x_bytes, grad_out_bytes)
    return threads * w_bytes + act + act // SLACK + (threads - 1) * THREAD_BYTES


def scratch_bytes(op: str, args: list, out_bytes: int, threads: int, nbytes) -> int:
    """Bytes `op` (`aten.<name>.<overload>`) holds inside its kernel beyond its outputs, with `threads` intra-op
    threads; `args` its positional arguments, `nbytes(arg)` an argument's bytes (0 for a non-tensor), `out_bytes`
    its (first) output's bytes."""
    if op == CONVOLUTION:
        return convolution_scratch(nbytes(args[0]), nbytes(args[1]), out_bytes, bool(args[6]), threads)
    if op == CONVOLUTION_BACKWARD:
        return convolution_backward_scratch(nbytes(args[0]), nbytes(args[1]), nbytes(args[2]), threads)
    return 0
