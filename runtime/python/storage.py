"""The page store: tensors paged out to real files (safetensors only), verified when paged in.

Each tensor goes to `<dir>/<safe name>.safetensors` with, in the file's metadata, its name and a SHA-256
of its raw bytes; `page_in` recomputes the checksum and refuses a file that does not match. A tensor whose
memory is a permutation of a dense layout (attention's output) is stored in memory order with the
permutation, and comes back with its strides: the plan's views of it must stay views.
"""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

_KEY = "tensor"


class PageStoreError(RuntimeError):
    """A paged tensor is missing, unreadable or corrupted."""


def tensor_sha256(t: Tensor) -> str:
    """SHA-256 of a tensor's raw bytes (C order), with its dtype and shape."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    raw = t.contiguous().reshape(-1).view(torch.uint8).numpy()
    h = hashlib.sha256(f"{t.dtype}|{tuple(t.shape)}|".encode())
    h.update(memoryview(raw))
    return h.hexdigest()


def safe_file_name(name: str) -> str:
    """A file-system-safe, collision-free stem for a tensor name."""
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:100].lstrip(".") or "t"
    return f"{stem}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"


def _memory_order(t: Tensor) -> tuple[Tensor, list[int] | None]:
    """`t` with its dims permuted into memory order (contiguous, no copy) and the permutation; a tensor
    that is no permutation of a dense layout is copied contiguous (its strides are not kept)."""
    if t.is_contiguous():
        return t, None
    perm = sorted(range(t.dim()), key=lambda d: (-t.stride(d), -t.shape[d]))
    p = t.permute(*perm)
    return (p, perm) if p.is_contiguous() else (t.contiguous(), None)


class FileStore:
    def __init__(self, directory: str | os.PathLike) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.bytes_out = 0
        self.bytes_in = 0
        self._written: dict[str, str] = {}  # name -> checksum of the last page_out by this store

    def path_of(self, name: str) -> Path:
        return self.dir / f"{safe_file_name(name)}.safetensors"

    def page_out(self, name: str, tensor: Tensor) -> Path:
        path = self.path_of(name)
        t, perm = _memory_order(tensor.detach())
        digest = tensor_sha256(t)
        tmp = path.with_name(path.name + ".tmp")
        meta = {"name": name, "sha256": digest, **({"permute": ",".join(map(str, perm))} if perm else {})}
        save_file({_KEY: t}, str(tmp), metadata=meta)
        os.replace(tmp, path)  # a reader never sees half a file; old mappings keep the old inode
        self._written[name] = digest
        self.bytes_out += t.numel() * t.element_size()
        return path

    def page_in(self, name: str, device: torch.device | str = "cpu") -> Tensor:
        path = self.path_of(name)
        if not path.exists():
            raise PageStoreError(f"page-in of '{name}': file {path} is missing")
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                meta = f.metadata() or {}
                t = f.get_tensor(_KEY).clone()  # get_tensor maps the file; own the bytes instead
        except Exception as e:  # safetensors raises its own error types for a damaged header
            raise PageStoreError(f"page-in of '{name}': file {path} is unreadable ({e})") from e
        if meta.get("name") != name:
            raise PageStoreError(f"page-in of '{name}': file {path} holds '{meta.get('name')}'")
        digest = tensor_sha256(t)
        expected = meta.get("sha256")
        if digest != expected:
            raise PageStoreError(f"page-in of '{name}': checksum mismatch in {path} "
                                 f"(file says {expected}, bytes give {digest})")
        if name in self._written and self._written[name] != digest:
            raise PageStoreError(f"page-in of '{name}': {path} is not the version this store paged out")
        self.bytes_in += t.numel() * t.element_size()
        if meta.get("permute"):
            perm = [int(d) for d in meta["permute"].split(",")]
            t = t.permute(*sorted(range(len(perm)), key=perm.__getitem__))
        return t.to(device) if torch.device(device) != t.device else t

    def discard(self, name: str) -> None:
        """Forget a paged tensor and delete its file."""
        self._written.pop(name, None)
        self.path_of(name).unlink(missing_ok=True)

    def names(self) -> list[str]:
        return list(self._written)
