"""Adagrad (no learning-rate decay, accumulator from zero): torch.optim.adagrad's own single-tensor function."""
from __future__ import annotations

import torch.optim.adagrad as _adagrad
from torch import Tensor

from .unit import OptimizerUnit


def _update(s, param: Tensor, state: dict[str, Tensor]):
    total, step = state["sum"], state["step"]
    settings = dict(foreach=False, fused=None, grad_scale=None, found_inf=None, has_sparse_grad=False,
                    differentiable=False, has_complex=False, lr=s["lr"], weight_decay=s["weight_decay"],
                    lr_decay=0.0, eps=s["eps"], maximize=False)
    return lambda grad, scratch: _adagrad.adagrad([param], [grad], [total], [step], **settings)


# torch's own function: g + wd*p (always out of place) and std = sqrt(sum) + eps, both live at once (measured:
# 2.0 parameters of growth with weight decay, 1.0 without, on a 4 MiB weight)
def _temporaries(s, in_place: bool) -> int:
    return 1 + int(bool(s["weight_decay"]))


# sum += g*g 2, sqrt(sum) + eps 2, p.addcdiv_(g, std, -lr) 3; decay: g + wd*p 2
ADAGRAD = OptimizerUnit(name="adagrad", torch_class="Adagrad",
                        defaults={"lr": 0.01, "eps": 1e-10, "weight_decay": 0.0},
                        state=lambda s: ("sum",), flops=lambda s: 7 + 2 * bool(s["weight_decay"]),
                        update=_update, temporaries=_temporaries, step_counter=True)
