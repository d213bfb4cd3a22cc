"""A block's outputs for a whole data split, cached on storage as memory-mapped shards.

Layout of one cache (a folder): ``shard_00000.bin`` ... (raw little-endian float32 or float16, C order, at
most ``shard_samples`` samples each) and ``meta.json``, written last. A cache without ``meta.json`` (a
process killed while writing) is incomplete: :meth:`ActivationCache.open` refuses it and the trainer
rebuilds it. Reads go through ``torch.from_file`` maps, so only the pages a batch touches are read in.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass

import torch

__all__ = ["ActivationCache", "CacheWriter", "CACHE_DTYPES"]

CACHE_DTYPES = {"float32": torch.float32, "float16": torch.float16}
_META = "meta.json"


def _shard_path(root: str, i: int) -> str:
    return os.path.join(root, f"shard_{i:05d}.bin")


class CacheWriter:
    """Writes ``n`` samples of ``shape`` in order; :meth:`close` seals the cache with its meta file."""

    def __init__(self, root: str, n: int, shape: tuple[int, ...], dtype: str = "float32",
                 shard_samples: int = 4096) -> None:
        if dtype not in CACHE_DTYPES:
            raise ValueError(f"cache dtype must be one of {sorted(CACHE_DTYPES)}, got {dtype!r}")
        if os.path.exists(root):
            shutil.rmtree(root)  # a half-written cache from a killed run
        os.makedirs(root)
        self.root, self.n, self.shape, self.dtype = root, int(n), tuple(int(s) for s in shape), dtype
        self.shard_samples = int(shard_samples)
        self.per_sample = 1
        for s in self.shape:
            self.per_sample *= s
        self._shards: list[torch.Tensor] = []
        for i in range((self.n + self.shard_samples - 1) // self.shard_samples):
            rows = min(self.shard_samples, self.n - i * self.shard_samples)
            t = torch.from_file(_shard_path(root, i), shared=True, size=rows * self.per_sample,
                                dtype=CACHE_DTYPES[dtype])
            self._shards.append(t.view(rows, *self.shape))
        self._pos = 0

    def append(self, batch: torch.Tensor) -> None:
        b = batch.detach().to("cpu", CACHE_DTYPES[self.dtype])
        if tuple(b.shape[1:]) != self.shape:
            raise ValueError(f"cache {self.root}: sample shape {tuple(b.shape[1:])}, expected {self.shape}")
        if self._pos + len(b) > self.n:
            raise ValueError(f"cache {self.root}: more than the {self.n} samples it was made for")
        done = 0
        while done < len(b):
            i, off = divmod(self._pos, self.shard_samples)
            take = min(len(b) - done, self._shards[i].shape[0] - off)
            self._shards[i][off:off + take].copy_(b[done:done + take])
            done += take
            self._pos += take

    def close(self) -> "ActivationCache":
        if self._pos != self.n:
            raise ValueError(f"cache {self.root}: {self._pos} of {self.n} samples written")
        self._shards.clear()  # unmaps; the data is in the files (MAP_SHARED)
        meta = {"n": self.n, "shape": list(self.shape), "dtype": self.dtype, "shard_samples": self.shard_samples}
        tmp = os.path.join(self.root, _META + ".tmp")
        with open(tmp, "w") as f:
            json.dump(meta, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(self.root, _META))
        return ActivationCache.open(self.root)


@dataclass
class ActivationCache:
    root: str
    n: int
    shape: tuple[int, ...]
    dtype: str
    shard_samples: int
    shards: list[torch.Tensor]

    @classmethod
    def open(cls, root: str) -> "ActivationCache":
        meta_path = os.path.join(root, _META)
        if not os.path.isfile(meta_path):
            raise FileNotFoundError(f"activation cache {root} is missing or incomplete (no {_META})")
        with open(meta_path) as f:
            m = json.load(f)
        shape, n, ss = tuple(m["shape"]), int(m["n"]), int(m["shard_samples"])
        per = 1
        for s in shape:
            per *= s
        shards = []
        for i in range((n + ss - 1) // ss):
            rows = min(ss, n - i * ss)
            path = _shard_path(root, i)
            want = rows * per * CACHE_DTYPES[m["dtype"]].itemsize
            if not os.path.isfile(path) or os.path.getsize(path) != want:
                raise FileNotFoundError(f"activation cache {root}: {path} missing or not {want} bytes")
            shards.append(torch.from_file(path, shared=False, size=rows * per,
                                          dtype=CACHE_DTYPES[m["dtype"]]).view(rows, *shape))
        return cls(root, n, shape, m["dtype"], ss, shards)

    @property
    def nbytes(self) -> int:
        return sum(s.numel() * s.element_size() for s in self.shards)

    def __len__(self) -> int:
        return self.n

    def gather(self, idx: torch.Tensor) -> torch.Tensor:
        """Samples ``idx`` (any order) as float32."""
        shard, off = idx // self.shard_samples, idx % self.shard_samples
        out = torch.empty((len(idx), *self.shape), dtype=torch.float32)
        for s in torch.unique(shard).tolist():
            sel = (shard == s).nonzero().squeeze(1)
            out[sel] = self.shards[s][off[sel]].to(torch.float32)
        return out

    def slice(self, start: int, stop: int) -> torch.Tensor:
        return self.gather(torch.arange(start, stop))
