"""The model as a training graph: resolved, traced, lowered for the backend, its frozen weights placed, costed.

The first pass of a compile (compiler/passes.py) and what tests and sweeps call for a graph alone.
"""
from __future__ import annotations

import torch

from edgetrain.runtime.python.threads import PLAN_THREADS

from .errors import UnsupportedModelError
from .frontend.modelspec import resolve
from .graph.costs import costed
from .graph.streaming import choose_streamed, stream_weights
from .graph.workspace import applies as scratch_applies, scratch_threads
from .stages import CompileOptions, Traced


def trace_model(opts: CompileOptions, target, backend, device_check: bool = True) -> Traced:
    """Resolve, trace and lower the model for `backend`; place the frozen weights the device cannot hold in
    storage (by the largest-first rule; `device_check`: against the device's limits at all); cost the graph
    on `target`."""
    torch.manual_seed(opts.seed)  # zoo models initialize deterministically from the seed
    resolved = resolve(opts.model, **opts.model_kwargs)
    shape = opts.input_shape or resolved.input_shape
    if not shape:
        raise UnsupportedModelError(f"the input shape of {opts.model!r} is unknown; pass --input-shape C,H,W")
    model = resolved.module.train()
    if opts.train is not None:
        from .frontend.train_select import select_and_apply

        select_and_apply(model, opts.train)
    if device_check:
        backend.check_model(model, target, opts.optimizer, opts.model)
    gen = torch.Generator().manual_seed(opts.seed)
    if resolved.input_dtype == "int64":  # token ids
        example = torch.randint(0, resolved.input_high, (opts.batch_size, *shape), generator=gen)
    else:
        example = torch.randn(opts.batch_size, *shape, generator=gen)
    graph = capture_graph(opts, resolved, model, example,
                          scratch_threads(target) if scratch_applies(target) else 0, gpu=target.gpu,
                          widen_fusion=backend.widen_fusion)
    graph = backend.lower(graph)
    if device_check:
        graph = stream_beyond_flash(graph, target, backend)
    measured = None
    if getattr(target, "measured", False):
        from .graph.profiler import profile_nodes

        measured = profile_nodes(graph, threads=scratch_threads(target))
    return Traced(resolved, model, costed(graph, target, measured), measured)


def stream_beyond_flash(graph, target, backend):
    """A graph whose frozen weights overflow the device's flash: the largest streamed from storage."""
    room = backend.weight_room(graph, target)
    if room is None:
        return graph
    return stream_weights(graph, choose_streamed(room.frozen, room.flash_bytes, room.ram_bytes, target.storage_bytes,
                                                 target.name))


def example_labels(loss: str, seed: int, resolved, model, example: torch.Tensor) -> torch.Tensor:
    """Labels shaped as `loss` ("cross_entropy", "mse" or "model") expects them: class ids (B, ...) for
    cross-entropy, the output's shape for mse, the model's `labels_shape` for a model that computes its loss."""
    gen = torch.Generator().manual_seed(seed + 1)
    out = None if loss == "model" else _output_like(model, example)
    if loss == "model":
        labels_shape = getattr(resolved.module, "labels_shape", None)
        high = resolved.num_classes or resolved.input_high or 2
        shape = (example.shape[0], *labels_shape) if labels_shape is not None else tuple(example.shape)
        return torch.randint(0, high, shape, generator=gen)
    if isinstance(out, (tuple, list)) or not isinstance(out, torch.Tensor):
        out = getattr(out, "logits", out[0] if isinstance(out, (tuple, list)) else None)
    if not isinstance(out, torch.Tensor):
        raise UnsupportedModelError("the model's output is not a tensor; give --loss model and have "
                                    "forward(x, y) return the loss")
    if loss == "mse":
        return torch.randn(out.shape, generator=gen)
    token = resolved.input_dtype == "int64" and out.dim() == 3
    classes = out.shape[-1] if token else out.shape[1] if out.dim() > 1 else None
    if classes is None:
        raise UnsupportedModelError(f"cross-entropy needs (B, C, ...) outputs; the model returns shape {tuple(out.shape)}")
    shape = out.shape[:-1] if token else (out.shape[0], *out.shape[2:])
    return torch.randint(0, classes, tuple(shape), generator=gen)


def _output_like(model, example: torch.Tensor):
    """The model's output on `example`, from a forward on fake tensors (shapes only: BERT-base's real forward
    took seconds); a model that fails there runs for real, for its own error or its output."""
    from .frontend.capture import on_fakes

    try:
        with on_fakes(model) as fake, fake, torch.no_grad():
            return model(fake.from_tensor(example))
    except Exception:
        pass
    saved = {k: b.clone() for k, b in model.named_buffers()}  # a forward in training mode moves BN statistics
    try:
        with torch.no_grad():
            return model(example)
    except Exception as e:
        from .frontend.capture import user_frame

        raise UnsupportedModelError(f"the model cannot take an input of shape {tuple(example.shape)}{user_frame(e)}: "
                                    f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}. "
                                    "Check --input-shape (C,H,W without the batch)") from None
    finally:
        with torch.no_grad():
            for k, b in model.named_buffers():
                b.copy_(saved[k])


def capture_graph(opts: CompileOptions, resolved, model, example: torch.Tensor, threads: int = PLAN_THREADS,
                  gpu: bool = False, widen_fusion: bool = True):
    """The training graph from torch's joint forward-backward graph of one step; kernel scratch counted for
    `threads` intra-op threads (0: none); `gpu`: of kernels a CUDA device runs (a Jetson's plan); `widen_fusion`:
    the backend's (codegen/backend.py)."""
    from .frontend.capture import capture, load_loss
    from .graph.joint import build_graph as joint_graph

    builtin = opts.loss in ("cross_entropy", "mse", "model")
    user_fn = None if builtin else load_loss(opts.loss)
    kind = opts.loss if builtin else "cross_entropy"  # a user's loss takes class labels
    y = example_labels(kind, opts.seed, resolved, model, example)
    cap = capture(model, example, y, loss=kind, token_ids=resolved.input_dtype == "int64", user_fn=user_fn,
                  gpu=gpu)
    for name, value in cap.constants.items():  # tensors torch lifted out of the code: buffers of the plan
        model.register_buffer(name, value.detach().clone())
    classes = resolved.num_classes or 0
    return joint_graph(cap, opts.model, tuple(example.shape), classes, opts.loss, opts.optimizer,
                       input_dtype=resolved.input_dtype, input_high=resolved.input_high, seed_keys=cap.seed_keys,
                       widen_fusion=widen_fusion,
                       scratch_threads=threads)
