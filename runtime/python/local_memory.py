"""Bytes of one local-learning training step (a layer, its head, SGD), counted from the tensors themselves.

The rule (also the compiler's memory lines'): static = parameters + their gradients + SGD momentum + buffers;
batch = the input batch + labels; held = every tensor autograd saves for backward (de-duplicated by storage,
counted at the storage's full size) plus the layer output, the logits and the loss; grad = one activation
gradient in flight, taken as the largest floating tensor held. Deterministic: no allocator is involved, so
the same step gives the same bytes on every machine. On CUDA the trainer reports the allocator's peak too.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

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
    loss: float

    @property
    def peak(self) -> int:
        return self.static + self.batch_io + self.saved + self.backward_grad


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


def counted_step(modules, forward, x: torch.Tensor, y: torch.Tensor, optimizer: torch.optim.Optimizer
                 ) -> tuple[StepBytes, list[torch.Tensor]]:
    """One real SGD step of ``modules``, counted by the rule above; ``forward(x)`` returns the tensors the step
    holds besides autograd's saved ones, logits last. Returns (bytes, forward's tensors)."""
    optimizer.zero_grad(set_to_none=True)
    with count_saved() as held:
        outs = list(forward(x))
        loss = torch.nn.functional.cross_entropy(outs[-1], y)
    weights = tuple(t for m in modules for t in (*m.parameters(), *m.buffers()))
    saved, grad = held_bytes(held, (*outs, loss), (x, *weights))
    loss.backward()
    optimizer.step()
    return StepBytes(len(x), static_bytes(modules, optimizer), _nbytes(x) + _nbytes(y), saved, grad,
                     float(loss.detach())), outs


def step_bytes(layer, head, x: torch.Tensor, y: torch.Tensor, optimizer: torch.optim.Optimizer
               ) -> tuple[StepBytes, torch.Tensor]:
    """One real SGD step of ``layer`` + ``head`` on (x, y), counted; returns (bytes, the layer's output)."""
    def forward(inp):
        out = layer(inp)
        return out, head(out)

    sb, outs = counted_step((layer, head), forward, x, y, optimizer)
    return sb, outs[0]
