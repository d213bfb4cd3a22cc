"""A small CNN for 1x28x28 Fashion-MNIST whose frozen backbone ends in a convolution (what an int8 prefix hands a
float head) and whose head - a mean over H and W, ReLU and a linear layer - has no batch norm, so that it trains at
batch 1 (a batch norm over one image's 7x7 positions leaves little of its features). benchmarks/int8_finetune.py's
default model: `benchmarks/fmnist_cnn.py:fmnist_cnn`."""
from __future__ import annotations

import torch
import torch.nn as nn


class FmnistCnn(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 16, 3, stride=2, padding=1), nn.ReLU(),
                                      nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
                                      nn.Conv2d(32, 64, 3, padding=1))
        self.classifier = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.relu(self.features(x).mean((2, 3))))


def fmnist_cnn(num_classes: int = 10) -> nn.Module:
    m = FmnistCnn(num_classes)
    for p in m.features.parameters():  # the backbone frozen, the classifier trained
        p.requires_grad_(False)
    return m
