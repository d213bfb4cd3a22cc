"""Layers and auxiliary heads of a local-learning plan, built from their JSON specs (torch.nn only).

A spec is a list of primitive modules, e.g. ``[{"op": "conv2d", "in": 3, "out": 64, "kernel": 3, ...},
{"op": "batchnorm2d", "channels": 64}, {"op": "relu"}, {"op": "maxpool2d", "kernel": 2, "stride": 2}]``,
and ``{"op": "residual", "main": [...], "shortcut": [...], "post": [...]}`` for a residual block (an empty
shortcut is the identity). The compiler writes specs; this module is the one place that turns them into
modules, for the generated plan and for the compiler's own profiling alike.
"""
from __future__ import annotations

from typing import Callable

from torch import nn

__all__ = ["Residual", "build", "build_module", "OPS"]


class Residual(nn.Module):
    """``post(main(x) + shortcut(x))``: a ResNet basic block in spec form."""

    def __init__(self, main: nn.Sequential, shortcut: nn.Sequential, post: nn.Sequential) -> None:
        super().__init__()
        self.main, self.shortcut, self.post = main, shortcut, post

    def forward(self, x):
        return self.post(self.main(x) + (self.shortcut(x) if len(self.shortcut) else x))


def _conv(s: dict) -> nn.Module:
    return nn.Conv2d(s["in"], s["out"], s["kernel"], stride=s.get("stride", 1), padding=s.get("padding", 0),
                     groups=s.get("groups", 1), bias=s.get("bias", True))


OPS: dict[str, Callable[[dict], nn.Module]] = {
    "conv2d": _conv,
    "batchnorm2d": lambda s: nn.BatchNorm2d(s["channels"], eps=s.get("eps", 1e-5), momentum=s.get("momentum", 0.1)),
    # Out of place: the saved tensors (and so the memory lines) are those of the plain meaning.
    "relu": lambda s: nn.ReLU(),
    "relu6": lambda s: nn.ReLU6(),
    "maxpool2d": lambda s: nn.MaxPool2d(s["kernel"], stride=s.get("stride"), padding=s.get("padding", 0)),
    "avgpool2d": lambda s: nn.AvgPool2d(s["kernel"], stride=s.get("stride"), padding=s.get("padding", 0)),
    "adaptive_avgpool2d": lambda s: nn.AdaptiveAvgPool2d(s["size"]),
    "flatten": lambda s: nn.Flatten(),
    "linear": lambda s: nn.Linear(s["in"], s["out"], bias=s.get("bias", True)),
    "residual": lambda s: Residual(build(s["main"]), build(s["shortcut"]), build(s["post"])),
}


def build_module(spec: dict) -> nn.Module:
    op = spec.get("op")
    if op not in OPS:
        raise ValueError(f"local plan: unknown layer op {op!r} in {spec}; this runtime builds {sorted(OPS)}")
    return OPS[op](spec)


def build(specs: list[dict]) -> nn.Sequential:
    return nn.Sequential(*(build_module(s) for s in specs))
