"""The runtime's optimizer: each trainable parameter's state and its update, as its unit (optimizers/) says.

Each update is torch.optim's own single-tensor arithmetic (foreach=False), so a plan's weights equal those
of `torch.optim.<Optimizer>(foreach=False)` after the same steps. State is allocated up front (zeros, as
torch starts it) so that its memory is known before the first step.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .optimizers import OPTIMIZERS, state_names, step_counter_bytes, unit_of, update_flops_per_element

__all__ = ["OPTIMIZERS", "Optimizer", "state_names", "step_counter_bytes", "update_flops_per_element"]


class Optimizer:
    def __init__(self, config: dict, params: dict[str, Tensor], trainable) -> None:
        self.config = dict(config)
        self.unit = unit_of(self.config)
        self.name = self.unit.name
        self.settings = self.unit.settings(self.config)
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
        return self.unit.update(self.settings, param, self.state[name])
