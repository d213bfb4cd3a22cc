"""Adam and AdamW: torch.optim.adam's own single-tensor function (AdamW is Adam with decoupled weight decay)."""
from __future__ import annotations

import torch.optim.adam as _adam
from torch import Tensor

from .unit import OptimizerUnit


def _flops(decoupled: bool):
    # m.lerp_(g) 3, v = b2*v + (1-b2)*g*g 4, denom = sqrt(v)/c2 + eps 3, p.addcdiv_(m, denom) 3;
    # decay: Adam's g + wd*p 2, AdamW's p *= 1 - lr*wd 1
    return lambda s: 13 + (1 if decoupled else 2) * bool(s["weight_decay"])


def _update(decoupled: bool):
    def make(s, param: Tensor, state: dict[str, Tensor]):
        beta1, beta2 = s["betas"]
        m, v, step = state["exp_avg"], state["exp_avg_sq"], state["step"]
        settings = dict(foreach=False, capturable=False, differentiable=False, fused=None, grad_scale=None,
                        found_inf=None, has_complex=False, decoupled_weight_decay=decoupled, amsgrad=False,
                        beta1=beta1, beta2=beta2, lr=s["lr"], weight_decay=s["weight_decay"], eps=s["eps"],
                        maximize=False)
        return lambda grad, scratch: _adam.adam([param], [grad], [m], [v], [], [step], **settings)
    return make


def _temporaries(decoupled: bool):
    # torch's own function: Adam's g + wd*p (always out of place), and denom = sqrt(v) / c2 made from the
    # square root's temporary, both live at once (measured: 3.0 parameters of growth with weight decay, 2.0
    # without and for AdamW, on a 4 MiB weight)
    return lambda s, in_place: 2 + int(bool(s["weight_decay"]) and not decoupled)


def _unit(name: str, torch_class: str, weight_decay: float, decoupled: bool) -> OptimizerUnit:
    return OptimizerUnit(name=name, torch_class=torch_class,
                         defaults={"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": weight_decay},
                         state=lambda s: ("exp_avg", "exp_avg_sq"), flops=_flops(decoupled),
                         update=_update(decoupled), temporaries=_temporaries(decoupled),
                         step_counter=True)


ADAM = _unit("adam", "Adam", 0.0, decoupled=False)
ADAMW = _unit("adamw", "AdamW", 1e-2, decoupled=True)
