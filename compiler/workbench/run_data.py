"""What `edgetrain run --data SOURCE` trains on: a seeded stream of batches shaped as the plan was compiled.

SOURCE is `random`, `fashion-mnist`, `digits`, a `.npz` or `.safetensors` file holding `x` and `y`, or a
folder of images with one sub-folder per class (sorted names are the class ids). The stream is a pure
function of (source, seed, global step): batch k of epoch e is taken from a permutation seeded by (seed, e),
so a run resumed at step k sees exactly the batches an uninterrupted run would have.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from edgetrain.compiler.errors import EdgetrainError

from .data import adapt_images, digits, fashion_mnist_batches, random_batches  # noqa: F401 (random_batches)

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".pgm", ".ppm")
NAMED = ("random", "fashion-mnist", "digits")
HOLDOUT = 0.1  # the share of a dataset kept out of training to measure it on, when no --eval-data is given


def zipfile_error() -> type:
    import zipfile

    return zipfile.BadZipFile


class DataError(EdgetrainError):
    """The data does not fit the compiled model (shape, dtype, classes) or cannot be read."""


@dataclass
class Dataset:
    """N examples; `take(idx)` returns the batch of those indices, shaped and typed for the plan."""
    name: str
    n: int
    take: Callable[[np.ndarray], tuple[torch.Tensor, torch.Tensor]]

    def subset(self, idx: np.ndarray, name: str) -> "Dataset":
        """The examples `idx` of this dataset, as a dataset of their own."""
        idx = np.asarray(idx, dtype=np.int64)
        return Dataset(name, len(idx), lambda k: self.take(idx[np.asarray(k, dtype=np.int64)]))

    def all(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.take(np.arange(self.n))


@dataclass(frozen=True)
class PlanFacts:
    """What a compiled plan trains on, as its schedule says: one example's input and labels, the class count."""
    input_shape: list[int]  # one example's (C, H, W), (T,), ...
    label_shape: list[int]  # one example's labels: [] for one class id, (H, W) for a segmentation map
    num_classes: int | None  # class ids run 0..num_classes-1 (the model's output's); None: labels are values
    input_dtype: str
    loss: str
    batch: int | None  # None: a local-learning plan (each block has its own)


def plan_facts(body: dict) -> PlanFacts:
    model = body["model"]
    if body.get("mode") == "local":
        return PlanFacts(list(model["input_shape"]), [], model["num_classes"], "float32", model["loss"], None)
    graph = body["graph"]
    labels = next(n for n in graph["nodes"] if n["kind"] == "labels")
    return PlanFacts(list(graph["input_shape"][1:]), list(labels["shape"][1:]), model["num_classes"],
                     graph.get("input_dtype", "float32"), model["loss"], graph["input_shape"][0])


def check_labels(y: np.ndarray, facts: PlanFacts, source: str) -> np.ndarray:
    """`y` as the plan's labels, or one error naming what does not fit: the shape, the dtype, or the first
    label outside the classes the model's output scores."""
    if list(y.shape[1:]) != facts.label_shape:
        want = "one class id per example, shape (N,)" if not facts.label_shape else \
            f"shape (N, {', '.join(map(str, facts.label_shape))})"
        raise DataError(f"{source}: y has shape {list(y.shape)}; this model takes {want}")
    if facts.num_classes is None:  # regression targets
        if not np.issubdtype(y.dtype, np.floating):
            raise DataError(f"{source}: this model was compiled for an MSE loss; y must hold float targets, got {y.dtype}")
        return y.astype(np.float32)
    if not np.issubdtype(y.dtype, np.integer):
        raise DataError(f"{source}: y must hold integer class ids, got {y.dtype}")
    c = facts.num_classes
    # A model that computes its own loss reads negative ids its own way (Hugging Face ignores -100)
    bad = np.flatnonzero(((y < 0) & (facts.loss != "model")) | (y >= c))
    if len(bad):
        k = int(bad[0])
        label, example = int(y.reshape(-1)[k]), np.unravel_index(k, y.shape)[0]
        raise DataError(f"{source}: label {label} (example {int(example)}) is outside 0..{c - 1}: the compiled model's "
                        f"output scores {c} classes ({len(bad)} labels outside, from {int(y.min())} to "
                        f"{int(y.max())}). Relabel the data, or give the model's last layer {int(y.max()) + 1} "
                        "outputs and compile it again")
    return y.astype(np.int64)


def _arrays(x: np.ndarray, y: np.ndarray, body: dict, source: str) -> Dataset:
    facts = plan_facts(body)
    per_example, in_dtype = facts.input_shape, facts.input_dtype
    if in_dtype != "float32":
        if not np.issubdtype(x.dtype, np.integer):
            raise DataError(f"{source}: this model takes token ids; x must be integers, got {x.dtype}")
    elif x.dtype == np.uint8:
        x = x.astype(np.float32) / 255.0
    elif not np.issubdtype(x.dtype, np.floating):
        raise DataError(f"{source}: x must be float (or uint8 images), got {x.dtype}")
    if in_dtype == "float32" and list(x.shape[1:]) == per_example[1:] and per_example[0] == 1:
        x = x[:, None]  # (N, H, W) greyscale for a one-channel model
    if list(x.shape[1:]) != per_example:
        raise DataError(f"{source}: x has examples of shape {list(x.shape[1:])}, the model was compiled for "
                        f"{per_example} (x must be (N, {', '.join(map(str, per_example))}))")
    if len(x) != len(y):
        raise DataError(f"{source}: x has {len(x)} examples but y has {len(y)} labels")
    y = check_labels(y, facts, source)
    if facts.batch is not None and len(x) < facts.batch:
        raise DataError(f"{source}: {len(x)} examples, fewer than one batch of {facts.batch}")
    xt = torch.from_numpy(np.ascontiguousarray(x.astype(np.float32 if in_dtype == "float32" else np.int64)))
    yt = torch.from_numpy(y)
    return Dataset(source, len(x), lambda idx: (xt[idx].clone(), yt[idx].clone()))


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    """The arrays of a .npz (a zip of .npy files), read without unpickling: object arrays are refused."""
    import zipfile

    out = {}
    with zipfile.ZipFile(path) as z:
        for member in z.namelist():
            if member.endswith(".npy"):
                with z.open(member) as f:
                    out[member[:-4]] = np.lib.format.read_array(f)  # its default refuses pickled objects
    return out


def _file(path: Path, body: dict) -> Dataset:
    try:
        if path.suffix == ".npz":
            arrays = _read_npz(path)
        else:
            from safetensors.numpy import load_file

            arrays = load_file(str(path))
    except (OSError, ValueError, zipfile_error()) as e:
        raise DataError(f"{path}: cannot read it ({e}); write x and y with numpy.savez or safetensors") from None
    except Exception as e:  # safetensors' own error for a damaged header
        raise DataError(f"{path}: cannot read it ({e})") from None
    missing = [k for k in ("x", "y") if k not in arrays]
    if missing:
        raise DataError(f"{path} holds {sorted(arrays)}; it needs arrays named x (inputs) and y (class ids)")
    return _arrays(arrays["x"], arrays["y"], body, str(path))


def _image_folder(folder: Path, body: dict) -> Dataset:
    from PIL import Image, UnidentifiedImageError

    facts = plan_facts(body)
    shape = facts.input_shape
    if facts.input_dtype != "float32" or len(shape) != 3 or shape[0] not in (1, 3):
        raise DataError(f"{folder}: an image folder needs a model taking images (C, H, W with C 1 or 3), "
                        f"not {shape}")
    classes = sorted(d.name for d in folder.iterdir() if d.is_dir())
    if not classes:
        raise DataError(f"{folder} has no sub-folders: put each class's images in a sub-folder of its own")
    if facts.num_classes is not None and len(classes) > facts.num_classes:
        raise DataError(f"{folder} has {len(classes)} class folders, but the compiled model's output scores "
                        f"{facts.num_classes} classes; give its last layer {len(classes)} outputs and compile it "
                        "again, or drop folders")
    c, h, w = shape
    xs, ys = [], []
    for label, name in enumerate(classes):
        for f in sorted((folder / name).iterdir()):
            if f.suffix.lower() not in IMAGE_SUFFIXES:
                continue
            try:
                with Image.open(f) as im:
                    im = im.convert("L" if c == 1 else "RGB").resize((w, h), Image.BILINEAR)
                    a = np.asarray(im, dtype=np.uint8)
            except (UnidentifiedImageError, OSError) as e:
                raise DataError(f"{f}: not a readable image ({e})") from None
            xs.append(a[None] if c == 1 else a.transpose(2, 0, 1))
            ys.append(label)
    if not xs:
        raise DataError(f"{folder}: no images ({', '.join(IMAGE_SUFFIXES)}) in its class folders")
    return _arrays(np.stack(xs), np.asarray(ys, dtype=np.int64), body, str(folder))


def _named(source: str, body: dict) -> Dataset:
    """fashion-mnist or digits (10 classes of greyscale images), shaped for the plan; refused before any
    training when the model's output scores fewer classes or takes other labels."""
    facts = plan_facts(body)
    if facts.input_dtype != "float32":
        raise DataError(f"--data {source} holds images; this model takes token ids: use --data random or "
                        "a file of your own")
    if facts.num_classes is None:
        raise DataError(f"--data {source} has class labels; this model was compiled for an MSE loss")
    if facts.label_shape:
        raise DataError(f"--data {source} has one class id per image; this model takes labels of shape "
                        f"{facts.label_shape} per example: use a file of your own")
    if len(facts.input_shape) != 3:
        raise DataError(f"--data {source} holds images; this model takes inputs of shape {facts.input_shape}")
    c, h, w = facts.input_shape
    if source == "fashion-mnist":
        from .data import _load_split, FASHION_MNIST_DIR

        images, labels = _load_split("train", FASHION_MNIST_DIR)
        check_labels(labels, facts, source)

        def take(idx):
            x = adapt_images(torch.from_numpy(images[idx]).unsqueeze(1), channels=c, size=(h, w))
            return x, torch.from_numpy(labels[idx].astype(np.int64))

        return Dataset("fashion-mnist", len(labels), take)
    x, y = digits("train", resize_to=(h, w), channels=c)
    check_labels(y.numpy(), facts, source)
    return Dataset("digits", len(y), lambda idx: (x[idx].clone(), y[idx].clone()))


def open_source(source: str, body: dict) -> Dataset | None:
    """The dataset SOURCE names (None for `random`); clear errors for anything that does not fit the plan."""
    if source == "random":
        return None
    if source in ("fashion-mnist", "digits"):
        return _named(source, body)
    path = Path(source)
    if path.is_dir():
        return _image_folder(path, body)
    if path.suffix in (".npz", ".safetensors"):
        if not path.is_file():
            raise DataError(f"--data {source}: no such file")
        return _file(path, body)
    raise DataError(f"--data {source!r}: use random, fashion-mnist, digits, a .npz or .safetensors file with x "
                    "and y, or a folder with one sub-folder of images per class")


def held_out(ds: Dataset, fraction: float, seed: int) -> tuple[Dataset, Dataset]:
    """(train, held-out): a seeded `fraction` of the examples kept out of training, to measure it on."""
    if not 0.0 < fraction < 1.0:
        raise DataError(f"--holdout {fraction}: a fraction of the data in (0, 1), e.g. 0.1")
    k = int(round(fraction * ds.n))
    if k == 0 or k == ds.n:
        raise DataError(f"--holdout {fraction} of {ds.n} examples keeps {k} out: choose a fraction that leaves "
                        "examples on both sides")
    order = torch.randperm(ds.n, generator=torch.Generator().manual_seed(seed)).numpy()
    return ds.subset(np.sort(order[k:]), ds.name), ds.subset(np.sort(order[:k]), f"{ds.name} (held out)")


def steps_per_epoch(ds: Dataset, batch: int) -> int:
    return ds.n // batch  # a batch never straddles two epochs; the last partial batch is dropped


def dataset_batches(ds: Dataset, batch: int, start: int, count: int, seed: int) -> list:
    """Batches for global steps start .. start+count-1 of the seeded stream."""
    per = steps_per_epoch(ds, batch)
    out, perm_epoch, perm = [], None, None
    for k in range(start, start + count):
        epoch, pos = divmod(k, per)
        if epoch != perm_epoch:
            gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
            perm, perm_epoch = torch.randperm(ds.n, generator=gen).numpy(), epoch
        out.append(ds.take(perm[pos * batch:(pos + 1) * batch]))
    return out


def epochs_to_steps(ds: Dataset | None, batch: int, epochs: int) -> int:
    if ds is None:
        raise DataError("--epochs needs a dataset (random data has no epochs): use --steps, or --data with "
                        "fashion-mnist, digits, a file or an image folder")
    return max(1, math.ceil(epochs * steps_per_epoch(ds, batch)))


def check_trainable(ds: Dataset, batch: int) -> None:
    """A dataset must fill at least one batch (after its held-out part is taken away)."""
    if steps_per_epoch(ds, batch) < 1:
        raise DataError(f"{ds.name}: {ds.n} examples to train on, fewer than one batch of {batch}: give more "
                        "data, a smaller --holdout, or --eval-data")
