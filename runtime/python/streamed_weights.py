"""Frozen weights streamed from storage: read from the plan's weights file for each op that reads them, freed after.

The compiler kept these weights out of the budget's resident state and counted each as its readers' workspace
(compiler/graph/streaming.py). Each weight is a tensor whose storage is empty between reads: before a reader
runs, the storage grows to the weight's bytes and its span of the safetensors file is read into it with plain
`pread` calls (no memory map, so the process's resident memory holds the bytes only while the op reads them:
the kernel's page cache is not the process's), and after the op it shrinks back to nothing. The tensor object
stays the same, so calls prepared once (prepared.py) keep reading it.
"""
from __future__ import annotations

import ctypes
import json
import os
import struct
from os import PathLike

import torch

# safetensors' dtype names -> torch dtypes (the ones a model's weights take)
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}
MAX_READ = 1 << 30  # bytes one pread asks for (Linux returns at most ~2 GiB a call)


class StreamedWeightsError(ValueError):
    """A streamed weight is not in the weights file, or the file cannot give its bytes."""


def file_spans(path: str | PathLike) -> dict[str, tuple[int, int, torch.dtype, tuple[int, ...]]]:
    """Every tensor of a safetensors file: key -> (byte offset in the file, bytes, dtype, shape), from its header."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    start = 8 + size
    spans = {}
    for key, info in header.items():
        if key == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        if info["dtype"] not in DTYPES:
            raise StreamedWeightsError(f"{path}: '{key}' has dtype {info['dtype']}, which a streamed weight cannot take")
        spans[key] = (start + lo, hi - lo, DTYPES[info["dtype"]], tuple(info["shape"]))
    return spans


class StreamedWeights:
    """The streamed parameters of a plan (`names`), each read from `path` (`param/<name>`) into memory of its own
    for one op at a time: `read` before the op, `drop` after."""

    def __init__(self, path: str | PathLike, names, device: torch.device) -> None:
        spans = file_spans(path) if names else {}
        missing = [p for p in names if f"param/{p}" not in spans]
        if missing:
            raise StreamedWeightsError(f"{path} lacks the streamed weight '{missing[0]}'; use the weights compile wrote")
        self.path, self.device = str(path), device
        self.spans = {p: spans[f"param/{p}"] for p in names}
        self.tensors: dict[str, torch.Tensor] = {}
        for p, (_, nbytes, dtype, shape) in self.spans.items():
            t = torch.empty(shape, dtype=dtype, device=device)
            t.untyped_storage().resize_(0)  # nothing held until an op reads it
            self.tensors[p] = t
        self._fd = os.open(self.path, os.O_RDONLY) if names else None
        self.read_bytes = 0  # bytes read from storage so far

    def nbytes(self, name: str) -> int:
        return self.spans[name][1]

    def read(self, name: str) -> None:
        """The weight's bytes into its tensor (the same tensor object every time)."""
        offset, nbytes, _, _ = self.spans[name]
        t = self.tensors[name]
        host = t if t.device.type == "cpu" else torch.empty(t.shape, dtype=t.dtype)  # a GPU's weight through host memory
        host.untyped_storage().resize_(nbytes)
        # the storage's bytes as a buffer (numpy would pin the storage's size, and it must shrink after the op)
        view = memoryview((ctypes.c_char * nbytes).from_address(host.data_ptr())).cast("B") if nbytes \
            else memoryview(b"")
        done = 0
        while done < nbytes:
            n = os.preadv(self._fd, [view[done:done + MAX_READ]], offset + done)
            if n <= 0:
                raise StreamedWeightsError(f"{self.path}: streamed weight '{name}' ends early ({done} of {nbytes} B); "
                                           "the file was changed: recompile the model")
            done += n
        if host is not t:
            t.untyped_storage().resize_(nbytes)
            t.copy_(host)
        self.read_bytes += nbytes

    def drop(self, name: str) -> None:
        """The weight's memory given back; the tensor stays, empty, for the next read."""
        self.tensors[name].untyped_storage().resize_(0)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self.close()
