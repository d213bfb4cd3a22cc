"""Kernel scratch: the bytes an aten kernel allocates and frees inside itself, beyond the outputs it returns.

One rule per op class, a pure function of the op, its operands' shapes and dtypes and the runtime's intra-op
threads, so a budget, a schedule and a plan do not move from run to run. The rules were fitted to the process's
resident-set high-water growth over each node of the zoo's models and over single ops, on an x86-64 CPU
(torch's oneDNN convolutions, AVX2) with glibc malloc made to return every freed block at once;
`benchmarks/workspace.py` measures them again and checks each rule is not below (docs/memory-model.md):

- convolutions: the rule in `runtime/python/kernel_scratch.py` (the weight re-laid out in oneDNN's blocked
  format and one or two activation-sized buffers beside it; details there), shared with the local-learning step
  counter;
- a masked softmax (`_safe_softmax`): a boolean mask of its input, one byte an element (same module);
- every other op measured no scratch beyond the pages its outputs map (elementwise ops, batch norm, pooling,
  matrix products, plain softmax, layer norm): none.

Batch 1 and pointwise convolutions measured far less than the rule (oneDNN then keeps the plain layout): the
rule stays an upper bound rather than follow each of oneDNN's choices. A plan is compiled for its target's
thread count (`cpu_threads` in the profile: a Raspberry Pi 4's four cores; 1 where a profile names none,
runtime/python/threads.py), which the plan records and the runtime pins while a step trains on the CPU. The
term is for the targets torch's kernels train on (Raspberry Pi, Jetson, host: `applies`); the C
runtime's kernels have no scratch (`codegen/c/lower.py` sets every workspace to the streamed weights alone), and a
microcontroller profile's graph has none even in a Python plan.
"""
from __future__ import annotations

from edgetrain.runtime.python.kernel_scratch import scratch_bytes
from edgetrain.runtime.python.threads import PLAN_THREADS

from .ir import TensorSpec


def _bytes(t) -> int:
    return t.bytes if isinstance(t, TensorSpec) else 0


def applies(target) -> bool:
    """Kernel scratch is counted for the targets torch's kernels train on (Raspberry Pi, Jetson, host); a
    microcontroller profile's graph models its C kernels, which have none, even in a Python plan."""
    return not target.is_mcu


def scratch_threads(target) -> int:
    """The intra-op threads a target's plans train with on the CPU, which their kernel scratch is counted for."""
    return getattr(target, "cpu_threads", PLAN_THREADS)


def kernel_scratch_bytes(op: str, args: list, out_bytes: int, threads: int = PLAN_THREADS,
                         channels_last: bool = False) -> int:
    """Bytes `op` holds inside its kernel beyond its outputs, run with `threads` intra-op threads; `args` are its
    positional arguments, tensors as TensorSpec; `out_bytes` its (first) output's bytes, as traced;
    `channels_last`: its 4-D operands so laid out (a fused plan's convolutions)."""
    return scratch_bytes(op, args, out_bytes, threads, _bytes, channels_last)
