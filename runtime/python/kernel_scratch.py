"""Kernel scratch: the bytes a convolution allocates and frees inside its kernel, beyond the outputs it returns.

The rule (docs/memory-model.md; fitted to the resident-set high-water growth over single ops and the zoo's
nodes on an x86-64 CPU with torch's oneDNN convolutions) in bytes of the operands, so the compiler's memory
model and the local-learning step counter use one rule:

- forward: the weight re-laid out in oneDNN's blocked format + the larger of input and output (a transposed
  convolution runs the backward-data kernel: twice that);
- backward: B x weight + 2 x the larger of input and output gradient (the blocked input and output gradient, or
  the input gradient written blocked); without the input gradient (a first layer, or one whose input is frozen)
  the smaller of that and the output gradient + the input with its channels padded to a block of 8 (oneDNN's
  AVX2 block: 1 and 2 input channels took up to 7.2x the input; 3 channels stay plain), since no input gradient
  is written (2026-12-07, benchmarks/workspace.py's weight-gradient rows: 18 shapes, 1-144 channels, pointwise
  and depthwise, batch 1-32, maps 16-128, with and without the bias, at 1, 2 and 4 threads: at most 0.86 of the
  rule; the 2x term had left a 3 -> 16 first layer's backward 1.9x what it took). B, the weight-sized buffers: with T threads oneDNN may sum the weight
  gradient from one buffer per thread, and does on small maps (min(T, batch) measured on 1x1 and 2x2 outputs of
  3x3 kernels, at 2 and 4 threads); a 3x3 kernel writing maps of 3x3 or more took one (the blocked weight) in
  every shape measured (128 and 512 channels, batch 1-32, maps 3-6, at 2 and 4 threads), and so did a 1x1
  kernel on any map (64-1024 channels, batch 1-32, maps 1-8, stride 1 and 2, at 2 and 4 threads): B = 1 there,
  B = T for every other shape, which was not measured apart. A backward asked for the input gradient alone (a
  frozen convolution without a trained bias) took one weight, at 2 and 4 threads, on every shape that took
  min(T, batch) with the weight gradient (3x3 and 5x5 kernels on 1x1 and 2x2 maps, 128-512 channels): B = 1;
- both: an eighth of the activation term more (a convolution's figure moved by up to 12% of it from run to
  run), and 64 KiB per thread past the first (its own blocks; at most 74 KB measured).
Channels-last operands (a fused plan's convolutions, runtime/python/memory_format.py): oneDNN reads the
activations where they lie, but a backward that makes both the input's and the weight's gradient holds two
weight-sized buffers, not one (1.7-2.0 weights on every 3x3 and 1x1 layer of 128-512 channels measured, 2026-12-07,
benchmarks/workspace.py --channels-last: ResNet-18's 512 -> 512 on 7x7 maps 18.7 MB where the rule above gave 11.2);
its activation term is near 0, so such a backward counts the larger of the rule above and one more weight (and a
64th) than it without the activation term (`channels_last_backward_extra`). Forwards and backwards of one gradient measured
within the rule above; a one-channel input keeps the default layout in such a plan.
A masked softmax (`_safe_softmax`, what attention with a mask calls) holds a boolean mask of its input, one byte
an element (measured: 0.999 bytes an element on (32, 512, 512) in float32 and bf16, 0.875 on (8, 256, 256)).
Every other op measured no scratch beyond the pages its outputs map.
"""
from __future__ import annotations

import math

CONVOLUTION = "aten.convolution.default"
CONVOLUTION_BACKWARD = "aten.convolution_backward.default"
MASK_AT = 10  # convolution_backward's output_mask: the gradients (input, weight, bias) it makes
SAFE_SOFTMAX = "aten._safe_softmax.default"
WITH_SCRATCH = (CONVOLUTION, CONVOLUTION_BACKWARD, SAFE_SOFTMAX)  # the ops the rule names; every other op's is 0
THREAD_BYTES = 64 * 1024  # each intra-op thread past the first: its own blocks of the activations, at most
CHANNEL_BLOCK = 8  # oneDNN's AVX2 channel block: a blocked input's channels are padded to a multiple of it
WEIGHT_SLACK = 64  # 1/WEIGHT_SLACK of the weight more where a channels-last backward holds a second one
SLACK = 8  # 1/SLACK of the activation term more: a convolution's figure moved by 12% of it from run to run


def convolution_scratch(x_bytes: int, w_bytes: int, out_bytes: int, transposed: bool, threads: int) -> int:
    act = max(x_bytes, out_bytes) * (2 if transposed else 1)
    return w_bytes + act + act // SLACK + (threads - 1) * THREAD_BYTES


def weight_buffers(grad_out_shape, w_shape, threads: int, output_mask=None) -> int:
    """Weight-sized buffers a convolution's backward holds at `threads` threads (B in the module's rule);
    `output_mask` its (input, weight, bias) gradients asked for."""
    if output_mask is not None and not output_mask[1] and not output_mask[2]:
        return 1  # the input gradient alone: the blocked weight, no per-thread weight-gradient sums
    if len(w_shape) != 4 or len(grad_out_shape) != 4:
        return threads
    if tuple(w_shape[2:]) == (1, 1) or (tuple(w_shape[2:]) == (3, 3) and min(grad_out_shape[2:]) >= 3):
        return 1
    return threads


def padded_input_bytes(x_shape, x_bytes: int) -> int:
    """The input's bytes re-laid out in oneDNN's blocked format: its channels padded to a multiple of CHANNEL_BLOCK."""
    if len(x_shape) < 2 or not x_shape[1]:
        return x_bytes
    c = x_shape[1]
    return x_bytes // c * (-(-c // CHANNEL_BLOCK) * CHANNEL_BLOCK)


def convolution_backward_scratch(grad_out_bytes: int, x_bytes: int, w_bytes: int, threads: int, buffers: int,
                                 input_grad: bool = True, x_padded_bytes: int | None = None) -> int:
    """`buffers`: the weight-sized buffers (`weight_buffers`); `input_grad`: whether the input's gradient is made
    (without it, no blocked input gradient: the output gradient and the blocked input, `x_padded_bytes`)."""
    act = 2 * max(x_bytes, grad_out_bytes)
    if not input_grad:
        act = min(act, grad_out_bytes + (x_bytes if x_padded_bytes is None else x_padded_bytes))
    return buffers * w_bytes + act + act // SLACK + (threads - 1) * THREAD_BYTES


def channels_last_applies(x_shape, transposed: bool, output_mask) -> bool:
    """Whether a convolution backward takes `channels_last_backward_extra` in a channels-last plan: not transposed,
    both the input's and the weight's gradient made, over a 4-D input of more than one channel."""
    both = output_mask is None or (bool(output_mask[0]) and bool(output_mask[1]))
    return not transposed and both and len(x_shape) == 4 and x_shape[1] > 1


def channels_last_backward_extra(grad_out_bytes: int, x_bytes: int, w_bytes: int) -> int:
    """Bytes a channels-last convolution backward making the input's and the weight's gradients holds beyond the
    default layout's rule: (B + 1) weights and an eighth of the activation term against B weights and 9/8 of it, and
    a 64th of the weight more (two weights measured up to 0.8% above twice the weight on 2x2 maps, unpinned)."""
    return max(0, w_bytes + w_bytes // WEIGHT_SLACK - 2 * max(x_bytes, grad_out_bytes))


def scratch_bytes(op: str, args: list, out_bytes: int, threads: int, nbytes, channels_last: bool = False) -> int:
    """Bytes `op` (`aten.<name>.<overload>`) holds inside its kernel beyond its outputs, with `threads` intra-op
    threads; `args` its positional arguments (tensors or anything with their `shape`), `nbytes(arg)` an argument's
    bytes (0 for a non-tensor), `out_bytes` its (first) output's bytes; `channels_last`: its 4-D operands so laid out
    (a one-channel input excepted, which such a plan keeps in the default layout)."""
    if op == CONVOLUTION:
        return convolution_scratch(nbytes(args[0]), nbytes(args[1]), out_bytes, bool(args[6]), threads)
    if op == CONVOLUTION_BACKWARD:
        mask = args[MASK_AT] if len(args) > MASK_AT else None
        buffers = weight_buffers(tuple(args[0].shape), tuple(args[2].shape), threads, mask)
        input_grad = mask is None or bool(mask[0]) or bool(args[7])  # a transposed one: not measured apart
        rule = convolution_backward_scratch(nbytes(args[0]), nbytes(args[1]), nbytes(args[2]), threads, buffers,
                                            input_grad, padded_input_bytes(tuple(args[1].shape), nbytes(args[1])))
        if channels_last and channels_last_applies(tuple(args[1].shape), bool(args[7]), mask):
            rule += channels_last_backward_extra(nbytes(args[0]), nbytes(args[1]), nbytes(args[2]))
        return rule
    if op == SAFE_SOFTMAX:  # the mask of the input's -inf entries, one byte an element
        return math.prod(args[0].shape)
    return 0
