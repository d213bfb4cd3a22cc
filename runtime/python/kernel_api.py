"""What every kernel shares: its context, its result, and the aten namespace it calls."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

aten = torch.ops.aten

MEAN = 1  # at::Reduction::Mean
IGNORE_INDEX = -100  # F.cross_entropy's default


@dataclass
class KernelContext:
    first: bool = True  # False on a recompute
    buffers: list[Tensor] = field(default_factory=list)
    aux: tuple | None = None  # aux of the forward node a backward node differentiates
    step: int = 0
    seed: int = 0
    device: torch.device | str = "cpu"


@dataclass
class KernelResult:
    out: Tensor | None
    aux: tuple[Tensor, ...] | None = None
    grads: list[Tensor] = field(default_factory=list)
    scratch: list[Tensor] = field(default_factory=list)


Kernel = Callable[[KernelContext, list[Tensor], list[Tensor], dict], KernelResult]


def grad_mask(attrs: dict) -> bool:
    """Whether a backward kernel computes its input's gradient (a first layer's is never read)."""
    return bool(attrs.get("needs_input_grad", True))
