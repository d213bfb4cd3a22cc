"""The fused weight update: SGD with momentum and weight decay, bit-identical to torch.optim.SGD(foreach=False)."""
from __future__ import annotations

import torch
from torch import Tensor


@torch.no_grad()
def sgd_update(param: Tensor, grad: Tensor, buf: Tensor | None, lr: float, momentum: float,
               weight_decay: float) -> None:
    """Update `param` (and the momentum buffer `buf`) in place.

    Same tensor ops, in the same order, as torch's `_single_tensor_sgd` (dampening 0, no nesterov):
    d = g + wd*p; buf = m*buf + d; p -= lr*buf. The buffer starts at zeros, so the first step gives
    buf = 0*m + d = d, which equals torch's `clone(d)` exactly.
    """
    d = grad
    if weight_decay != 0:
        d = d.add(param, alpha=weight_decay)
    if momentum != 0:
        if buf is None:
            raise ValueError("momentum != 0 needs a momentum buffer")
        buf.mul_(momentum).add_(d, alpha=1)
        d = buf
    param.add_(d, alpha=-lr)
