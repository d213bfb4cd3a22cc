"""The layout a plan's tensors take: torch's default (contiguous rows) or channels-last for convolution weights.

A fused plan of a convolutional model (`compile --fuse`) holds its 4-D parameters, the convolution weights,
channels-last. torch's CPU and GPU convolutions give a channels-last output when their weight is channels-last,
and batch norm, activations and their backwards keep the layout of what they read, so every activation the
plan holds follows without a conversion of its own: the oneDNN kernels then run where the default layout takes
torch's slower reference convolution (1x1 convolutions of a small batch on one thread), which is what
torch.compile's own layout pass buys on such models. Bytes are the same in either layout, so the ledger and
the plan's predicted peak do not change; the arithmetic's order does, so such a plan is checked within the
fused plans' tolerance (fused_kernels.FUSED_RTOL), not bit for bit.
"""
from __future__ import annotations

import torch
from torch import Tensor

CONTIGUOUS, CHANNELS_LAST = "contiguous", "channels_last"
MEMORY_FORMATS = (CONTIGUOUS, CHANNELS_LAST)


def check(memory_format: str | None) -> str:
    """The plan's memory format, None read as the default; ValueError names an unknown one."""
    if memory_format is None:
        return CONTIGUOUS
    if memory_format not in MEMORY_FORMATS:
        raise ValueError(f"unknown memory format {memory_format!r}; this runtime lays tensors out as "
                         f"{' or '.join(MEMORY_FORMATS)}: recompile the plan with this edgetrain")
    return memory_format


def lay_out(params: dict[str, Tensor], memory_format: str) -> int:
    """Give each 4-D parameter the plan's layout in place (the same tensor object, its storage replaced: what
    holds it sees the new layout); returns how many changed."""
    if memory_format != CHANNELS_LAST:
        return 0
    changed = 0
    for t in params.values():
        if t.dim() == 4 and not t.is_contiguous(memory_format=torch.channels_last):
            new = t.contiguous(memory_format=torch.channels_last)
            with torch.no_grad():
                t.set_(new.untyped_storage(), 0, new.shape, new.stride())
            changed += 1
    return changed
