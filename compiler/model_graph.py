"""The model as a training graph: resolved, traced, lowered for the backend, its frozen weights placed, costed.

The first pass of a compile (compiler/passes.py) and what tests and sweeps call for a graph alone.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from edgetrain.runtime.python.threads import PLAN_THREADS

from .errors import BudgetError, DeviceFitError, UnsupportedModelError
from .frontend.labels import example_labels
from .frontend.meta_weights import check_meta_weights
from .frontend.modelspec import resolve
from .graph.clamp_backward import read_clamp_output
from .graph.costs import costed
from .graph.fuse_chains import channels_last_convolutions, fuse_pointwise_chains
from .graph.norm_recompute import hold_norm_statistics
from .graph.inplace import mark_in_place
from .graph.streaming import choose_streamed, sliceable_weights, stream_weights
from .graph.workspace import applies as scratch_applies, scratch_threads
from .stages import CompileOptions, Traced


def trace_model(opts: CompileOptions, target, backend, device_check: bool = True) -> Traced:
    """Resolve, trace and lower the model for `backend`, with the outputs its kernels write into dying operands
    (graph/inplace.py); place the frozen weights the device cannot hold in storage (by the largest-first rule;
    `device_check`: against the device's limits at all); cost the graph on `target`."""
    torch.manual_seed(opts.seed)  # zoo models initialize deterministically from the seed
    resolved = resolve(opts.model, **opts.model_kwargs)
    shape = opts.input_shape or resolved.input_shape
    if not shape:
        raise UnsupportedModelError(f"the input shape of {opts.model!r} is unknown; pass --input-shape C,H,W")
    model = resolved.module.train()
    if opts.train is not None:
        from .frontend.train_select import select_and_apply

        select_and_apply(model, opts.train)
    check_meta_weights(model)  # a meta weight's values are in its source, checked before the trace
    if device_check:
        backend.check_model(model, target, opts.optimizer, opts.model)
    check_batch_size(opts.batch_size, shape, resolved.input_dtype, target)
    gen = torch.Generator().manual_seed(opts.seed)
    if resolved.input_dtype == "int64":  # token ids
        example = torch.randint(0, resolved.input_high, (opts.batch_size, *shape), generator=gen)
    else:
        example = torch.randn(opts.batch_size, *shape, generator=gen)
    joint = capture_step(opts, resolved, model, example,
                         scratch_threads(target) if scratch_applies(target) else 0, gpu=target.gpu,
                         widen_fusion=backend.widen_fusion)
    blocks = opts.head_blocks or (blocks_to_fit(joint, target, backend) if device_check else 1)
    graph = joint.graph(blocks)
    head = joint.blocks_said(blocks)
    int8 = None
    if opts.quantize_frozen is not None:  # before lowering: the backend lowers the int8 nodes to its kernels
        graph, int8 = quantize_prefix(opts, graph, model, backend)
    graph = backend.lower(graph)
    if device_check:
        graph = stream_beyond_flash(graph, target, backend, head)
    if backend.clamp_grad_from_output:  # a ReLU6's backward reads the ReLU6's output, bitwise the same
        graph, _ = read_clamp_output(graph)
    if opts.fuse:  # before profiling: a measured target times each chain as its kernel runs it
        graph, _ = fuse_pointwise_chains(graph)
        graph, _ = hold_norm_statistics(graph)  # a batch norm (and its activation) recomputes from its statistics
        graph = channels_last_convolutions(graph)
    graph = mark_in_place(graph, backend.in_place)  # on the graph's final nodes (a fused chain is not marked)
    measured = None
    if getattr(target, "measured", False):
        from .graph.profiler import profile_nodes

        measured = profile_nodes(graph, threads=scratch_threads(target))
    return Traced(resolved, model, costed(graph, target, measured), measured, int8, head)


CALIBRATION_BATCHES = 4  # batches the int8 prefix's activation ranges are measured on


def quantize_prefix(opts: CompileOptions, graph, model, backend):
    """The graph with its frozen prefix in int8 (graph/quantize.py), its activation ranges calibrated on
    CALIBRATION_BATCHES batches of `opts.calibrate`; and what was done, in words, for the compile's report."""
    from .graph.quantize import calibrate, prefix_or_error, quantize_frozen

    flag = f"--quantize-frozen {opts.quantize_frozen}"
    if opts.quantize_frozen != "int8":
        raise UnsupportedModelError(f"{flag}: the only quantisation there is, is int8")
    if not backend.runs_int8_prefix:  # compile_model says so before tracing; a graph built alone, here
        raise UnsupportedModelError(f"{flag}: the {backend.name} runtime has no int8 kernels; compile "
                                    "with --emit c or --emit python, or drop the flag")
    if opts.int8_biases:  # the region goes on over the trained biases, its backward one integer node
        from .graph.qas_lower import lower_qas
        from .graph.quantize import qas_biases, qas_or_error

        if not backend.runs_int8_biases:
            raise UnsupportedModelError(f"--int8-biases: the {backend.name} runtime has no integer backward; "
                                        "compile with --emit c, or drop the flag")
        prefix, tail = qas_or_error(graph)
        batches, said = calibration_batches(opts, graph.input_shape)
        weights = dict(model.named_parameters())
        q = lower_qas(graph, prefix, tail, calibrate(graph, prefix + tail, weights, batches), weights)
        return q.graph, {"nodes": len(prefix) + len(tail), "first": prefix[0], "last": tail[-1], "calibration": said,
                         "int8_biases": list(qas_biases(graph, tail))}
    prefix = prefix_or_error(graph, flag)
    batches, said = calibration_batches(opts, graph.input_shape)
    weights = dict(model.named_parameters())
    q = quantize_frozen(graph, prefix, calibrate(graph, prefix, weights, batches), weights)
    return q.graph, {"nodes": len(prefix), "first": prefix[0], "last": prefix[-1], "calibration": said}


def calibration_batches(opts: CompileOptions, shape) -> tuple[list[torch.Tensor], str]:
    """CALIBRATION_BATCHES input batches of `shape`: from `opts.calibration` (a dataset's, which the caller loads),
    or standard normal from the seed (`--calibrate random`: what `run --data random` trains on); and the words that
    say which."""
    said = f"{CALIBRATION_BATCHES} batches of {shape[0]} from --calibrate {opts.calibrate}"
    if opts.calibration is not None:
        return opts.calibration(tuple(shape), opts.seed, CALIBRATION_BATCHES), said
    if opts.calibrate != "random":
        raise UnsupportedModelError(f"--calibrate {opts.calibrate}: no batches were loaded for it; use the CLI, or "
                                    "give CompileOptions.calibration")
    gen = torch.Generator().manual_seed(opts.seed)
    return [torch.randn(tuple(shape), generator=gen) for _ in range(CALIBRATION_BATCHES)], said + " (standard normal)"


def check_batch_size(batch_size: int, shape, input_dtype: str, target) -> None:
    """A batch whose inputs alone outgrow the target's RAM cannot train there: refused before an example of it
    is made (which would ask the compiling machine for as much)."""
    per_example = (8 if input_dtype == "int64" else 4) * math.prod(shape)
    if batch_size * per_example > target.ram_bytes:
        raise BudgetError(f"--batch-size {batch_size}: one batch of inputs of shape {list(shape)} takes "
                          f"{batch_size * per_example} B, more than {target.name}'s {target.ram_bytes} B of RAM; "
                          f"use at most --batch-size {max(1, target.ram_bytes // per_example)}")


def stream_beyond_flash(graph, target, backend, done: str | None = None):
    """A graph whose frozen weights overflow the device's flash: the largest streamed from storage (`done`: what
    was done to fit already, in words, for a refusal)."""
    room = backend.weight_room(graph, target)
    if room is None:
        return graph
    if room.ram_bytes <= 0:  # the fixed state alone overflows the RAM: say whether any plan could hold less
        refuse_over_ram(graph, target, backend, done)
    chosen = choose_streamed(room.frozen, room.flash_bytes, room.ram_bytes, target.storage_bytes, target.name,
                             sliceable_weights(graph))
    return stream_weights(graph, chosen, room.ram_bytes)


def refuse_over_ram(graph, target, backend, done: str | None = None) -> None:
    """Refuse, with the figures, a graph whose fixed state overflows the device's RAM: its parts, and what the least
    working set that no tiling or streaming splits holds beside the training state and what the runtime reserves
    (scheduling/bound.py)."""
    from .graph.liveness import analyze
    from .scheduling.bound import over_ram_text

    room = backend.device_room(graph, target)
    if room is None:
        return
    graph = mark_in_place(graph, backend.in_place)  # as the plan will run: outputs over their dying operands
    text = over_ram_text(graph, analyze(graph), room.bytes + room.reserved_bytes, room.reserved_bytes,
                         room.reserved_for, target.name, backend.reads_input_from_storage)
    raise DeviceFitError(f"{text}{f' (Figures after {done}.)' if done else ''} No firmware was written.")


@dataclass
class JointStep:
    """torch's joint graph of one training step, captured once, and what makes training graphs of it (its CNN
    heads in any number of output-channel blocks: frontend/channel_blocks.py)."""

    cap: object  # frontend.capture.JointCapture
    make: Callable  # JointCapture -> TrainingGraph
    made: dict = field(default_factory=dict)  # blocks -> the graph made (passes replace nodes, never change them)

    def graph(self, blocks: int = 1):
        """The training graph with every CNN head of the pattern in `blocks` blocks of output channels (1: none)."""
        from .frontend.channel_blocks import block_heads

        if blocks not in self.made:
            self.made[blocks] = self.make(block_heads(self.cap, blocks) if blocks > 1 else self.cap)
        return self.made[blocks]

    def blocks_said(self, blocks: int) -> str | None:
        """What `blocks` does to this step's heads, in words for the compile's report; None: nothing."""
        from .frontend.channel_blocks import block_spans, find_heads

        heads = find_heads(self.cap) if blocks > 1 else []
        if not heads:
            return None
        said = []
        for h in heads:
            spans = block_spans(h.channels, blocks)
            widths = " or ".join(map(str, sorted({c1 - c0 for c0, c1 in spans}, reverse=True)))
            where = self.cap.sources.get(h.conv.name)
            said.append(f"{f'at {where} ' if where else ''}(conv, batch norm, {h.act.target.__name__.split('.')[0] + ', ' if h.act else ''}"
                        f"mean; {h.channels} channels) in {len(spans)} blocks of {widths} channels"
                        + (", the input's gradient summed over the blocks" if h.grad_x is not None else ""))
        return "computing the head " + "; ".join(said) + ", forward and backward"


# Output-channel blocks tried for a CNN head whose tensors bound the budget, fewest first.
HEAD_BLOCKS = (2, 4, 8, 16, 32)


def blocks_to_fit(joint: JointStep, target, backend) -> int:
    """Blocks of output channels for the step's CNN heads (frontend/channel_blocks.py): 1 (none) unless the least
    working set no tiling or streaming splits (scheduling/bound.py: untiled_bound, the input batch aside: it may
    be read from storage) overflows the RAM the device leaves beside the training state; then the fewest of
    HEAD_BLOCKS whose bound takes at most half that RAM (the rest for what tiling the frozen prefix adds), else
    the count that lowers it most."""
    from .frontend.channel_blocks import find_heads
    from .graph.liveness import analyze
    from .scheduling.bound import untiled_bound

    def tensors(graph) -> tuple[int, int] | None:  # (the bound's tensors, the RAM for tensors), as the plan runs
        graph = mark_in_place(backend.lower(graph), backend.in_place)
        room = backend.device_room(graph, target)
        if room is None:
            return None
        b = untiled_bound(graph, analyze(graph), with_input=False)
        x = sum(n.bytes for n in graph.nodes if n.kind == "input")
        return b.budget_bytes - b.state_bytes, room.bytes + x - b.state_bytes

    if not find_heads(joint.cap):
        return 1
    try:
        plain = tensors(joint.graph(1))
    except UnsupportedModelError:  # the backend refuses the graph: the trace says so with the whole list
        return 1
    if plain is None or plain[0] <= plain[1] or plain[1] <= 0:  # fits; or the training state alone does not
        return 1
    best, least = 1, plain[0]
    for blocks in HEAD_BLOCKS:
        try:
            held, left = tensors(joint.graph(blocks))
        except UnsupportedModelError:  # the backend cannot run the blocks: the head stays whole
            break
        if held >= least:  # the head no longer bounds it
            break
        best, least = blocks, held
        if held <= left // 2:
            break
    return best


def capture_step(opts: CompileOptions, resolved, model, example: torch.Tensor, threads: int = PLAN_THREADS,
                 gpu: bool = False, widen_fusion: bool = True) -> JointStep:
    """torch's joint forward-backward graph of one step, and what makes the training graph of it; kernel scratch
    counted for `threads` intra-op threads (0: none); `gpu`: of kernels a CUDA device runs (a Jetson's plan);
    `widen_fusion`: the backend's (codegen/backend.py)."""
    from .frontend.capture import capture, load_loss
    from .frontend.chunked_head import chunk_lm_head
    from .graph.joint import build_graph as joint_graph

    builtin = opts.loss in ("cross_entropy", "mse", "model")
    user_fn = None if builtin else load_loss(opts.loss)
    kind = opts.loss if builtin else "cross_entropy"  # a user's loss takes class labels
    labels = example_labels(kind, opts.seed, resolved, model, example)  # the class count from the model's output
    cap = capture(model, example, labels.example, loss=kind, token_ids=resolved.input_dtype == "int64", user_fn=user_fn,
                  gpu=gpu)
    cap = chunk_lm_head(cap)  # a language model's (positions, vocabulary) logits never whole
    for name, value in cap.constants.items():  # tensors torch lifted out of the code: buffers of the plan
        model.register_buffer(name, value.detach().clone())
    return JointStep(cap, lambda c: joint_graph(
        c, opts.model, tuple(example.shape), labels.num_classes, opts.loss, opts.optimizer,
        input_dtype=resolved.input_dtype, input_high=resolved.input_high, seed_keys=c.seed_keys,
        widen_fusion=widen_fusion, scratch_threads=threads))


def capture_graph(opts: CompileOptions, resolved, model, example: torch.Tensor, threads: int = PLAN_THREADS,
                  gpu: bool = False, widen_fusion: bool = True):
    """The training graph from torch's joint forward-backward graph of one step (its CNN heads in
    `opts.head_blocks` blocks of output channels where given); the arguments as `capture_step`'s."""
    return capture_step(opts, resolved, model, example, threads, gpu, widen_fusion).graph(opts.head_blocks or 1)
