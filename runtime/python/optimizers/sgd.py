"""SGD with momentum, weight decay and Nesterov momentum (dampening 0): torch.optim.SGD's single-tensor update."""
from __future__ import annotations

from torch import Tensor

from .unit import OptimizerUnit


def _state(s) -> tuple[str, ...]:
    return ("momentum",) if s["momentum"] else ()


def _flops(s) -> int:
    # d = g + wd*p; buf = m*buf + d; d = d + m*buf (Nesterov); p -= lr*d
    momentum = bool(s["momentum"])
    return 2 + 2 * bool(s["weight_decay"]) + 2 * momentum + 2 * (momentum and bool(s["nesterov"]))


def _update(s, param: Tensor, state: dict[str, Tensor]):
    buf, lr, momentum, weight_decay, nesterov = (state.get("momentum"), s["lr"], s["momentum"], s["weight_decay"],
                                                 s["nesterov"])
    return lambda grad, scratch: sgd_step(param, grad, buf, lr, momentum, weight_decay, nesterov, scratch)


def sgd_step(param: Tensor, grad: Tensor, buf: Tensor | None, lr: float, momentum: float, weight_decay: float,
             nesterov: bool, grad_is_scratch: bool = False) -> None:
    """torch's `_single_tensor_sgd` (dampening 0): the buffer starts at zeros, so the first step's
    buf = 0*m + d equals torch's clone(d) exactly. A gradient nothing reads afterwards takes the weight decay
    in place (the same add, without a parameter-sized temporary)."""
    d = grad
    if weight_decay != 0:
        d = d.add_(param, alpha=weight_decay) if grad_is_scratch else d.add(param, alpha=weight_decay)
    if momentum != 0:
        buf.mul_(momentum).add_(d, alpha=1)
        d = d.add(buf, alpha=momentum) if nesterov else buf
    param.add_(d, alpha=-lr)


def _temporaries(s, in_place: bool) -> int:
    # d = g + wd*p where the gradient cannot take it; Nesterov's d + m*buf while d is still live (measured: 1.0
    # and 2.0 parameters of growth on a 4 MiB weight)
    return int(bool(s["weight_decay"]) and not in_place) + int(bool(s["momentum"]) and bool(s["nesterov"]))


def _check(s) -> str | None:
    return "Nesterov momentum needs a momentum above 0" if s["nesterov"] and s["momentum"] <= 0 else None


SGD = OptimizerUnit(name="sgd", torch_class="SGD",
                    defaults={"lr": 0.01, "momentum": 0.9, "weight_decay": 5e-4, "nesterov": False},
                    state=_state, flops=_flops, update=_update, temporaries=_temporaries, check=_check,
                    c_kernel="sgd", c_requires={"nesterov": False})
