"""The batches `compile --calibrate SOURCE` measures an int8 prefix's activation ranges on: a dataset's images,
shaped for the model (the compile's model_graph draws `random` itself)."""
from __future__ import annotations

from functools import partial

import torch

from edgetrain.compiler.errors import EdgetrainError

from .data import digits, fashion_mnist_batches

SOURCES = ("random", "fashion-mnist", "digits")


def dataset_batches(source: str, shape: tuple, seed: int, count: int) -> list[torch.Tensor]:
    """`count` input batches of `shape` (N, C, H, W) from `source`'s training split, in a seeded order."""
    if len(shape) != 4:
        raise EdgetrainError(f"--calibrate {source} holds images; this model takes inputs of shape {list(shape[1:])}: "
                             "use --calibrate random")
    n, chw = shape[0], shape[1:]
    if source == "fashion-mnist":
        return [x for x, _ in fashion_mnist_batches(chw, n, count, seed)]
    x, _ = digits("train", resize_to=tuple(chw[1:]), channels=chw[0], seed=seed)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    return [x[order[k * n:(k + 1) * n]] for k in range(count)]


def calibration_of(source: str):
    """What CompileOptions.calibration takes for `source` (None for random), or one error naming the choices."""
    if source not in SOURCES:
        raise EdgetrainError(f"--calibrate {source!r}: use {', '.join(SOURCES)}")
    return None if source == "random" else partial(dataset_batches, source)
