"""The C runtime's dropout mask (runtime/c/kernels/dropout.h), drawn in numpy for the exactness reference.

A counter-based hash of (seed, step, key, element index): no state, so the firmware redraws a mask in the
backward and on every recompute, and the reference draws the very same bits. The definition is the C
header's; this file must agree with it bit for bit (tests/test_c_dropout.py holds the two together).
"""
from __future__ import annotations

import math
import zlib

import numpy as np

_M32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9
UNIFORM_BITS = 24  # u = r / 2^24 with r the hash's top 24 bits


def _fmix(h):
    """murmur3's 32-bit finalizer on a Python int or a uint32 array (arrays wrap; ints are masked)."""
    if isinstance(h, np.ndarray):
        h = h ^ (h >> np.uint32(16))
        h = h * np.uint32(0x85EBCA6B)
        h = h ^ (h >> np.uint32(13))
        h = h * np.uint32(0xC2B2AE35)
        return h ^ (h >> np.uint32(16))
    h &= _M32
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _M32
    return h ^ (h >> 16)


def key_hash(key: str) -> int:
    """The 32-bit key of a dropout: CRC-32 of its module name (with `#k` for the k-th call of a module)."""
    return zlib.crc32(key.encode())


def threshold(p: float) -> int:
    """Drop an element whose 24-bit uniform is below this: ceil(p * 2^24), so keep iff u >= p exactly."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability {p} is outside [0, 1]")
    return math.ceil(p * (1 << UNIFORM_BITS))


def scale(p: float) -> float:
    """1 / (1 - p) as torch's native_dropout takes it (0 when p == 1)."""
    return 0.0 if p == 1.0 else 1.0 / (1.0 - p)


def stream(seed: int, step: int, key: str) -> int:
    return _fmix(_fmix(_fmix(seed) ^ (step & _M32)) ^ key_hash(key))


def keep_mask(seed: int, step: int, key: str, p: float, count: int) -> np.ndarray:
    """The elements kept (True) of a dropout of `count` elements, in the tensor's contiguous order."""
    s = np.uint32(stream(seed, step, key))
    i = np.arange(count, dtype=np.uint32)
    r = _fmix(s ^ (i * np.uint32(_GOLDEN))) >> np.uint32(32 - UNIFORM_BITS)
    return r >= np.uint32(threshold(p))
