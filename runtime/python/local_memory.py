"""Bytes of one local-learning training step (a layer, its head, SGD), counted from the tensors themselves.

The rule (also the compiler's memory lines'): static = parameters + their gradients + SGD momentum + buffers;
batch = the input batch + labels; made = the most that the step's own tensors take at any op, in time order:
every storage an op makes (activations, what autograd saves, activation and parameter gradients, the loss) is
counted from the op that makes it until its last reference goes, and the op's kernel scratch (a convolution's,
by the compiler's rule, runtime/python/kernel_scratch.py) is added while it runs. The step's gradients replace
the last step's (freed first), so peak = max(static, static - gradients + made) + batch.
For reading, `saved` (the storages autograd saves, with the layer output, logits and loss) and
`backward_grad` (the largest floating one: an activation gradient's size) say where the bytes are.
Deterministic: no allocator is involved, so the same step gives the same bytes on every machine (real memory
adds the allocator's rounding, a page or so per tensor). On CUDA the trainer reports the allocator's peak too.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .kernel_scratch import scratch_bytes

__all__ = ["StepBytes", "count_saved", "static_bytes"]


def _nbytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


@dataclass(frozen=True)
class StepBytes:
    batch: int
    static: int          # params + grads + momentum + buffers
    batch_io: int        # input batch + labels
    saved: int           # unique storages kept for backward (+ outputs, logits, loss)
    backward_grad: int   # the largest of those that is floating: an activation gradient's size
    made: int            # the most the step's own tensors and a kernel's scratch take at once (time order)
    grads: int           # the parameters' gradients (in static, made again by the step)
    scratch: int         # the kernel scratch at the op where `made` peaks
    loss: float

    @property
    def peak(self) -> int:
        return max(self.static, self.static - self.grads + self.made) + self.batch_io


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


def _size(t) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


class _Made(TorchDispatchMode):
    """Sees every op the block runs (autograd's backward ones too) and the storages they make: `peak` is the most
    those alive at once take, with the running op's kernel scratch, and `scratch` that op's scratch."""

    def __init__(self, existing) -> None:
        super().__init__()
        self.existing = {t.untyped_storage()._cdata for t in existing}  # counted elsewhere: their views are free
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.bytes = self.peak = self.scratch = 0

    def _sweep(self) -> None:
        for key in [k for k, (ref, _) in self.live.items() if ref.expired()]:
            self.bytes -= self.live.pop(key)[1]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self._sweep()  # what the last op's caller let go is gone before this one runs
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                s = t.untyped_storage()
                key = s._cdata
                if key in self.existing:
                    continue
                if key not in self.live or self.live[key][0].expired():
                    self.bytes -= self.live[key][1] if key in self.live else 0
                    self.live[key] = (StorageWeakRef(s), s.nbytes())
                    self.bytes += s.nbytes()
        # str(func) is aten.<op>.<overload>, the name the rule goes by
        scratch = scratch_bytes(str(func), args, _size(out), torch.get_num_threads(), _size)
        if self.bytes + scratch > self.peak:
            self.peak, self.scratch = self.bytes + scratch, scratch
        return out


def counted_step(modules, forward, x: torch.Tensor, y: torch.Tensor, optimizer: torch.optim.Optimizer
                 ) -> tuple[StepBytes, list[torch.Tensor]]:
    """One real SGD step of ``modules``, counted by the rule above; ``forward(x)`` returns the tensors the step
    holds besides autograd's saved ones, logits last. Returns (bytes, forward's tensors)."""
    optimizer.zero_grad(set_to_none=True)
    state = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    with _Made([x, y, *state, *(t for m in modules for t in (*m.parameters(), *m.buffers()))]) as made:
        with count_saved() as held:
            outs = list(forward(x))
            loss = torch.nn.functional.cross_entropy(outs[-1], y)
        weights = tuple(t for m in modules for t in (*m.parameters(), *m.buffers()))
        saved, grad = held_bytes(held, (*outs, loss), (x, *weights))
        loss.backward()
        del held
    optimizer.step()
    params = dict.fromkeys(p for m in modules for p in m.parameters())
    grads = sum(_nbytes(p.grad) for p in params if p.grad is not None)
    return StepBytes(len(x), static_bytes(modules, optimizer), _nbytes(x) + _nbytes(y), saved, grad, made.peak,
                     grads, made.scratch, float(loss.detach())), outs


def step_bytes(layer, head, x: torch.Tensor, y: torch.Tensor, optimizer: torch.optim.Optimizer
               ) -> tuple[StepBytes, torch.Tensor]:
    """One real SGD step of ``layer`` + ``head`` on (x, y), counted; returns (bytes, the layer's output)."""
    def forward(inp):
        out = layer(inp)
        return out, head(out)

    sb, outs = counted_step((layer, head), forward, x, y, optimizer)
    return sb, outs[0]
