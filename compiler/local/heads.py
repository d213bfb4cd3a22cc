"""AAN-LL auxiliary heads (NeuroFlux) and the split of a zoo model into its locally trained layers.

A *layer* here is the unit NeuroFlux trains on one local loss: for VGG each conv+BN+ReLU, with the
max-pool that follows it folded in; for ResNet, the stem (conv+BN+ReLU) and each BasicBlock; for any other
``nn.Sequential``-style model, each Conv2d with the BN/ReLU/pool modules up to the next Conv2d. The final
classifier is not a layer: the last layer's head plays its role.

Head (paper: conv beta_n -> downsampling F_n -> linear gamma_n) for a layer whose output is (C, H, W)::

    Conv2d(C, h, 3, padding=1) -> ReLU -> AdaptiveAvgPool2d(s) -> Flatten -> Linear(h*s*s, classes)

Sizing rule (AAN-LL: the head adapts to its layer so that its memory stays small next to the layer's):

* head channels ``h = clamp(C // 4, 8, 128)``, then halved (not below 8) while the head's activation
  bytes exceed ``frac`` (default 0.30) of the layer's output bytes. The head's activation bytes per sample
  are what its backward keeps beyond the layer's output, which the layer holds anyway: the ReLU's output
  (``h*H*W``; the conv output itself is not saved), the pooled map (``h*s*s``) and the logits
  (``classes``), in float32. With ``h = C/4`` the conv output alone is 1/4 of the layer output, so the halving only acts
  on the tiny deep layers where pooled map + logits matter.
* pooled size ``s`` = the largest of 4, 2, 1 with ``s <= H`` and ``h*s*s <= 512`` (the linear's fan-in
  is at most 512 features, so ``h*s*s*classes`` linear weights stay at most 5k for 10 classes);
  DGL's auxiliary net also pools to 2x2.

:func:`sizing_table` gives the numbers for a model; :func:`print_sizing_table` prints them
(``python -m edgetrain.compiler.local.heads vgg11 vgg16 resnet18``).
"""
from __future__ import annotations

import sys
from dataclasses import asdict, dataclass

import torch
from torch import nn

from edgetrain.compiler.frontend import zoo
from edgetrain.compiler.errors import UnsupportedModelError

__all__ = [
    "HeadSpec", "TrainableLayer", "head_spec", "split_layers", "sizing_table",
    "print_sizing_table", "HEAD_FRAC", "MIN_HEAD_CH", "MAX_HEAD_CH", "MAX_FAN_IN",
]

HEAD_FRAC = 0.30
MIN_HEAD_CH = 8
MAX_HEAD_CH = 128
MAX_FAN_IN = 512
_POOL_SIZES = (4, 2, 1)
_F32 = 4


@dataclass(frozen=True)
class HeadSpec:
    in_channels: int
    height: int
    width: int
    head_channels: int
    pool: int
    classes: int

    @property
    def params(self) -> int:
        c, h, f = self.in_channels, self.head_channels, self.head_channels * self.pool ** 2
        return (9 * c * h + h) + (f * self.classes + self.classes)

    @property
    def act_bytes_per_sample(self) -> int:
        h, s = self.head_channels, self.pool
        return _F32 * (h * self.height * self.width + h * s * s + self.classes)

    @property
    def layer_out_bytes_per_sample(self) -> int:
        return _F32 * self.in_channels * self.height * self.width


def _pool_size(h: int, height: int, width: int) -> int:
    for s in _POOL_SIZES:
        if s <= min(height, width) and h * s * s <= MAX_FAN_IN:
            return s
    return 1


def head_spec(out_shape: tuple[int, int, int], classes: int = 10, *, frac: float = HEAD_FRAC) -> HeadSpec:
    """The AAN-LL sizing rule (module docstring) for a layer whose per-sample output is (C, H, W)."""
    c, height, width = (int(v) for v in out_shape)
    h = max(MIN_HEAD_CH, min(c // 4, MAX_HEAD_CH))
    spec = HeadSpec(c, height, width, h, _pool_size(h, height, width), classes)
    while spec.act_bytes_per_sample > frac * spec.layer_out_bytes_per_sample and h > MIN_HEAD_CH:
        h = max(MIN_HEAD_CH, h // 2)
        spec = HeadSpec(c, height, width, h, _pool_size(h, height, width), classes)
    return spec


@dataclass
class TrainableLayer:
    name: str
    module: nn.Module
    in_shape: tuple[int, int, int]
    out_shape: tuple[int, int, int]

    @property
    def params(self) -> int:
        return sum(p.numel() for p in self.module.parameters())


def _units(model: nn.Module) -> list[tuple[str, nn.Module]]:
    if isinstance(model, zoo.ResNet):
        units = [("stem", nn.Sequential(model.conv1, model.bn1, model.relu))]
        for sname in ("layer1", "layer2", "layer3", "layer4"):
            for i, blk in enumerate(getattr(model, sname)):
                units.append((f"{sname}.{i}", blk))
        return units
    seq = model.features if isinstance(model, zoo.VGG) else model
    if not isinstance(seq, nn.Sequential):
        raise UnsupportedModelError(
            f"local learning: cannot split {type(model).__name__} into layers; supported: VGG, ResNet "
            "and nn.Sequential conv stacks")
    units: list[tuple[str, list[nn.Module]]] = []
    prefix = "features." if seq is not model else ""
    for i, m in enumerate(seq):
        if isinstance(m, nn.Conv2d):
            units.append((f"{prefix}{i}", [m]))
        elif isinstance(m, (nn.BatchNorm2d, nn.ReLU, nn.ReLU6, nn.MaxPool2d, nn.AvgPool2d, nn.Dropout)):
            if not units:
                raise UnsupportedModelError(f"local learning: {type(m).__name__} before the first conv")
            units[-1][1].append(m)
        else:
            break  # the classifier part (pool/flatten/linear) is replaced by the heads
    if not units:
        raise UnsupportedModelError("local learning: no Conv2d layers found")
    return [(name, nn.Sequential(*mods)) for name, mods in units]


def split_layers(model: nn.Module, in_shape: tuple[int, int, int] = (3, 32, 32)) -> list[TrainableLayer]:
    """The model's trainable layers in order, sharing parameters with ``model``, with per-sample shapes."""
    layers = []
    shape = tuple(in_shape)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        x = torch.zeros((1, *shape))
        for name, mod in _units(model):
            y = mod(x)
            layers.append(TrainableLayer(name, mod, tuple(x.shape[1:]), tuple(y.shape[1:])))
            x = y
    model.train(was_training)
    return layers


def sizing_table(model_name: str, classes: int = 10, frac: float = HEAD_FRAC) -> list[dict]:
    torch.manual_seed(0)
    rows = []
    for layer in split_layers(zoo.build(model_name, num_classes=classes)):
        spec = head_spec(layer.out_shape, classes, frac=frac)
        rows.append({
            "layer": layer.name,
            "out_shape": layer.out_shape,
            "layer_params": layer.params,
            **{k: v for k, v in asdict(spec).items() if k in ("head_channels", "pool")},
            "head_params": spec.params,
            "head_act_bytes": spec.act_bytes_per_sample,
            "layer_act_bytes": spec.layer_out_bytes_per_sample,
            "ratio": spec.act_bytes_per_sample / spec.layer_out_bytes_per_sample,
        })
    return rows


def print_sizing_table(model_name: str, classes: int = 10, file=None) -> None:
    file = file or sys.stdout
    rows = sizing_table(model_name, classes)
    print(f"{model_name}: AAN-LL heads ({classes} classes; bytes are float32 per sample)", file=file)
    print(f"{'layer':<10} {'out (C,H,W)':<14} {'layer params':>12} {'head ch':>7} {'pool':>4} "
          f"{'head params':>11} {'head act B':>10} {'layer act B':>11} {'ratio':>6}", file=file)
    for r in rows:
        print(f"{r['layer']:<10} {str(r['out_shape']):<14} {r['layer_params']:>12} {r['head_channels']:>7} "
              f"{r['pool']:>4} {r['head_params']:>11} {r['head_act_bytes']:>10} {r['layer_act_bytes']:>11} "
              f"{r['ratio']:>6.3f}", file=file)


if __name__ == "__main__":
    for name in sys.argv[1:] or ["vgg11", "vgg16", "resnet18"]:
        print_sizing_table(name)
        print()
