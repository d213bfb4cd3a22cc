"""Torch modules of a locally trained layer as JSON specs (the inverse of ``edgetrain.runtime.python.local_layers``).

:func:`layer_spec` describes a :class:`~edgetrain.compiler.local.heads.TrainableLayer`'s module; :func:`head_layer_spec`
an AAN-LL head. :func:`copy_weights` moves a zoo layer's parameters and buffers into the module built from
its spec, checking shapes and that both compute the same function.
"""
from __future__ import annotations

import torch
from torch import nn

from edgetrain.runtime.python.local_layers import build

from edgetrain.compiler.frontend import zoo
from edgetrain.compiler.errors import UnsupportedModelError
from .heads import HeadSpec

__all__ = ["layer_spec", "head_layer_spec", "make_head", "copy_weights"]


def _pair(v) -> int:
    v = v if isinstance(v, int) else tuple(v)
    if isinstance(v, tuple):
        if len(set(v)) != 1:
            raise UnsupportedModelError(f"local learning: non-square kernel/stride/padding {v} is not supported")
        v = v[0]
    return int(v)


def _one(m: nn.Module) -> list[dict]:
    if isinstance(m, nn.Conv2d):
        if not isinstance(m.padding, (int, tuple)) or m.dilation not in (1, (1, 1)):
            raise UnsupportedModelError(f"local learning: {m} (dilation or string padding) is not supported")
        return [{"op": "conv2d", "in": m.in_channels, "out": m.out_channels, "kernel": _pair(m.kernel_size),
                 "stride": _pair(m.stride), "padding": _pair(m.padding), "groups": m.groups,
                 "bias": m.bias is not None}]
    if isinstance(m, nn.BatchNorm2d):
        return [{"op": "batchnorm2d", "channels": m.num_features, "eps": m.eps, "momentum": m.momentum}]
    if isinstance(m, nn.ReLU6):
        return [{"op": "relu6"}]
    if isinstance(m, nn.ReLU):
        return [{"op": "relu"}]
    if isinstance(m, (nn.MaxPool2d, nn.AvgPool2d)):
        op = "maxpool2d" if isinstance(m, nn.MaxPool2d) else "avgpool2d"
        return [{"op": op, "kernel": _pair(m.kernel_size), "stride": _pair(m.stride), "padding": _pair(m.padding)}]
    if isinstance(m, nn.AdaptiveAvgPool2d):
        return [{"op": "adaptive_avgpool2d", "size": _pair(m.output_size)}]
    if isinstance(m, nn.Flatten):
        return [{"op": "flatten"}]
    if isinstance(m, nn.Linear):
        return [{"op": "linear", "in": m.in_features, "out": m.out_features, "bias": m.bias is not None}]
    if isinstance(m, nn.Identity):
        return []
    if isinstance(m, nn.Dropout) and m.p == 0:
        return []
    if isinstance(m, zoo.BasicBlock):
        return [{"op": "residual",
                 "main": [*_one(m.conv1), *_one(m.bn1), {"op": "relu"}, *_one(m.conv2), *_one(m.bn2)],
                 "shortcut": layer_spec(m.downsample), "post": [{"op": "relu"}]}]
    if isinstance(m, nn.Sequential):
        return layer_spec(m)
    raise UnsupportedModelError(
        f"local learning: {type(m).__name__} has no layer spec; supported: Conv2d, BatchNorm2d, ReLU, ReLU6, "
        "MaxPool2d, AvgPool2d, AdaptiveAvgPool2d, Flatten, Linear, Identity and ResNet BasicBlock")


def layer_spec(module: nn.Module) -> list[dict]:
    """The spec list of a layer module (a Sequential of supported modules, or one of them)."""
    if isinstance(module, nn.Sequential):
        return [s for m in module for s in _one(m)]
    return _one(module)


def head_layer_spec(spec: HeadSpec) -> list[dict]:
    """AAN-LL head: conv 3x3 -> ReLU -> adaptive average pool -> flatten -> linear (heads.py's rule)."""
    h, s = spec.head_channels, spec.pool
    return [
        {"op": "conv2d", "in": spec.in_channels, "out": h, "kernel": 3, "stride": 1, "padding": 1, "groups": 1,
         "bias": True},
        {"op": "relu"},
        {"op": "adaptive_avgpool2d", "size": s},
        {"op": "flatten"},
        {"op": "linear", "in": h * s * s, "out": spec.classes, "bias": True},
    ]


def copy_weights(src: nn.Module, dst: nn.Module, in_shape: tuple[int, ...]) -> None:
    """Copy ``src``'s parameters and buffers into ``dst`` (same registration order and shapes) and check that
    both give the same output on a probe batch, in eval mode so the BN statistics are not touched."""
    s_items, d_items = list(src.state_dict().items()), list(dst.state_dict().items())
    if len(s_items) != len(d_items) or any(a.shape != b.shape for (_, a), (_, b) in zip(s_items, d_items)):
        raise UnsupportedModelError(
            f"local learning: the layer spec does not match the module ({len(s_items)} vs {len(d_items)} "
            "tensors, or shapes differ); this is a bug in compiler/local/spec.py")
    dst.load_state_dict({k: v.clone() for (k, _), (_, v) in zip(d_items, s_items)})
    was = src.training, dst.training
    src.eval(), dst.eval()
    with torch.no_grad():
        x = torch.randn((2, *in_shape), generator=torch.Generator().manual_seed(0))
        same = torch.equal(src(x), dst(x))
    src.train(was[0]), dst.train(was[1])
    if not same:
        raise UnsupportedModelError("local learning: the module built from the layer spec computes another "
                                    "function than the model's layer; this is a bug in compiler/local/spec.py")


def make_head(spec: HeadSpec) -> nn.Sequential:
    """The head as modules, built from its spec (:func:`head_layer_spec`), exactly as the
    runtime builds it, so the profiled head is the trained one."""
    return build(head_layer_spec(spec))
