"""Bytes of one local-learning training step (a layer, its head, SGD), counted from the tensors themselves.

The rule (also the compiler's memory lines'): static = parameters + their gradients + SGD momentum + buffers;
batch = the input batch + labels; held = every tensor autograd saves for backward (de-duplicated by storage,
counted at the storage's full size) plus the layer output, the logits and the loss; grad = one activation
gradient in flight, taken as the largest floating tensor held; scratch = what the convolutions' kernel scratch
(the compiler's rule, runtime/python/kernel_scratch.py) adds to that sum at its worst moment. A forward
convolution runs before any gradient exists: it adds its scratch less the parameters' gradients and grad. A
backward convolution runs when only the gradients of the parameters after it exist, its own weight's being
made: it adds its scratch less the gradients still to come. Saved tensors stay counted whole (autograd frees
them as backward goes), so the sum stays an upper bound.
Deterministic: no allocator is involved, so the same step gives the same bytes on every machine. On CUDA the trainer reports the allocator's peak too.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .kernel_scratch import convolution_backward_scratch, convolution_scratch

__all__ = ["StepBytes", "count_saved", "static_bytes"]


def _nbytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


@dataclass(frozen=True)
class StepBytes:
    batch: int
    static: int          # params + grads + momentum + buffers
    batch_io: int        # input batch + labels
    saved: int           # unique storages kept for backward (+ outputs, logits, loss)
    backward_grad: int   # one activation gradient in flight
    scratch: int         # what the convolutions' kernel scratch adds to the peak (module docstring)
    loss: float

    @property
    def peak(self) -> int:
        return self.static + self.batch_io + self.saved + self.backward_grad + self.scratch


@contextmanager
def count_saved():
    """Collects the storages autograd saves inside the block: ``held`` maps storage pointer -> tensor."""
    held: dict[int, torch.Tensor] = {}

    def pack(t: torch.Tensor):
        held.setdefault(t.untyped_storage().data_ptr(), t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield held


def held_bytes(held: dict[int, torch.Tensor], extra: tuple[torch.Tensor, ...], exclude: tuple[torch.Tensor, ...]
               ) -> tuple[int, int]:
    """(saved bytes, largest floating tensor) of ``held`` + ``extra`` minus ``exclude`` (counted elsewhere)."""
    held = dict(held)
    for t in extra:
        held.setdefault(t.untyped_storage().data_ptr(), t)
    for t in exclude:
        held.pop(t.untyped_storage().data_ptr(), None)
    floats = [_nbytes(t) for t in held.values() if t.is_floating_point()]
    return sum(_nbytes(t) for t in held.values()), max(floats) if floats else 0


def static_bytes(modules, optimizer: torch.optim.Optimizer) -> int:
    params = list(dict.fromkeys(p for m in modules for p in m.parameters()))  # a shared parameter once
    n = sum(_nbytes(p) for p in params)
    n += sum(_nbytes(p.grad) for p in params if p.grad is not None)
    n += sum(_nbytes(s["momentum_buffer"]) for s in optimizer.state.values()
             if s.get("momentum_buffer") is not None)
    return n + sum(_nbytes(b) for b in dict.fromkeys(b for m in modules for b in m.buffers()))


def _nbytes_or_0(t) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


class _ScratchWatch(TorchDispatchMode):
    """Sees every convolution the block runs (autograd's backward ones too). `forward`: the largest forward
    scratch; `backward`: the largest backward scratch plus the parameter gradients alive while it runs (`grads`,
    kept up to date by the caller's hooks, and the weight and bias gradients the convolution makes)."""

    def __init__(self) -> None:
        super().__init__()
        self.forward = self.backward = self.grads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        threads = torch.get_num_threads()
        if func is torch.ops.aten.convolution.default:
            self.forward = max(self.forward, convolution_scratch(
                _nbytes_or_0(args[0]), _nbytes_or_0(args[1]), _nbytes_or_0(out), bool(args[6]), threads))
        elif func is torch.ops.aten.convolution_backward.default:
            made = _nbytes_or_0(out[1]) + _nbytes_or_0(out[2])
            scratch = convolution_backward_scratch(_nbytes_or_0(args[0]), _nbytes_or_0(args[1]),
                                                   _nbytes_or_0(args[2]), threads)
            self.backward = max(self.backward, scratch + made + self.grads)
        return out


def counted_step(modules, forward, x: torch.Tensor, y: torch.Tensor, optimizer: torch.optim.Optimizer
                 ) -> tuple[StepBytes, list[torch.Tensor]]:
    """One real SGD step of ``modules``, counted by the rule above; ``forward(x)`` returns the tensors the step
    holds besides autograd's saved ones, logits last. Returns (bytes, forward's tensors)."""
    optimizer.zero_grad(set_to_none=True)
    params = [p for p in dict.fromkeys(p for m in modules for p in m.parameters()) if p.requires_grad]
    watch = _ScratchWatch()

    def arrived(p):
        watch.grads += _nbytes(p.grad)

    hooks = [p.register_post_accumulate_grad_hook(arrived) for p in params]
    try:
        with watch:
            with count_saved() as held:
                outs = list(forward(x))
                loss = torch.nn.functional.cross_entropy(outs[-1], y)
            weights = tuple(t for m in modules for t in (*m.parameters(), *m.buffers()))
            saved, grad = held_bytes(held, (*outs, loss), (x, *weights))
            loss.backward()
    finally:
        for h in hooks:
            h.remove()
    optimizer.step()
    grads = sum(_nbytes(p.grad) for p in params if p.grad is not None)
    scratch = max(0, watch.forward - grads - grad, watch.backward - grads)
    return StepBytes(len(x), static_bytes(modules, optimizer), _nbytes(x) + _nbytes(y), saved, grad, scratch,
                     float(loss.detach())), outs


def step_bytes(layer, head, x: torch.Tensor, y: torch.Tensor, optimizer: torch.optim.Optimizer
               ) -> tuple[StepBytes, torch.Tensor]:
    """One real SGD step of ``layer`` + ``head`` on (x, y), counted; returns (bytes, the layer's output)."""
    def forward(inp):
        out = layer(inp)
        return out, head(out)

    sb, outs = counted_step((layer, head), forward, x, y, optimizer)
    return sb, outs[0]
