"""The page store: tensors paged out to real files, verified when paged in.

Each tensor goes to `<dir>/<safe name>.page`, a raw file: a fixed prefix (magic, header length, a 64-bit
checksum), a JSON header (name, dtype, shape, permutation, the checksum's algorithm) and the tensor's bytes in
memory order. The checksum (xxHash's XXH3-64 of the bytes, seeded with the header's; zlib's CRC-32 where the
`xxhash` package is missing) is computed once, while paging out, and checked at page-in together with the
file's length and the tensor's name: a flipped bit, a truncated or foreign file is refused, never read as
data. XXH3 runs at memory speed (about 19 GB/s against CRC-32's 2-3 GB/s on one x86-64 core), so checking
costs a page little beside copying it.

Files are written in place, without a temporary file and rename: a page file lives for one training step,
and a write torn by a crash fails its checksum at the next read instead of passing for a tensor.

Page-outs run on one background writer thread (checksum and write release the GIL), so a write overlaps the
computation that follows it. The memory model is unchanged: a paged-out tensor stays resident until the
plan frees it, and `wait(name)` - which the runtime calls before it frees a tensor, and `page_in` and
`discard` call themselves - returns only once the writer has finished with it and dropped its reference, so
the bytes are released exactly when the ledger releases them. A failed write raises there. A page-in
allocates the tensor at once (so the ledger counts it where the schedule does) from the shape and dtype
this store paged out, touching no file on the calling thread; one reader thread opens the file, checks its
prefix and header against that tensor, reads the bytes straight into it and verifies them:
`PendingRead.result()`, which the runtime calls where the tensor is first used, waits for them and raises if
anything fails. (A file this store did not write has its header read first, to learn what to allocate.)
File I/O is raw `os` calls on the tensor's own memory: no file objects, no intermediate copies. A CUDA
tensor's page goes through pinned host memory both ways without the compute thread waiting for the GPU: out,
its copy is queued on the tensor's stream and the writer waits for the copy's event; in, the file is read into
pinned memory and `result()` queues the copy to the GPU. A tensor
whose memory is a permutation of a dense layout (attention's output) is stored in memory order with the
permutation, and comes back with its strides: the plan's views of it must stay views.

A small page skips the threads: it is written, or read and checked, on the calling thread at once. Where the
compute threads take every core the process may run on, below `INLINE_PAGE_BYTES` (1 MiB): waking a store
thread then costs the compute thread more than the page's own work (the woken thread preempts it on its core,
and takes the GIL back and forth). Where they leave a core free (one intra-op thread on a two-core machine, a
GPU plan's CPU), the woken thread runs there, and pages from `INLINE_PAGE_BYTES_FREE_CORE` (128 KiB) go to the
threads (docs/performance.md, benchmarks/page_crossover.py).
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import struct
import zlib
from pathlib import Path

import torch
from torch import Tensor

from .page_jobs import Job, Worker, finished

try:
    import xxhash
except ImportError:  # a runtime installed without it checks with CRC-32 (slower; damaged pages refused all the same)
    xxhash = None

MAGIC = b"ETPAGE2\n"
_PREFIX = struct.Struct("<8sIQ")  # magic, header length, checksum of header + data
SUFFIX = ".page"
CHECKSUM = "xxh3_64" if xxhash is not None else "crc32"  # what this store writes; a header names its own
# Pages smaller than this are written and read on the calling thread: handing one to a store thread costs the
# compute thread more than the page itself (the wake-up preempts it; benchmarks/page_crossover.py measures where).
INLINE_PAGE_BYTES = 1 << 20
INLINE_PAGE_BYTES_FREE_CORE = 128 << 10  # the same where the compute threads leave a core to the store's


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity call on this OS
        return os.cpu_count() or 1


USABLE_CPUS = _usable_cpus()


def inline_threshold() -> int:
    """The page size from which the store's threads take a page: lower while torch's intra-op threads leave one
    of the process's cores free (read per page: a plan pins its thread count while its step runs)."""
    return INLINE_PAGE_BYTES_FREE_CORE if USABLE_CPUS > torch.get_num_threads() else INLINE_PAGE_BYTES


def checksum(algorithm: str, head: bytes, data) -> int:
    """A page's checksum over its header and bytes (either algorithm hashes with the GIL released)."""
    if algorithm == "xxh3_64" and xxhash is not None:
        return xxhash.xxh3_64_intdigest(data, seed=xxhash.xxh3_64_intdigest(head))
    if algorithm == "crc32":
        return zlib.crc32(data, zlib.crc32(head))
    raise ValueError(f"checksum '{algorithm}' is not available here (pip install xxhash)")


class PageStoreError(RuntimeError):
    """A paged tensor is missing, unreadable or corrupted."""


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


def _bytes_of(t: Tensor) -> memoryview:
    """The raw bytes of a contiguous CPU tensor, without a copy. The view does not keep `t` alive: whoever holds
    it holds `t` too. (Read from the tensor's address: each torch call a view through NumPy would take lets a store
    thread take the GIL, and a busy one made that 5x slower than this.)"""
    nbytes = t.numel() * t.element_size()
    if not nbytes:
        return memoryview(bytearray())
    return memoryview((ctypes.c_char * nbytes).from_address(t.data_ptr())).cast("B")


def _to_host(t: Tensor) -> tuple[Tensor, object]:
    """A CPU copy of a device tensor, started and not waited for, and a callable that waits for it (None: done).
    From CUDA the copy goes into pinned memory on the tensor's stream, so the compute thread queues it and goes on
    (a plain `.cpu()` would stand still until the GPU has run everything queued before it); the writer waits on
    the copy's event before it reads the bytes."""
    if t.device.type != "cuda":
        return t.cpu(), None
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    copied = torch.cuda.Event()
    copied.record(torch.cuda.current_stream(t.device))
    return host, copied.synchronize


def _dtype(name: object) -> torch.dtype:
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def _write(path: Path, head: bytes, box: list, truncate: bool = True, copied=None) -> int:
    """Write one page file; returns its checksum. Takes the tensor and its bytes out of `box` ([tensor, bytes]), so
    no reference to it is left anywhere once this returns (the writer thread's work item keeps its arguments a
    little longer). `truncate=False`: the file already has this page's length (the same tensor paged out again).
    `copied`: waits until the tensor's bytes have arrived from the device (`_to_host`)."""
    data = box.pop()
    tensor = box.pop()  # noqa: F841 - holds the memory `data` reads until the write is done
    if copied is not None:
        copied()
    check = checksum(CHECKSUM, head, data)
    prefix = _PREFIX.pack(MAGIC, len(head), check) + head
    # Overwritten in place, not truncated first: the previous step's pages of the file are reused.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:  # raw calls: each one a system call that releases the GIL, no file object around them
        done = os.pwritev(fd, [prefix, data], 0) if _PWRITEV else os.write(fd, prefix)
        while done < len(prefix):  # a write may store less than asked (a full disk raises on the next)
            done += os.pwrite(fd, memoryview(prefix)[done:], done)
        while done < len(prefix) + data.nbytes:
            done += os.pwrite(fd, data[done - len(prefix):], done)
        if truncate:
            os.ftruncate(fd, done)
    finally:
        os.close(fd)
    return check


_PWRITEV = hasattr(os, "pwritev")
_PREADV = hasattr(os, "preadv")


def _preadv(fd: int, buf: memoryview, offset: int) -> int:
    if hasattr(os, "preadv"):
        return os.preadv(fd, [buf], offset)
    os.lseek(fd, offset, os.SEEK_SET)
    return os.readv(fd, [buf])


def _header(name: str, path: Path, fd: int) -> tuple[bytes, int, dict, list[int], torch.dtype, int]:
    """The page file's header, checked against the file's length: (header bytes, checksum, header, shape,
    dtype, data bytes), or PageStoreError naming what is wrong."""
    try:
        prefix = os.pread(fd, _PREFIX.size, 0)
        if len(prefix) < _PREFIX.size or not prefix.startswith(MAGIC):
            raise ValueError("not a page file (bad magic)")
        _, n_head, check = _PREFIX.unpack(prefix)
        head = os.pread(fd, n_head, _PREFIX.size)
        header = json.loads(head)
        shape = [int(s) for s in header["shape"]]
        dtype = _dtype(header["dtype"])
        want = dtype.itemsize * int(torch.Size(shape).numel())
        have = os.fstat(fd).st_size - _PREFIX.size - n_head
        if want != have:  # checked before allocating: a damaged shape must not ask for gigabytes
            raise ValueError(f"{have} data bytes for {want} expected")
    except (ValueError, KeyError, TypeError, struct.error, RuntimeError) as e:  # json's errors are ValueErrors
        raise PageStoreError(f"page-in of '{name}': file {path} is unreadable ({e})") from None
    return head, check, header, shape, dtype, want


def _open(name: str, path: Path) -> int:
    try:
        return os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise PageStoreError(f"page-in of '{name}': file {path} is missing") from None


def _read(name: str, path: Path, t: Tensor, written: int | None) -> None:
    """Fill `t` from its page file, checking the header (name, dtype, shape, length), the checksum over header
    and bytes, and that the file is the version whose checksum was `written` (None: any version)."""
    fd = _open(name, path)
    try:
        head, check, header, shape, dtype, want = _header(name, path, fd)
        if dtype != t.dtype or shape != list(t.shape):
            raise PageStoreError(f"page-in of '{name}': file {path} holds '{header.get('name')}', a "
                                 f"{header['dtype']}{shape} tensor, not the "
                                 f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)} paged out")
        data = _bytes_of(t)
        got, at = 0, _PREFIX.size + len(head)
        while got < data.nbytes:  # straight into the tensor's memory; a read may return less than asked
            k = _preadv(fd, data[got:], at + got)
            if not k:
                break
            got += k
    finally:
        os.close(fd)
    if got != data.nbytes:
        raise PageStoreError(f"page-in of '{name}': file {path} is unreadable ({got} data bytes for "
                             f"{data.nbytes} expected)")
    algorithm = header.get("checksum")
    try:
        actual = checksum(algorithm, head, data)
    except ValueError as e:
        raise PageStoreError(f"page-in of '{name}': {path}: {e}") from None
    if actual != check:
        raise PageStoreError(f"page-in of '{name}': checksum mismatch in {path} "
                             f"(file says {algorithm} {check:016x}, bytes give {actual:016x})")
    if header.get("name") != name:
        raise PageStoreError(f"page-in of '{name}': file {path} holds '{header.get('name')}'")
    if written is not None and written != check:
        raise PageStoreError(f"page-in of '{name}': {path} is not the version this store paged out")


def _read_own(name: str, path: Path, t: Tensor, data: memoryview, head: bytes, written: int) -> None:
    """Fill `t` from a page this store wrote (`head`, checksum `written`): prefix, header and bytes in one system
    call, checked against what was written. Anything unexpected is read again by `_read`, which names it."""
    # Few GIL hand-offs per page: each one can hold up the compute thread when its kernel returns.
    meta = bytearray(_PREFIX.size + len(head))
    beyond = bytearray(1)  # a byte past the page's end: a longer file is not this page
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return _read(name, path, t, written)
    try:
        got = os.preadv(fd, [meta, data, beyond], 0)
    except OSError:
        got = -1
    finally:
        os.close(fd)
    if (got != len(meta) + data.nbytes or meta != _PREFIX.pack(MAGIC, len(head), written) + head
            or checksum(CHECKSUM, head, data) != written):
        _read(name, path, t, written)


class PendingRead:
    """A page-in under way: its tensor is allocated (and counted) already; `result()` waits for its bytes."""

    def __init__(self, name: str, t: Tensor, perm, device: torch.device, nbytes: int, job: Job) -> None:
        self.name, self.nbytes = name, nbytes
        self._t, self._perm, self._device, self._job = t, perm, device, job

    def result(self) -> Tensor:
        try:
            self._job.result()
        except OSError as e:
            raise PageStoreError(f"page-in of '{self.name}': reading failed ({e.strerror or e})") from None
        t = self._t
        if self._perm:
            perm = [int(d) for d in self._perm]
            t = t.permute(*sorted(range(len(perm)), key=perm.__getitem__))
        return t.to(self._device, non_blocking=True) if self._device != t.device else t


class FileStore:
    def __init__(self, directory: str | os.PathLike, *, background: bool = True,
                 inline_below: int | None = None) -> None:
        self.dir = Path(directory)
        self.inline_below = inline_below  # pages of fewer bytes skip the threads; None: `inline_threshold()`
        self.dir.mkdir(parents=True, exist_ok=True)
        self.bytes_out = 0
        self.bytes_in = 0
        self._written: dict[str, int] = {}  # name -> checksum of the last page_out by this store
        # name -> ((shape, dtype, permutation), its JSON header) of its last page_out
        self._pages: dict[str, tuple[tuple, bytes]] = {}
        self._pending: dict[str, Job] = {}  # name -> its write on the background thread
        self._paths: dict[str, Path] = {}
        self._writer = Worker("edgetrain-pages") if background else None
        self._reader = Worker("edgetrain-reads") if background else None

    def path_of(self, name: str) -> Path:
        path = self._paths.get(name)
        if path is None:  # named once per tensor: a step pages the same names again
            path = self._paths[name] = self.dir / f"{safe_file_name(name)}{SUFFIX}"
        return path

    def page_out(self, name: str, tensor: Tensor) -> Path:
        """Start writing `tensor` to its page file (on the background writer, unless the store has none or the
        page is smaller than the store's inline size: then written here)."""
        path = self.path_of(name)
        self.wait(name)  # a name paged out again is written after its previous write
        t, perm = _memory_order(tensor.detach())
        copied = None
        if t.device.type != "cpu":
            t, copied = _to_host(t)
        page = (list(t.shape), t.dtype, perm)
        known = self._pages.get(name)
        if known is not None and known[0] == page:  # a step pages the same tensors again: their headers are kept
            head = known[1]
        else:
            header = {"name": name, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                      "checksum": CHECKSUM}
            if perm:
                header["permute"] = perm
            head = json.dumps(header, separators=(",", ":")).encode()
        size = t.numel() * t.element_size()
        self.bytes_out += size
        self._pages[name] = (page, head)
        args = (path, head, [t, _bytes_of(t)], known is None or known[0] != page, copied)
        if self._writer is None or size < self._inline_size():
            self._written[name] = self._finish(name, lambda: _write(*args))
        else:
            self._pending[name] = self._writer.submit(_write, *args)
        return path

    def _inline_size(self) -> int:
        return inline_threshold() if self.inline_below is None else self.inline_below

    def _finish(self, name: str, write) -> int:
        """The checksum of a finished write (`write()` runs it, or collects it from the writer)."""
        try:
            return write()
        except OSError as e:
            err = PageStoreError(f"page-out of '{name}': writing {self.path_of(name)} failed ({e.strerror or e})")
            err.errno = e.errno  # a full or read-only disk stays recognisable as such
            raise err from None

    def writing(self, name: str) -> bool:
        """Whether a page-out of `name` has not been waited for yet."""
        return name in self._pending

    def wait(self, name: str | None = None) -> None:
        """Return once the write of `name` (None: of every tensor) is done and holds no reference to it;
        raise PageStoreError if it failed."""
        for n in [name] if name is not None else list(self._pending):
            job = self._pending.pop(n, None)
            if job is not None:
                self._written[n] = self._finish(n, job.result)

    def page_in(self, name: str, device: torch.device | str = "cpu") -> Tensor:
        return self.start_page_in(name, device).result()

    def start_page_in(self, name: str, device: torch.device | str = "cpu") -> "PendingRead":
        """Allocate the tensor now (from what this store paged out; a file it did not write: from the file's
        header, checked here) and read and verify the file on the reader thread (unless the store has none or the
        page is smaller than the store's inline size: then read here, at once):
        `result()` gives the tensor, or raises PageStoreError."""
        self.wait(name)
        path = self.path_of(name)
        known = self._pages.get(name)
        page = known[0] if known is not None else None
        if page is None:  # not paged out by this store: the file says what it holds
            fd = _open(name, path)
            try:
                _, _, header, shape, dtype, _ = _header(name, path, fd)
            finally:
                os.close(fd)
            page = (shape, dtype, header.get("permute"))
        shape, dtype, perm = page
        # Read into pinned memory for CUDA: `result()` then queues the copy to the GPU without waiting for it.
        t = torch.empty(shape, dtype=dtype, pin_memory=torch.device(device).type == "cuda")
        want = t.numel() * t.element_size()
        self.bytes_in += want
        written = self._written.get(name)
        if known is not None and written is not None and _PREADV:  # its own page: one read, checked as written
            read, job = _read_own, (name, path, t, _bytes_of(t), known[1], written)
        else:
            read, job = _read, (name, path, t, written)
        threaded = self._reader is not None and want >= self._inline_size()
        work = self._reader.submit(read, *job) if threaded else finished(read, *job)
        return PendingRead(name, t, perm, torch.device(device), want, work)

    def discard(self, name: str) -> None:
        """Forget a paged tensor and delete its file."""
        try:
            self.wait(name)
        except PageStoreError:
            pass  # its file goes anyway
        self._written.pop(name, None)
        self._pages.pop(name, None)
        self.path_of(name).unlink(missing_ok=True)

    def names(self) -> list[str]:
        return list(dict.fromkeys([*self._written, *self._pending]))
