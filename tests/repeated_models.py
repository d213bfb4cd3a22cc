"""A stack of identical residual MLP blocks: the smallest graph with repeated blocks (scheduling/repeats.py)."""
from __future__ import annotations

import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, h):
        return h + self.down(torch.nn.functional.gelu(self.up(self.norm(h))))


class Stack(nn.Module):
    def __init__(self, layers: int, width: int, features: int, classes: int) -> None:
        super().__init__()
        self.embed = nn.Linear(features, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(layers))
        self.head = nn.Linear(width, classes)
        self.input_shape = (features,)

    def forward(self, x):
        h = self.embed(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


def stack(layers: int = 4, width: int = 64, features: int = 32, classes: int = 10) -> Stack:
    torch.manual_seed(0)
    return Stack(layers, width, features, classes)
