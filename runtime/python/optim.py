"""The optimizers a plan applies right after a parameter's gradient is complete: SGD, Adam, AdamW.

Each update is torch.optim's own single-tensor arithmetic (foreach=False), so a plan's weights equal those
of `torch.optim.<Optimizer>(foreach=False)` after the same steps. State is allocated up front (zeros, as
torch starts it) so that its memory is known before the first step.
"""
from __future__ import annotations

import torch
import torch.optim.adam as _adam
from torch import Tensor

OPTIMIZERS = ("sgd", "adam", "adamw")


def state_names(config: dict) -> tuple[str, ...]:
    """The state tensors an optimizer keeps per trainable parameter (each the parameter's size)."""
    name = config.get("name", "sgd")
    if name == "sgd":
        return ("momentum",) if config.get("momentum", 0) else ()
    if name in ("adam", "adamw"):
        return ("exp_avg", "exp_avg_sq")
    raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")


def update_flops_per_element(config: dict) -> int:
    """Elementwise operations per parameter element of one `Optimizer.update` (the arithmetic below)."""
    name = config.get("name", "sgd")
    decay = bool(config.get("weight_decay", 0))
    if name == "sgd":  # d = g + wd*p; buf = m*buf + d; d = d + m*buf (Nesterov); p -= lr*d
        momentum = bool(config.get("momentum", 0))
        return 2 + 2 * decay + 2 * momentum + 2 * (momentum and bool(config.get("nesterov", False)))
    if name in ("adam", "adamw"):
        # m.lerp_(g) 3, v = b2*v + (1-b2)*g*g 4, denom = sqrt(v)/c2 + eps 3, p.addcdiv_(m, denom) 3;
        # decay: Adam's g + wd*p 2, AdamW's p *= 1 - lr*wd 1
        return 13 + (2 if name == "adam" else 1) * decay
    raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")


def step_counter_bytes(config: dict) -> int:
    """Adam's per-parameter step count is a 0-d float32 tensor."""
    return 4 if config.get("name", "sgd") in ("adam", "adamw") else 0


class Optimizer:
    def __init__(self, config: dict, params: dict[str, Tensor], trainable) -> None:
        self.config = dict(config)
        self.name = self.config.get("name", "sgd")
        self.state: dict[str, dict[str, Tensor]] = {}
        for p_name in trainable:
            p = params[p_name]
            st = {s: torch.zeros_like(p) for s in state_names(self.config)}
            if step_counter_bytes(self.config):
                st["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
            self.state[p_name] = st

    def state_bytes(self) -> dict[str, int]:
        return {f"optim/{p}/{s}": t.numel() * t.element_size() for p, st in self.state.items() for s, t in st.items()}

    @torch.no_grad()
    def update(self, name: str, param: Tensor, grad: Tensor, grad_is_scratch: bool = False) -> None:
        """`grad_is_scratch`: nothing reads the gradient after this update, so SGD may add into it."""
        self.updater(name, param)(grad, grad_is_scratch)

    def updater(self, name: str, param: Tensor):
        """`update` of one parameter with its state and settings looked up once: a function (grad,
        grad_is_scratch) to call with grad mode off (a runtime prepares one per parameter)."""
        c, st = self.config, self.state[name]
        if self.name == "sgd":
            buf, lr, momentum = st.get("momentum"), c["lr"], c.get("momentum", 0.0)
            weight_decay, nesterov = c.get("weight_decay", 0.0), c.get("nesterov", False)
            return lambda grad, scratch: _sgd(param, grad, buf, lr, momentum, weight_decay, nesterov, scratch)
        beta1, beta2 = c.get("betas", (0.9, 0.999))
        m, v, step = st["exp_avg"], st["exp_avg_sq"], st["step"]
        settings = dict(foreach=False, capturable=False, differentiable=False, fused=None, grad_scale=None,
                        found_inf=None, has_complex=False, decoupled_weight_decay=self.name == "adamw",
                        amsgrad=False, beta1=beta1, beta2=beta2, lr=c["lr"], weight_decay=c.get("weight_decay", 0.0),
                        eps=c.get("eps", 1e-8), maximize=False)
        return lambda grad, scratch: _adam.adam([param], [grad], [m], [v], [], [step], **settings)


def _sgd(param: Tensor, grad: Tensor, buf: Tensor | None, lr: float, momentum: float, weight_decay: float,
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
