"""One checked training step: the plan must reach its end, keep the predicted peak, and stay finite.

The executor checks each call a plan makes; these are the checks on a whole step, made after it: a plan cut
short (a truncated plan.py returns without ending its step) is an error, not a loss; the ledger's peak must
equal the schedule's prediction to the byte (the promise the compiler makes); a non-finite loss or
parameter stops training at the step that produced it.
"""
from __future__ import annotations

import math

import torch

from .executor import PlanError, Runtime


class PeakMismatchError(RuntimeError):
    """The measured peak differs from the schedule's prediction: the plan or its weights are not as compiled."""


class NonFiniteError(ArithmeticError):
    """A loss or a parameter became NaN or infinite."""


def first_non_finite(tensors: dict[str, torch.Tensor]) -> str | None:
    for name, t in tensors.items():
        # A NaN or an infinity makes the sum non-finite, so a finite sum clears the tensor; only a non-finite
        # one (or finite values that overflow it) is checked element by element. 10-20x cheaper per step.
        if t.is_floating_point() and not math.isfinite(t.sum()) and not bool(torch.isfinite(t).all()):
            return name
    return None


def check_finite(rt: Runtime, loss, step: int) -> None:
    if loss is not None and not math.isfinite(loss):
        raise NonFiniteError(f"step {step}: the loss is {loss}; training stopped (check the data for NaN or "
                             "infinite values, or lower the learning rate)")
    bad = first_non_finite(rt.params)
    if bad is not None:
        raise NonFiniteError(f"step {step}: parameter '{bad}' became non-finite (a NaN or infinite gradient); "
                             "training stopped (check the data and the weights, or lower the learning rate)")


def check_peak(rt: Runtime, predicted_peak_bytes: int | None, step: int) -> None:
    measured = rt.ledger.peak_bytes
    if predicted_peak_bytes is not None and measured != predicted_peak_bytes:
        raise PeakMismatchError(
            f"step {step}: measured peak {measured} B differs from the schedule's predicted peak "
            f"{predicted_peak_bytes} B (set by {rt.ledger.peak_at}); the plan or its weights are not what was "
            "compiled: recompile the model")


def checked_step(plan, rt: Runtime, x: torch.Tensor, y: torch.Tensor, *, check_peak_bytes: bool = True) -> float:
    """Run one step of a loaded plan on (x, y) with every whole-step check; returns its loss."""
    step = rt.step
    rt.begin_step(x, y)
    try:
        loss = plan.train_step(rt)
    finally:
        rt.restore_threads()  # a step cut short by an error leaves the caller's thread count as it was
    if rt._in_step or rt.step != step + 1:
        raise PlanError(f"step {step} never reached its end (plan.py returned at op #{rt._op} without "
                        "end_step()): the plan is incomplete; recompile the model")
    if check_peak_bytes:
        check_peak(rt, plan.PLAN.get("predicted_peak_bytes"), step)
    check_finite(rt, loss, step)
    return loss
