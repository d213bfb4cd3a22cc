"""The rules a C firmware's trained tensors are held to against eager autograd (`run --check`).

The plain rule: every element within RTOL/ATOL of eager float32 torch. Where a tensor misses it, float32
rounding may be the cause (a batch norm over a few values a channel magnifies it), or a kernel may be wrong. The
same steps run eagerly in float64 (same data, same optimizer) settle which: the tensor passes only when the
firmware is as close to float64 as eager float32 is, within ROUNDING_FACTOR. A wrong sign or an off-by-one is
far from float64 and fails.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

RTOL, ATOL = 1e-5, 1e-6
# How much further from float64 than eager float32 the firmware may be: its kernels sum in another order, so its
# rounding differs from torch's without being larger in kind (measured: up to 2.3x, GhostNet's running statistics).
ROUNDING_FACTOR = 4.0
# A ReLU's input this close to a bound, in float32 epsilons of the tensor's largest magnitude, takes its mask from
# the order of the sum that made it (an untrained MobileNetV2's last block: 235 inputs within it after one update).
NEAR_BOUND_EPS = 16


@dataclass(frozen=True)
class TensorCheck:
    """One tensor's verdict: `rule` is "rtol" (within RTOL/ATOL of eager float32), "float64" (missed that,
    but no further from float64 than eager float32 is, within ROUNDING_FACTOR) or "failed"."""

    name: str
    rule: str
    max_abs_err: float  # the firmware against eager float32
    max_rel_err: float
    float64_err: float | None = None  # the firmware's max abs error against eager float64 (where it was needed)
    eager_float64_err: float | None = None  # eager float32's, against the same

    def to_json(self) -> dict:
        out = {"name": self.name, "rule": self.rule, "max_abs_err": self.max_abs_err, "max_rel_err": self.max_rel_err}
        if self.float64_err is not None:
            out.update(float64_err=self.float64_err, eager_float64_err=self.eager_float64_err)
        return out

    def describe(self) -> str:
        if self.float64_err is None:
            return f"{self.name} (max abs err {self.max_abs_err:.3g})"
        return (f"{self.name} (max abs err {self.max_abs_err:.3g}; against float64 {self.float64_err:.3g}, eager "
                f"float32 {self.eager_float64_err:.3g})")


def plain(name: str, ours: torch.Tensor, eager: torch.Tensor) -> TensorCheck:
    """The plain rule: `ours` within RTOL/ATOL of eager float32 (`eager`), element by element."""
    diff = (ours - eager).abs()
    max_abs = float(diff.max()) if diff.numel() else 0.0
    max_rel = float((diff / eager.abs().clamp_min(ATOL)).max()) if diff.numel() else 0.0
    ok = torch.allclose(ours, eager, rtol=RTOL, atol=ATOL)
    return TensorCheck(name, "rtol" if ok else "failed", max_abs, max_rel)


def against_float64(missed: TensorCheck, ours: torch.Tensor, eager: torch.Tensor,
                    eager64: torch.Tensor) -> TensorCheck:
    """A tensor that missed the plain rule, held to float64: it passes when the firmware's max abs error against
    eager float64 is at most ROUNDING_FACTOR times eager float32's (and eager float32 itself is not exact)."""
    ours_err = float((ours.double() - eager64).abs().max())
    eager_err = float((eager.double() - eager64).abs().max())
    rule = "float64" if ours_err <= ROUNDING_FACTOR * eager_err else "failed"
    return TensorCheck(missed.name, rule, missed.max_abs_err, missed.max_rel_err, ours_err, eager_err)


def tensors_of(model, names) -> dict[str, torch.Tensor]:
    """A model's parameters and the buffers among `names` (running statistics), detached on the CPU."""
    names = set(names)
    pairs = list(model.named_parameters()) + [(k, b) for k, b in model.named_buffers() if k in names]
    return {k: t.detach().cpu() for k, t in pairs}


def check_tensors(ours: dict, eager: dict, float64_run) -> list[TensorCheck]:
    """Every tensor of `eager` (name -> eager float32's) against the firmware's (`ours`); `float64_run()` gives the
    float64 run's tensors, called only when some floating tensor missed the plain rule."""
    checks = [plain(k, ours[k], ref) for k, ref in eager.items()]
    missed = [c for c in checks if c.rule == "failed" and eager[c.name].is_floating_point()]
    if not missed:
        return checks
    eager64 = float64_run()
    held = {c.name: against_float64(c, ours[c.name], eager[c.name], eager64[c.name]) for c in missed}
    return [held.get(c.name, c) for c in checks]


_aten = torch.ops.aten
_CLAMPS = {_aten.relu.default: False, _aten.relu_.default: False, _aten.hardtanh.default: True,
           _aten.hardtanh_.default: True}  # op -> whether it has an upper bound (its args' third)


class NearBounds(TorchDispatchMode):
    """While active, counts the inputs of ReLU and hardtanh (ReLU6) that lie within NEAR_BOUND_EPS float32 epsilons
    (of the input's largest magnitude) of a bound without being on it: masks another order of sums may flip. By the
    op and its input's shape."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in _CLAMPS and args[0].is_floating_point() and args[0].numel():
            x = args[0].detach()
            bounds = [float(args[1]) if len(args) > 1 else -1.0, float(args[2]) if len(args) > 2 else 1.0] \
                if _CLAMPS[func] else [0.0]
            tol = NEAR_BOUND_EPS * torch.finfo(torch.float32).eps * float(x.abs().max())
            near = sum(int(((x - b).abs() <= tol).logical_and(x != b).sum()) for b in bounds)
            if near:
                self.counts[f"{func.__name__.split('.')[0]} on {tuple(x.shape)}"] += near
        return func(*args, **(kwargs or {}))

    def describe(self) -> str:
        """The sentence a failed check's error ends with (". N ReLU inputs ..."), or "" where no input lay near a
        bound."""
        if not self.counts:
            return ""
        top = ", ".join(f"{k}: {n}" for k, n in self.counts.most_common(3))
        return (f". {sum(self.counts.values())} ReLU inputs of the reference's steps lie within float32 rounding of a "
                f"bound ({top}), where a mask follows the order of a sum: the difference may be rounding, not a "
                "kernel; check over fewer steps, or from trained weights")
