"""Datasets: seeded random batches and Fashion-MNIST from the Debian package."""

import gzip
import os

import numpy as np
import pytest
import torch

from edgetrain.compiler.workbench import data
from edgetrain.compiler.workbench.data import (DatasetMissingError, fashion_mnist, fashion_mnist_batches, random_batches)

FILES_PRESENT = all(
    (data.FASHION_MNIST_DIR / f"{p}-{k}-ubyte.gz").is_file()
    for p in ("train", "t10k") for k in ("images-idx3", "labels-idx1")
)
# `make test` installs the package when it runs as root; only a non-root run may skip.
needs_fashion_mnist = pytest.mark.skipif(
    not FILES_PRESENT and os.geteuid() != 0,
    reason="Fashion-MNIST missing and not root: apt-get install dataset-fashion-mnist",
)


def test_random_batches_are_deterministic_and_shaped():
    a = list(random_batches((3, 32, 32), 10, batch_size=4, steps=3, seed=7))
    torch.manual_seed(999)  # the global RNG must not matter
    b = list(random_batches((3, 32, 32), 10, batch_size=4, steps=3, seed=7))
    assert len(a) == 3
    for (xa, ya), (xb, yb) in zip(a, b):
        assert xa.shape == (4, 3, 32, 32) and xa.dtype == torch.float32
        assert ya.shape == (4,) and ya.dtype == torch.int64
        assert ((ya >= 0) & (ya < 10)).all()
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    c = next(random_batches((3, 32, 32), 10, batch_size=4, steps=1, seed=8))
    assert not torch.equal(a[0][0], c[0])


@needs_fashion_mnist
def test_fashion_mnist_splits():
    x, y = fashion_mnist("train")
    assert x.shape == (60000, 1, 28, 28) and x.dtype == torch.float32
    assert y.shape == (60000,) and y.dtype == torch.int64
    assert 0.0 <= x.min() and x.max() <= 1.0 and x.max() > 0.5
    assert y.min() == 0 and y.max() == 9
    xt, yt = fashion_mnist("test")
    assert xt.shape == (10000, 1, 28, 28)
    assert torch.bincount(yt).tolist() == [1000] * 10  # the test split is balanced


@needs_fashion_mnist
def test_fashion_mnist_resized_to_three_channels():
    x, _ = fashion_mnist("test", resize_to=32, channels=3)
    assert x.shape == (10000, 3, 32, 32)
    assert torch.equal(x[:, 0], x[:, 2])
    assert 0.0 <= x.min() and x.max() <= 1.0


@needs_fashion_mnist
@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 32, 32)])
def test_fashion_mnist_batches_adapt_and_repeat(shape):
    a = list(fashion_mnist_batches(shape, batch_size=16, steps=3, seed=1))
    b = list(fashion_mnist_batches(shape, batch_size=16, steps=3, seed=1))
    assert len(a) == 3
    for (xa, ya), (xb, yb) in zip(a, b):
        assert xa.shape == (16, *shape) and ya.dtype == torch.int64
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    other = next(fashion_mnist_batches(shape, batch_size=16, steps=1, seed=2))
    assert not torch.equal(a[0][1], other[1]) or not torch.equal(a[0][0], other[0])


@needs_fashion_mnist
def test_fashion_mnist_batches_cross_epochs():
    # 50000 of 60000 per batch: the second batch must come from a fresh permutation.
    batches = list(fashion_mnist_batches((1, 28, 28), batch_size=50000, steps=2, seed=0))
    assert [len(y) for _, y in batches] == [50000, 50000]


def test_bad_channel_count():
    with pytest.raises(ValueError, match="1 or 3 channels"):
        data.adapt_images(torch.zeros(2, 1, 28, 28), channels=2)


def test_missing_files_say_how_to_install(tmp_path):
    with pytest.raises(DatasetMissingError) as err:
        fashion_mnist("train", root=tmp_path)
    assert "apt-get install dataset-fashion-mnist" in str(err.value)
    assert isinstance(err.value, FileNotFoundError)


def test_unknown_split(tmp_path):
    with pytest.raises(ValueError, match="split"):
        fashion_mnist("validation", root=tmp_path)


def _write_idx(path, magic, array):
    header = magic.to_bytes(4, "big") + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def test_idx_parser_on_a_tiny_dataset(tmp_path):
    # Runs everywhere: a hand-made 3-image split in the upstream file layout.
    images = np.arange(3 * 28 * 28).reshape(3, 28, 28) % 256
    labels = np.array([0, 9, 4])
    _write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", 0x0803, images)
    _write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", 0x0801, labels)
    x, y = fashion_mnist("test", root=tmp_path)
    assert x.shape == (3, 1, 28, 28)
    assert torch.allclose(x[:, 0] * 255, torch.from_numpy(images.astype(np.float32)))
    assert y.tolist() == [0, 9, 4]


def test_idx_parser_rejects_a_wrong_magic(tmp_path):
    _write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", 0x0801, np.zeros((3, 28, 28)))
    _write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", 0x0801, np.zeros(3))
    with pytest.raises(ValueError, match="magic"):
        fashion_mnist("test", root=tmp_path)


# -- scikit-learn digits, load_dataset, train_val_split ------------------------------------------


def test_digits_splits_partition_the_1797_images():
    x, y = data.digits("train")
    xt, yt = data.digits("test")
    assert len(x) + len(xt) == 1797 and len(xt) == pytest.approx(0.2 * 1797, abs=10)
    assert x.shape[1:] == (1, 8, 8) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert 0.0 <= min(x.min(), xt.min()) and max(x.max(), xt.max()) == 1.0   # 16/16
    assert sorted(set(y.tolist())) == list(range(10)) and sorted(set(yt.tolist())) == list(range(10))
    # stratified: every class has ~20% of its images in the test split
    counts = torch.bincount(torch.cat([y, yt]), minlength=10)
    assert (torch.bincount(yt, minlength=10) - 0.2 * counts).abs().max() <= 1
    # the two splits partition the data set: the same multiset of images, none twice, none lost
    from collections import Counter

    from sklearn.datasets import load_digits
    raw = torch.from_numpy(load_digits().images).float() / 16
    assert Counter(map(tuple, torch.cat([x, xt]).reshape(-1, 64).tolist())) == \
        Counter(map(tuple, raw.reshape(-1, 64).tolist()))


def test_digits_is_deterministic_and_seeded():
    a, b = data.digits("test", seed=3), data.digits("test", seed=3)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    c = data.digits("test", seed=4)
    assert not torch.equal(a[0], c[0])
    x, _ = data.digits("train", resize_to=32, channels=3)
    assert x.shape[1:] == (3, 32, 32) and torch.equal(x[:, 0], x[:, 1])
    assert 0.0 <= x.min() and x.max() <= 1.0
    with pytest.raises(ValueError, match="split"):
        data.digits("validation")
    with pytest.raises(ValueError, match="fraction"):
        data.digits("train", test_fraction=1.5)


@pytest.mark.parametrize("shape", [None, (1, 8, 8), (1, 28, 28), (3, 32, 32)])
def test_load_dataset_adapts_to_the_model_input(shape):
    x, y = data.load_dataset("digits", "test", input_shape=shape)
    assert x.shape[1:] == (shape or (1, 8, 8)) and len(x) == len(y) == len(data.digits("test")[1])
    assert 0.0 <= x.min() and x.max() <= 1.0


@needs_fashion_mnist
def test_load_dataset_fashion_mnist():
    x, y = data.load_dataset("fashion-mnist", "test", input_shape=(3, 32, 32))
    assert x.shape == (10000, 3, 32, 32) and y.shape == (10000,)


def test_load_dataset_unknown_name_lists_the_names():
    with pytest.raises(ValueError, match="fashion-mnist, digits"):
        data.load_dataset("cifar10", "train")
    with pytest.raises(ValueError, match=r"\(C, H, W\)"):
        data.load_dataset("digits", "train", input_shape=(8, 8))


def test_train_val_split_is_stratified_deterministic_and_disjoint():
    x, y = data.digits("train")
    xs = torch.arange(len(x)).view(-1, 1, 1, 1)  # each "image" is its row number, to trace it
    a = data.train_val_split(xs, y, 0.25, seed=1)
    b = data.train_val_split(xs, y, 0.25, seed=1)
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    x_tr, y_tr, x_va, y_va = a
    assert len(x_tr) + len(x_va) == len(x) and len(x_va) == pytest.approx(0.25 * len(x), abs=10)
    assert sorted(torch.cat([x_tr, x_va]).flatten().tolist()) == list(range(len(x)))  # disjoint, complete
    assert torch.equal(y_va, y[x_va.flatten()])  # labels travel with their images
    assert set(y_va.tolist()) == set(range(10))
    assert not torch.equal(data.train_val_split(xs, y, 0.25, seed=2)[3], y_va)
    with pytest.raises(ValueError, match="labels"):
        data.train_val_split(x, y[:-1], 0.25)
