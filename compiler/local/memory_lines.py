"""The NeuroFlux profiler's fit: one memory line per layer (+ head), ``bytes(b) = slope * b + intercept``.

:func:`fit_line` is pure (numpy least squares over (batch, bytes) points; R²; prediction at a held-out
batch). :func:`measure_step_bytes` measures one local-learning training step of a layer and its AAN-LL
head on the CPU; :func:`profile_layers` runs it at several batch sizes for every layer of a model, fits the
lines and checks each at a held-out batch.

What is counted (the runtime's step counter, ``edgetrain.runtime.python.local_memory``; deterministic, no
allocator involved):

* static: the parameters of layer + head, their ``.grad`` and the SGD momentum buffers (read after a real
  ``optimizer.step()``), and the modules' buffers (BN running stats);
* the step's batch: the input batch (it comes from the cache, so it needs no grad), the labels;
* made: every storage an op of the step makes (activations, what autograd saves, activation and parameter
  gradients, the loss), from the op that makes it until its last reference goes, in time order (a dispatch
  mode sees each op, autograd's backward ones too; a view or an in-place op makes nothing new), plus the
  running convolution's kernel scratch by the compiler's rule; the most of that at any op.

So ``peak = static + batch + made - the parameters' gradients`` (the step's gradients replace the last
step's, freed first), at least ``static + batch``.

Backprop baseline: :func:`measure_model_step_bytes` counts one ordinary end-to-end SGD step of a whole
model by the same rules (same code path), :func:`model_memory_line` fits its line and
:func:`max_batch_under` picks the largest batch under a budget with Algorithm 1's feasible-batch rule, so
the baseline and the local-learning blocks are compared at the same budget.

Cross-check, :func:`profiler_peak_bytes`: the same step under ``torch.profiler`` with
``profile_memory=True``; the profiler's memory timeline (tensors pre-existing at the start, created,
destroyed, as the allocator saw them) is replayed and its running maximum is the peak. It sees real
allocations in time order (so backward's frees before later allocations), uses the private
``profile._memory_profile()`` API of torch 2.x, and costs ~0.1 s a step. On VGG-11's first layers the two
agree within about 20%; both are linear in the batch. The counter adds the convolutions' kernel scratch by
the compiler's rule, which the profiler's events do not see. Not counted: allocator rounding and
fragmentation, the Python/CUDA context.
On CUDA the device profiler is meant to use ``torch.cuda.max_memory_allocated`` instead; this counter is
the CPU stand-in and the quantity the partitioner's budget is checked against.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np
import torch
from torch import nn

from edgetrain.runtime.python.local_memory import StepBytes, counted_step

from .heads import head_spec, split_layers
from .spec import make_head
from .partition import DEFAULT_CAP, Line, feasible_batch

__all__ = [
    "LineFit", "StepBytes", "LayerProfile", "fit_line", "measure_step_bytes", "profiler_peak_bytes",
    "profile_layers", "cuda_peak_bytes", "cuda_context_bytes", "measure_model_step_bytes", "model_memory_line", "max_batch_under",
    "DEFAULT_BATCHES", "DEFAULT_HELD_OUT",
]

# How a layer's training memory is measured: counting the tensors a step holds (CPU), torch.profiler's memory
# events (CPU), or the CUDA allocator's high-water mark.
METHODS = ("counter", "profiler", "cuda")
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


def _one_step_setup(modules: Sequence[nn.Module], in_shape: Sequence[int], batch: int, classes: int,
                    lr: float, momentum: float, seed: int):
    """Random batch, SGD over ``modules``, all in training mode: what every byte counter measures."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((batch, *in_shape), generator=gen)
    y = torch.randint(0, classes, (batch,), generator=gen)
    params = list(dict.fromkeys(p for m in modules for p in m.parameters()))  # shared params once
    opt = torch.optim.SGD(params, lr=lr, momentum=momentum)
    for m in modules:
        m.train()
    return x, y, params, opt


def _counted_step(modules: Sequence[nn.Module], forward: Callable[[torch.Tensor], Sequence[torch.Tensor]],
                  x: torch.Tensor, y: torch.Tensor, params: list[nn.Parameter],
                  opt: torch.optim.Optimizer) -> StepBytes:
    """One real SGD step counted by the runtime's rule (``edgetrain.runtime.python.local_memory``: the trainer counts
    its real steps with the same code, so lines and the trainer's measured peaks agree by construction)."""
    return counted_step(modules, forward, x, y, opt)[0]


def measure_step_bytes(layer: nn.Module, head: nn.Module, in_shape: Sequence[int], batch: int,
                       classes: int = 10, *, lr: float = 0.01, momentum: float = 0.9,
                       seed: int = 0) -> StepBytes:
    """Run one real local-learning SGD step (layer -> head -> cross-entropy) and count its bytes.

    The modules are trained in place (one step, on random data); pass copies to keep them unchanged.
    """
    x, y, params, opt = _one_step_setup((layer, head), in_shape, batch, classes, lr, momentum, seed)

    def forward(inp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = layer(inp)
        return out, head(out)

    return _counted_step((layer, head), forward, x, y, params, opt)


def measure_model_step_bytes(model: nn.Module, in_shape: Sequence[int], batch: int, classes: int = 10, *,
                             lr: float = 0.01, momentum: float = 0.9, seed: int = 0) -> StepBytes:
    """The backprop counterpart of :func:`measure_step_bytes`: one ordinary end-to-end SGD step of the
    whole model (model -> cross-entropy), counted by the same rules.

    Every activation of the network is held for backward at once here, which is what local learning
    avoids. The model is trained in place (one step, on random data); pass a copy to keep it unchanged.
    """
    x, y, params, opt = _one_step_setup((model,), in_shape, batch, classes, lr, momentum, seed)
    return _counted_step((model,), lambda inp: (model(inp),), x, y, params, opt)


def profiler_peak_bytes(layer: nn.Module, head: nn.Module, in_shape: Sequence[int], batch: int,
                        classes: int = 10, *, lr: float = 0.01, momentum: float = 0.9, seed: int = 0) -> int:
    """Peak bytes of one local-learning step from ``torch.profiler`` memory events (module docstring)."""
    from torch.profiler import ProfilerActivity, profile

    x, y, params, opt = _one_step_setup((layer, head), in_shape, batch, classes, lr, momentum, seed)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(head(layer(x)), y)
        loss.backward()
        opt.step()
        del loss
    live = peak = 0
    for _t, action, _key, size in prof._memory_profile().timeline:
        kind = str(action).rsplit(".", 1)[-1]
        if kind in ("PREEXISTING", "CREATE"):
            live += size
        elif kind == "DESTROY":
            live -= size
        peak = max(peak, live)
    return int(peak)


def cuda_context_bytes(device: str = "cuda") -> int:
    """Device memory in use that the caching allocator does not own: the CUDA context, cuBLAS/cuDNN handles.
    Reported beside the lines, not in them: it is paid once per process, whatever the batch."""
    free, total = torch.cuda.mem_get_info(device)
    return int(total - free - torch.cuda.memory_reserved(device))


def cuda_peak_bytes(layer: nn.Module, head: nn.Module, in_shape: Sequence[int], batch: int,
                    classes: int = 10, *, lr: float = 0.01, momentum: float = 0.9, seed: int = 0,
                    device: str = "cuda") -> int:
    """Peak bytes the caching allocator hands out during one local-learning step on the GPU
    (``torch.cuda.max_memory_allocated`` after a reset, batch and labels included, the context excluded)."""
    layer, head = layer.to(device), head.to(device)
    x, y, params, opt = _one_step_setup((layer, head), in_shape, batch, classes, lr, momentum, seed)
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    x, y = x.to(device), y.to(device)
    opt.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(head(layer(x)), y).backward()
    opt.step()
    torch.cuda.synchronize(device)
    return int(torch.cuda.max_memory_allocated(device))


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
                   layers: Sequence[int] | None = None, method: str = "counter") -> list[LayerProfile]:
    """Measure every layer (+ its AAN-LL head) at ``batches``, fit a line, check it at ``held_out``.

    ``layers`` restricts the profile to those layer indices. The model's weights are left untouched
    (each measurement trains a deep copy of the layer). ``method``: "counter" (:func:`measure_step_bytes`,
    with a per-component breakdown in ``detail``), "profiler" (:func:`profiler_peak_bytes`) or "cuda"
    (:func:`cuda_peak_bytes`; the CUDA context is :func:`cuda_context_bytes`, reported apart).
    """
    if method not in METHODS:
        raise ValueError(f"profile_layers: method must be 'counter', 'profiler' or 'cuda', got {method!r}")
    if method == "cuda" and not torch.cuda.is_available():
        raise ValueError("profile_layers: method 'cuda' needs a CUDA device; this torch sees none "
                         "(use method 'counter' on the CPU)")
    import copy

    batches = list(batches)
    profiles = []
    for i, tl in enumerate(split_layers(model, tuple(in_shape))):
        if layers is not None and i not in layers:
            continue
        spec = head_spec(tl.out_shape, classes)
        detail, peaks = [], []
        for b in [*batches, held_out]:
            torch.manual_seed(0)
            mod, head = copy.deepcopy(tl.module), make_head(spec)
            if method == "counter":
                detail.append(measure_step_bytes(mod, head, tl.in_shape, b, classes))
                peaks.append(detail[-1].peak)
            elif method == "cuda":
                peaks.append(cuda_peak_bytes(mod, head, tl.in_shape, b, classes))
            else:
                peaks.append(profiler_peak_bytes(mod, head, tl.in_shape, b, classes))
        pts = list(zip(batches, peaks[:-1]))
        fit = fit_line(batches, peaks[:-1])
        profiles.append(LayerProfile(tl.name, tl.in_shape, tl.out_shape, spec.head_channels, pts, fit,
                                     held_out, peaks[-1], fit.predict(held_out), detail))
    return profiles


def model_memory_line(model: nn.Module, in_shape: Sequence[int], batches: Iterable[int] = DEFAULT_BATCHES,
                      classes: int = 10) -> LineFit:
    """Backprop baseline's memory line: :func:`measure_model_step_bytes` peaks at ``batches``, fitted.

    Each measurement trains a deep copy, so ``model`` is left untouched.
    """
    import copy

    batches = list(batches)
    peaks = [measure_model_step_bytes(copy.deepcopy(model), in_shape, b, classes).peak for b in batches]
    return fit_line(batches, peaks)


def max_batch_under(line: LineFit | Line, budget_bytes: float, cap: int = DEFAULT_CAP,
                    name: str = "model") -> int:
    """Largest batch (at most ``cap``) whose line value fits ``budget_bytes``: Algorithm 1's rule for one
    layer, so the backprop baseline and the local-learning blocks are held to the same budget.

    Raises :class:`~edgetrain.compiler.local.partition.PartitionError` when not even batch 1 fits.
    """
    if isinstance(line, LineFit):
        line = line.to_line(name)
    return feasible_batch(line, budget_bytes, cap)[0]


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m edgetrain.compiler.local.memory_lines MODEL [--budget-mb B] [--method counter|profiler]``:
    prints each layer's line, R² and held-out check, then Algorithm 1's blocks under the budget."""
    import argparse

    from edgetrain.compiler.frontend import zoo
    from .partition import partition

    ap = argparse.ArgumentParser(prog="python -m edgetrain.compiler.local.memory_lines")
    ap.add_argument("model")
    ap.add_argument("--budget-mb", type=float, default=64.0)
    ap.add_argument("--method", default="counter", choices=METHODS)
    ap.add_argument("--cap", type=int, default=256)
    ap.add_argument("--rho", type=float, default=0.40)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    profs = profile_layers(zoo.build(args.model), method=args.method)
    print(f"{'layer':<12} {'slope B/sample':>14} {'intercept B':>12} {'R2':>8} "
          f"{'b=' + str(DEFAULT_HELD_OUT) + ' meas':>12} {'pred':>12} {'err':>6}")
    for p in profs:
        print(f"{p.name:<12} {p.fit.slope:>14.0f} {p.fit.intercept:>12.0f} {p.fit.r2:>8.5f} "
              f"{p.held_out_measured:>12} {p.held_out_predicted:>12.0f} {p.held_out_rel_error:>6.3f}")
    part = partition([p.fit.to_line(p.name) for p in profs], args.budget_mb * 2**20, cap=args.cap,
                     rho=args.rho)
    print(f"\nAlgorithm 1, budget {args.budget_mb} MiB, cap {args.cap}, rho {args.rho}:")
    for b in part.blocks:
        print(f"  block {b.index}: batch {b.batch:>4}  peak {b.peak_bytes / 2**20:7.1f} MiB  layers "
              + ", ".join(f"{lb.name}(b_max {lb.feasible_batch})" for lb in b.layers))


if __name__ == "__main__":
    main()
