"""The exactness reference: the user's model trained by plain PyTorch autograd from the same weights and data.

Dropout modules are swapped for ones that draw the runtime's mask (same seed, step and module), the only
change to the model; everything else is the model as the user wrote it, with torch.optim.SGD.
"""
from __future__ import annotations

import zlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file

from edgetrain.runtime.python.kernels import dropout_apply, dropout_mask

from edgetrain.compiler.frontend.modelspec import resolve


class _SeededDropout(nn.Module):
    def __init__(self, qualname: str, p: float, seed: int, clock: list[int]) -> None:
        super().__init__()
        self.seed_id, self.p, self.seed, self.clock = zlib.crc32(qualname.encode()), p, seed, clock

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = dropout_mask(tuple(x.shape), self.p, self.seed, self.clock[0], self.seed_id, x.device)
        return dropout_apply(x, mask, self.p)


def _swap_dropout(model: nn.Module, seed: int, clock: list[int]) -> None:
    for qual, mod in list(model.named_modules()):
        if isinstance(mod, nn.Dropout) and mod.p > 0:
            parent_name, _, leaf = qual.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, leaf, _SeededDropout(qual, mod.p, seed, clock))


def load_weights(model: nn.Module, path: str) -> None:
    tensors = load_file(path)
    with torch.no_grad():
        for k, p in model.named_parameters():
            p.copy_(tensors[f"param/{k}"])
        for k, b in model.named_buffers():
            b.copy_(tensors[f"buffer/{k}"])


def _cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Classes along the last dim; per-token logits (B, T, V) are averaged over all B*T positions."""
    if logits.dim() > 2:
        logits, labels = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)
    return F.cross_entropy(logits, labels)


def train_reference(schedule: dict, weights_path: str, batches: list[tuple[torch.Tensor, torch.Tensor]],
                    device: torch.device, first_step: int = 0) -> tuple[nn.Module, list[float]]:
    spec = schedule["model"]
    torch.manual_seed(schedule["seed"])
    model = resolve(spec["spec"], **spec["kwargs"]).module
    load_weights(model, weights_path)
    model.to(device).train()
    clock = [first_step]
    _swap_dropout(model, schedule["seed"], clock)
    o = schedule["graph"]["optimizer"]
    opt = torch.optim.SGD(model.parameters(), lr=o["lr"], momentum=o["momentum"], weight_decay=o["weight_decay"],
                          foreach=False)
    loss_fn = _cross_entropy if spec["loss"] == "cross_entropy" else F.mse_loss
    losses = []
    for k, (x, y) in enumerate(batches):
        clock[0] = first_step + k
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return model, losses
