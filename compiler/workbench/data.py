"""Datasets shared by the project: seeded random batches, Fashion-MNIST read from disk, and
scikit-learn's 8x8 digits.

Nothing here downloads anything: the machines edgetrain is built and tested on have no network
beyond package registries, so Fashion-MNIST comes from the Debian package
``dataset-fashion-mnist`` (``make data`` installs it) and is parsed from its IDX files directly;
the digits (1797 images) ship inside the scikit-learn wheel.

:func:`load_dataset` is the one entry point by name; it adapts the images to a model's input shape.
"""

from __future__ import annotations

import functools
import gzip
import os
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from edgetrain.compiler.errors import EdgetrainError

__all__ = [
    "DatasetMissingError",
    "FASHION_MNIST_DIR",
    "FASHION_MNIST_CLASSES",
    "DATASETS",
    "DIGITS_CLASSES",
    "adapt_images",
    "digits",
    "fashion_mnist",
    "fashion_mnist_batches",
    "load_dataset",
    "random_batches",
    "train_val_split",
]

Batch = tuple[torch.Tensor, torch.Tensor]

# The Debian package's install location; EDGETRAIN_FASHION_MNIST_DIR points elsewhere (a copy of
# the four files from the upstream repository works the same).
FASHION_MNIST_DIR = Path(os.environ.get("EDGETRAIN_FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist"))
FASHION_MNIST_CLASSES = 10
_PREFIX = {"train": "train", "test": "t10k"}  # the split's prefix in the upstream file names
_IDX_IMAGES_MAGIC = 0x0803  # unsigned bytes, 3 dimensions
_IDX_LABELS_MAGIC = 0x0801  # unsigned bytes, 1 dimension


class DatasetMissingError(EdgetrainError, FileNotFoundError):
    """A dataset's files are not installed; the message says how to install them."""


# -- random data --------------------------------------------------------------------------------


def random_batches(
    input_shape: Sequence[int], num_classes: int, batch_size: int, steps: int, seed: int = 0, *,
    input_high: int | None = None, label_shape: Sequence[int] = (),
) -> Iterator[Batch]:
    """``steps`` batches of standard-normal float32 inputs and uniform int64 labels.

    With ``input_high`` the inputs are uniform int64 token ids in [0, input_high) instead; labels have
    the shape (batch, *label_shape) (a language model: one label per position).

    A private generator makes the stream depend on ``seed`` alone, not on whatever else has used
    torch's global RNG (model init, dropout), so a compiled plan and its autograd reference can be
    fed the very same batches.
    """
    _check_positive(batch_size=batch_size, num_classes=num_classes)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        if input_high is None:
            x = torch.randn((batch_size, *input_shape), generator=gen, dtype=torch.float32)
        else:
            x = torch.randint(0, input_high, (batch_size, *input_shape), generator=gen, dtype=torch.int64)
        y = torch.randint(0, num_classes, (batch_size, *label_shape), generator=gen, dtype=torch.int64)
        yield x, y


# -- Fashion-MNIST ------------------------------------------------------------------------------


def fashion_mnist(
    split: str = "train",
    *,
    resize_to: int | tuple[int, int] | None = None,
    channels: int = 1,
    root: str | os.PathLike[str] | None = None,
) -> Batch:
    """The whole split as ``(images, labels)``.

    images: float32 in [0, 1], shape (N, channels, H, W) with H = W = 28 unless ``resize_to`` asks
    for a bilinear resize (e.g. 32 for CIFAR-shaped models); ``channels=3`` repeats the grey
    channel. labels: int64 in [0, 10). N is 60000 for "train" and 10000 for "test".
    """
    images, labels = _load_split(split, Path(root) if root is not None else FASHION_MNIST_DIR)
    # torch.tensor copies: the cached array is read-only and torch refuses to share those quietly.
    x = torch.tensor(images).unsqueeze(1)  # uint8 (N, 1, 28, 28)
    return adapt_images(x, channels=channels, size=resize_to), torch.from_numpy(labels.astype(np.int64))


def fashion_mnist_batches(
    input_shape: Sequence[int],
    batch_size: int,
    steps: int,
    seed: int = 0,
    *,
    split: str = "train",
    root: str | os.PathLike[str] | None = None,
) -> Iterator[Batch]:
    """``steps`` shuffled Fashion-MNIST batches shaped for a model taking ``input_shape`` (C, H, W).

    Images are adapted batch by batch (resize, channel repeat) so a 3x32x32 model does not make
    the whole 60k-image split four times larger in memory. The order is a seeded permutation,
    redrawn each epoch; a batch never straddles two epochs.
    """
    channels, height, width = _chw(input_shape)
    _check_positive(batch_size=batch_size)
    images, labels = _load_split(split, Path(root) if root is not None else FASHION_MNIST_DIR)
    n = len(labels)
    if batch_size > n:
        raise ValueError(f"batch_size {batch_size} exceeds the {n} images of the {split!r} split")
    gen = torch.Generator().manual_seed(seed)
    order, pos = torch.randperm(n, generator=gen), 0
    for _ in range(steps):
        if pos + batch_size > n:
            order, pos = torch.randperm(n, generator=gen), 0
        idx = order[pos : pos + batch_size].numpy()
        pos += batch_size
        x = torch.from_numpy(images[idx]).unsqueeze(1)
        yield adapt_images(x, channels=channels, size=(height, width)), torch.from_numpy(labels[idx].astype(np.int64))


def adapt_images(
    x: torch.Tensor, *, channels: int = 1, size: int | tuple[int, int] | None = None
) -> torch.Tensor:
    """Grey images (N, 1, H, W), uint8 or float, to float32 in [0, 1] of the wanted size and channels."""
    if x.dtype == torch.uint8:
        x = x.to(torch.float32).div_(255.0)
    else:
        x = x.to(torch.float32)
    if size is not None:
        hw = (size, size) if isinstance(size, int) else tuple(size)
        if tuple(x.shape[-2:]) != hw:
            # Bilinear overshoots nothing (it interpolates), so values stay within [0, 1].
            x = F.interpolate(x, size=hw, mode="bilinear", align_corners=False)
    if channels == 3:
        x = x.expand(-1, 3, -1, -1).contiguous()  # contiguous: callers may write into the batch
    elif channels != 1:
        raise ValueError(f"the datasets are greyscale: a model may take 1 or 3 channels, not {channels}")
    return x


# -- scikit-learn digits ------------------------------------------------------------------------

DIGITS_CLASSES = 10
_DIGITS_MAX = 16.0  # load_digits' pixels are counts 0..16 (4x4 blocks of a 32x32 bitmap)


def digits(
    split: str = "train",
    *,
    resize_to: int | tuple[int, int] | None = None,
    channels: int = 1,
    seed: int = 0,
    test_fraction: float = 0.2,
) -> Batch:
    """scikit-learn's 1797 handwritten 8x8 digits as ``(images, labels)``; a small real dataset for
    quick end-to-end runs.

    images: float32 in [0, 1] (pixel / 16), shape (N, channels, 8, 8) unless ``resize_to`` asks for a
    bilinear resize. labels: int64 in [0, 10). The train/test split is stratified by label and depends
    on ``seed`` and ``test_fraction`` alone, so "train" and "test" with the same arguments partition
    the 1797 images.
    """
    if split not in _PREFIX:
        raise ValueError(f"split must be one of {sorted(_PREFIX)}, got {split!r}")
    images, labels = _load_digits()
    train_idx, test_idx = _stratified_split(labels, test_fraction, seed)
    idx = train_idx if split == "train" else test_idx
    x = torch.from_numpy(images[idx] / _DIGITS_MAX).to(torch.float32).unsqueeze(1)
    return adapt_images(x, channels=channels, size=resize_to), torch.from_numpy(labels[idx])


@functools.lru_cache(maxsize=1)
def _load_digits() -> tuple[np.ndarray, np.ndarray]:
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:
        raise DatasetMissingError(
            "the digits dataset comes with scikit-learn, which is not installed: pip install scikit-learn"
        ) from exc
    bunch = load_digits()
    images = np.asarray(bunch.images, dtype=np.float64)
    labels = np.asarray(bunch.target, dtype=np.int64)
    images.flags.writeable = False
    labels.flags.writeable = False
    return images, labels


# -- by name, and a validation split ------------------------------------------------------------

# name -> (loader, native (C, H, W))
DATASETS = {
    "fashion-mnist": (fashion_mnist, (1, 28, 28)),
    "digits": (digits, (1, 8, 8)),
}


def load_dataset(name: str, split: str = "train", *, input_shape: Sequence[int] | None = None) -> Batch:
    """A dataset split by name, adapted to a model taking ``input_shape`` (C, H, W): bilinear resize and
    grey channel repeated for C = 3 (e.g. 3x32x32 for the CIFAR-shaped zoo models). None: native shape.
    """
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; known datasets: {', '.join(DATASETS)}")
    loader, native = DATASETS[name]
    channels, height, width = _chw(input_shape if input_shape is not None else native)
    return loader(split, resize_to=(height, width), channels=channels)


def train_val_split(
    x: torch.Tensor, y: torch.Tensor, val_fraction: float = 0.1, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x_train, y_train, x_val, y_val)``: a stratified, seeded split (the same arguments give the
    same split on every machine). Early-exit selection needs validation data the heads never trained on.
    """
    if len(x) != len(y):
        raise ValueError(f"train_val_split: {len(x)} images but {len(y)} labels")
    train_idx, val_idx = _stratified_split(np.asarray(y), val_fraction, seed)
    tr, va = torch.from_numpy(train_idx), torch.from_numpy(val_idx)
    return x[tr], y[tr], x[va], y[va]


def _stratified_split(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (keep, held-out) indices: ``round(fraction * n_c)`` of each class c held out, drawn by a
    seeded permutation; numpy's PCG64 stream is fixed for a given seed across platforms and versions."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"split fraction must be in (0, 1), got {fraction}")
    rng = np.random.default_rng(seed)
    held: list[np.ndarray] = []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        held.append(rng.permutation(members)[: int(round(fraction * len(members)))])
    held_idx = np.sort(np.concatenate(held)) if held else np.zeros(0, dtype=np.int64)
    mask = np.ones(len(labels), dtype=bool)
    mask[held_idx] = False
    return np.flatnonzero(mask), held_idx


def _chw(input_shape: Sequence[int]) -> tuple[int, int, int]:
    if len(input_shape) != 3:
        raise ValueError(f"input_shape must be (C, H, W), got {tuple(input_shape)}")
    c, h, w = (int(v) for v in input_shape)
    return c, h, w


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if value <= 0:
            raise ValueError(f"{name} must be > 0, got {value}")


def _split_files(split: str, root: Path) -> tuple[Path, Path]:
    if split not in _PREFIX:
        raise ValueError(f"split must be one of {sorted(_PREFIX)}, got {split!r}")
    prefix = _PREFIX[split]
    return root / f"{prefix}-images-idx3-ubyte.gz", root / f"{prefix}-labels-idx1-ubyte.gz"


@functools.lru_cache(maxsize=4)
def _load_split(split: str, root: Path) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 images (N, 28, 28), uint8 labels (N,)), parsed once per process and read-only."""
    image_path, label_path = _split_files(split, root)
    missing = [p for p in (image_path, label_path) if not p.is_file()]
    if missing:
        raise DatasetMissingError(
            f"Fashion-MNIST file(s) not found: {', '.join(map(str, missing))}. Install them with "
            f"`apt-get install dataset-fashion-mnist` (as root; `make data` or `make test` does it), "
            f"or point EDGETRAIN_FASHION_MNIST_DIR at a folder holding the four *-ubyte.gz files."
        )
    images = _read_idx(image_path, _IDX_IMAGES_MAGIC)
    labels = _read_idx(label_path, _IDX_LABELS_MAGIC)
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"{image_path} has {images.shape[0]} images but {label_path} has {labels.shape[0]} labels")
    if labels.size and labels.max() >= FASHION_MNIST_CLASSES:
        raise ValueError(f"{label_path}: label {labels.max()} out of range [0, {FASHION_MNIST_CLASSES})")
    # Read-only, because the cached arrays are shared by every caller in the process.
    images.flags.writeable = False
    labels.flags.writeable = False
    return images, labels


def _read_idx(path: Path, magic: int) -> np.ndarray:
    """Parse a gzipped IDX file: a big-endian int32 magic, one int32 per dimension, then the data."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = magic & 0xFF
    header = 4 * (1 + ndim)
    if len(raw) < header:
        raise ValueError(f"{path}: truncated IDX header")
    found = int.from_bytes(raw[:4], "big")
    if found != magic:
        raise ValueError(f"{path}: IDX magic {found:#06x}, expected {magic:#06x}")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">i4", count=ndim, offset=4))
    data = np.frombuffer(raw, dtype=np.uint8, offset=header)
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{path}: {data.size} data bytes for dimensions {dims}")
    return data.reshape(dims)
