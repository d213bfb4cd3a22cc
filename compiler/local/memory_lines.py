"""The NeuroFlux profiler's fit: one memory line per layer (+ head), ``bytes(b) = slope * b + intercept``.

:func:`fit_line` is pure (numpy least squares over (batch, bytes) points; R²; prediction at a held-out
batch). :func:`measure_step_bytes` measures one local-learning training step of a layer and its AAN-LL
head on the CPU; :func:`profile_layers` runs it at several batch sizes for every layer of a model, fits the
lines and checks each at a held-out batch.

What is counted (a saved-tensors-hooks byte counter; deterministic, no allocator involved):

* static: the parameters of layer + head, their ``.grad`` and the SGD momentum buffers (read after a real
  ``optimizer.step()``), and the modules' buffers (BN running stats);
* the step's batch: the input batch (it comes from the cache, so it needs no grad), the labels;
* what autograd keeps from forward to backward: every tensor passed to a ``saved_tensors_hooks`` pack hook
  (conv inputs, BN saved stats, ReLU outputs, max-pool indices, ...), plus the layer output, the logits and
  the loss; all de-duplicated by storage (an in-place ReLU's output shares its input's storage; a view
  costs nothing) and counted at the storage's full size; parameters and buffers that autograd saves (a
  conv's weight) are counted once, as static;
* backward working set: one activation gradient in flight, taken as the largest of the float tensors
  above (the gradient flowing back into the biggest activation).

So ``peak = static + batch + held-for-backward + largest activation gradient``. Not counted: allocator
slack and fragmentation, kernels' internal scratch (im2col, mkldnn workspaces), the Python/CUDA context.
On CUDA the device profiler is meant to use ``torch.cuda.max_memory_allocated`` instead; this counter is
the CPU stand-in and the quantity the partitioner's budget is checked against.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Iterable, Sequence

import numpy as np
import torch
from torch import nn

from .heads import head_spec, make_head, split_layers
from .partition import Line

__all__ = [
    "LineFit", "StepBytes", "LayerProfile", "fit_line", "measure_step_bytes", "profile_layers",
    "DEFAULT_BATCHES", "DEFAULT_HELD_OUT",
]

DEFAULT_BATCHES = (2, 4, 8, 16)
DEFAULT_HELD_OUT = 32


@dataclass(frozen=True)
class LineFit:
    slope: float
    intercept: float
    r2: float
    n_points: int

    def predict(self, batch: float) -> float:
        return self.slope * batch + self.intercept

    def to_line(self, name: str) -> Line:
        return Line(name, self.slope, self.intercept, self.r2)


def fit_line(batches: Sequence[float], nbytes: Sequence[float]) -> LineFit:
    """Least-squares line through (batch, bytes); R² = 1 - SS_res / SS_tot (1.0 when all bytes are equal)."""
    b = np.asarray(batches, dtype=np.float64)
    y = np.asarray(nbytes, dtype=np.float64)
    if b.shape != y.shape or b.ndim != 1:
        raise ValueError(f"fit_line: need two equal-length 1-D sequences, got {b.shape} and {y.shape}")
    if len(np.unique(b)) < 2:
        raise ValueError("fit_line: need measurements at two or more distinct batch sizes")
    a = np.stack([b, np.ones_like(b)], axis=1)
    (slope, intercept), *_ = np.linalg.lstsq(a, y, rcond=None)
    resid = y - (slope * b + intercept)
    ss_res = float(resid @ resid)
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 if ss_tot == 0.0 else 1.0 - ss_res / ss_tot
    return LineFit(float(slope), float(intercept), float(r2), int(len(b)))


@dataclass(frozen=True)
class StepBytes:
    batch: int
    static: int          # params + grads + momentum + buffers
    batch_io: int        # input batch + labels
    saved: int           # unique storages kept for backward (+ layer output, logits, loss)
    backward_grad: int   # one activation gradient in flight
    loss: float

    @property
    def peak(self) -> int:
        return self.static + self.batch_io + self.saved + self.backward_grad


def _nbytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


def measure_step_bytes(layer: nn.Module, head: nn.Module, in_shape: Sequence[int], batch: int,
                       classes: int = 10, *, lr: float = 0.01, momentum: float = 0.9,
                       seed: int = 0) -> StepBytes:
    """Run one real local-learning SGD step (layer -> head -> cross-entropy) and count its bytes.

    The modules are trained in place (one step, on random data); pass copies to keep them unchanged.
    """
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((batch, *in_shape), generator=gen)
    y = torch.randint(0, classes, (batch,), generator=gen)
    params = [p for m in (layer, head) for p in m.parameters()]
    opt = torch.optim.SGD(params, lr=lr, momentum=momentum)
    layer.train()
    head.train()

    held: dict[int, torch.Tensor] = {}

    def pack(t: torch.Tensor):
        held.setdefault(t.untyped_storage().data_ptr(), t)
        return t

    opt.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = layer(x)
        logits = head(out)
        loss = nn.functional.cross_entropy(logits, y)
    for t in (out, logits, loss):
        held.setdefault(t.untyped_storage().data_ptr(), t)
    held.pop(x.untyped_storage().data_ptr(), None)  # counted with the batch
    for t in (*params, *(b for m in (layer, head) for b in m.buffers())):
        held.pop(t.untyped_storage().data_ptr(), None)  # weights saved by conv/linear: counted as static
    saved = sum(_nbytes(t) for t in held.values())
    floats = [_nbytes(t) for t in held.values() if t.is_floating_point()]
    backward_grad = max(floats) if floats else 0
    loss.backward()
    opt.step()

    static = sum(_nbytes(p) for p in params)
    static += sum(_nbytes(p.grad) for p in params if p.grad is not None)
    static += sum(_nbytes(s["momentum_buffer"]) for s in opt.state.values()
                  if s.get("momentum_buffer") is not None)
    static += sum(_nbytes(b) for m in (layer, head) for b in m.buffers())
    return StepBytes(batch, static, _nbytes(x) + _nbytes(y), saved, backward_grad, float(loss.detach()))


@dataclass
class LayerProfile:
    name: str
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    head_channels: int
    points: list[tuple[int, int]]     # (batch, peak bytes) used for the fit
    fit: LineFit
    held_out_batch: int
    held_out_measured: int
    held_out_predicted: float
    detail: list[StepBytes] = field(default_factory=list)

    @property
    def held_out_rel_error(self) -> float:
        return abs(self.held_out_predicted - self.held_out_measured) / self.held_out_measured

    def to_dict(self) -> dict:
        d = asdict(self)
        d["held_out_rel_error"] = self.held_out_rel_error
        return d


def profile_layers(model: nn.Module, in_shape: Sequence[int] = (3, 32, 32), classes: int = 10, *,
                   batches: Iterable[int] = DEFAULT_BATCHES, held_out: int = DEFAULT_HELD_OUT,
                   layers: Sequence[int] | None = None) -> list[LayerProfile]:
    """Measure every layer (+ its AAN-LL head) at ``batches``, fit a line, check it at ``held_out``.

    ``layers`` restricts the profile to those layer indices. The model's weights are left untouched
    (each measurement trains a deep copy of the layer).
    """
    import copy

    batches = list(batches)
    profiles = []
    for i, tl in enumerate(split_layers(model, tuple(in_shape))):
        if layers is not None and i not in layers:
            continue
        spec = head_spec(tl.out_shape, classes)
        detail = []
        for b in [*batches, held_out]:
            torch.manual_seed(0)
            detail.append(measure_step_bytes(copy.deepcopy(tl.module), make_head(spec), tl.in_shape, b,
                                             classes))
        pts = [(s.batch, s.peak) for s in detail[:-1]]
        fit = fit_line([p[0] for p in pts], [p[1] for p in pts])
        profiles.append(LayerProfile(tl.name, tl.in_shape, tl.out_shape, spec.head_channels, pts, fit,
                                     held_out, detail[-1].peak, fit.predict(held_out), detail))
    return profiles
