"""The model as a training graph: resolved, traced, lowered for the backend, its frozen weights placed, costed.

The first pass of a compile (compiler/passes.py) and what tests and sweeps call for a graph alone.
"""
from __future__ import annotations

import math

import torch

from edgetrain.runtime.python.threads import PLAN_THREADS

from .errors import BudgetError, DeviceFitError, UnsupportedModelError
from .frontend.labels import example_labels
from .frontend.meta_weights import check_meta_weights
from .frontend.modelspec import resolve
from .graph.clamp_backward import read_clamp_output
from .graph.costs import costed
from .graph.fuse_chains import channels_last_convolutions, fuse_pointwise_chains
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
    graph = capture_graph(opts, resolved, model, example,
                          scratch_threads(target) if scratch_applies(target) else 0, gpu=target.gpu,
                          widen_fusion=backend.widen_fusion)
    int8 = None
    if opts.quantize_frozen is not None:  # before lowering: the backend lowers the int8 nodes to its kernels
        graph, int8 = quantize_prefix(opts, graph, model, backend)
    graph = backend.lower(graph)
    if device_check:
        graph = stream_beyond_flash(graph, target, backend)
    if backend.clamp_grad_from_output:  # a ReLU6's backward reads the ReLU6's output, bitwise the same
        graph, _ = read_clamp_output(graph)
    if opts.fuse:  # before profiling: a measured target times each chain as its kernel runs it
        graph, _ = fuse_pointwise_chains(graph)
        graph = channels_last_convolutions(graph)
    graph = mark_in_place(graph, backend.in_place)  # on the graph's final nodes (a fused chain is not marked)
    measured = None
    if getattr(target, "measured", False):
        from .graph.profiler import profile_nodes

        measured = profile_nodes(graph, threads=scratch_threads(target))
    return Traced(resolved, model, costed(graph, target, measured), measured, int8)


CALIBRATION_BATCHES = 4  # batches the int8 prefix's activation ranges are measured on


def quantize_prefix(opts: CompileOptions, graph, model, backend):
    """The graph with its frozen prefix in int8 (graph/quantize.py), its activation ranges calibrated on
    CALIBRATION_BATCHES batches of `opts.calibrate`; and what was done, in words, for the compile's report."""
    from .graph.quantize import calibrate, prefix_or_error, quantize_frozen

    flag = f"--quantize-frozen {opts.quantize_frozen}"
    if opts.quantize_frozen != "int8":
        raise UnsupportedModelError(f"{flag}: the only quantisation there is, is int8")
    if not backend.runs_int8_prefix:  # compile_model says so before tracing; a graph built alone, here
        raise UnsupportedModelError(f"{flag}: an int8 prefix runs in C firmware only (--emit c); the {backend.name} "
                                    "runtime has no int8 kernels yet. Compile with --emit c, or drop the flag")
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


def stream_beyond_flash(graph, target, backend):
    """A graph whose frozen weights overflow the device's flash: the largest streamed from storage."""
    room = backend.weight_room(graph, target)
    if room is None:
        return graph
    refuse_over_ram(graph, target, backend)  # before any solve: no plan holds less than what no tiling splits
    chosen = choose_streamed(room.frozen, room.flash_bytes, room.ram_bytes, target.storage_bytes, target.name,
                             sliceable_weights(graph))
    return stream_weights(graph, chosen, room.ram_bytes)


def refuse_over_ram(graph, target, backend) -> None:
    """Refuse, with the figures, a graph whose least working set that no tiling or streaming splits overflows the
    device's RAM with the training state and what the runtime reserves (scheduling/bound.py)."""
    from .graph.liveness import analyze
    from .scheduling.bound import over_ram_text

    room = backend.device_room(graph, target)
    if room is None:
        return
    graph = mark_in_place(graph, backend.in_place)  # as the plan will run: outputs over their dying operands
    text = over_ram_text(graph, analyze(graph), room.bytes + room.reserved_bytes, room.reserved_bytes,
                         room.reserved_for, target.name, backend.reads_input_from_storage)
    if text is not None:
        raise DeviceFitError(f"{text} No firmware was written.")


def capture_graph(opts: CompileOptions, resolved, model, example: torch.Tensor, threads: int = PLAN_THREADS,
                  gpu: bool = False, widen_fusion: bool = True):
    """The training graph from torch's joint forward-backward graph of one step; kernel scratch counted for
    `threads` intra-op threads (0: none); `gpu`: of kernels a CUDA device runs (a Jetson's plan); `widen_fusion`:
    the backend's (codegen/backend.py)."""
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
    return joint_graph(cap, opts.model, tuple(example.shape), labels.num_classes, opts.loss, opts.optimizer,
                       input_dtype=resolved.input_dtype, input_high=resolved.input_high, seed_keys=cap.seed_keys,
                       widen_fusion=widen_fusion,
                       scratch_threads=threads)
