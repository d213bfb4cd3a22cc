"""Where trained weights may go, checked before any training: a `.safetensors` name that is none of the plan's
own files, in a folder that can be written, and held by one run at a time.

The hold is an advisory lock (`fcntl.flock`) on `<save>.lock` beside the weights: a second run saving to the
same file is refused at once instead of overwriting the first one's checkpoints. The kernel releases the lock
when its process exits, however it exits, so a killed run never leaves a stale one behind.
"""
from __future__ import annotations

import errno
import fcntl
import os
import tempfile
from pathlib import Path

SUFFIX = ".safetensors"
LOCK_SUFFIX = ".lock"


class SaveTargetError(ValueError):
    """The save path cannot be used: the wrong kind of name, a file of the plan, or another run holds it."""


def check_name(path: Path, state: Path, plan_files: set[Path]) -> None:
    """A `.safetensors` file whose name and its training state's (`state`) are none of the plan folder's files
    (resolved: a link or `..` is no way around)."""
    if not path.name.endswith(SUFFIX) or path.name == SUFFIX:
        raise SaveTargetError(f"--save {path}: the trained weights are written as safetensors; give a file name "
                              f"ending in {SUFFIX} (e.g. trained{SUFFIX})")
    for p in (path, state):
        if p.resolve() in plan_files:
            raise SaveTargetError(f"--save {path}: {p.name} is a file of the compiled plan {p.resolve().parent}; "
                                  "saving there would overwrite the plan. Save beside it under another name "
                                  "(e.g. trained.safetensors) or in another folder")


def check_writable(folder: Path) -> None:
    """Create `folder` if needed and write a probe file in it: a read-only disk or a folder without permission
    fails now, before the training it would otherwise lose."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".edgetrain-write-test-", dir=folder)
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise OSError(e.errno, f"--save's folder {folder} cannot be written ({e.strerror}); nothing was trained",
                      str(folder)) from None


class SaveLock:
    """The one run allowed to write `path` (and its training state) until `release()` or the process ends."""

    def __init__(self, path: Path) -> None:
        self.path = Path(str(path) + LOCK_SUFFIX)
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = os.pread(self._fd, 32, 0).decode(errors="replace").strip()
            os.close(self._fd)
            self._fd = None
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            who = f" (process {holder})" if holder else ""
            raise SaveTargetError(f"--save {path}: another run{who} is training into it now; wait for it to "
                                  "finish or save elsewhere") from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, str(os.getpid()).encode(), 0)  # who holds it, for the message above

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)  # while still held: a waiting run cannot lock a file about to go
        finally:
            os.close(self._fd)  # closing releases the lock
            self._fd = None


def claim(path: str | os.PathLike, state: Path, plan_files: set[Path]) -> SaveLock:
    """Every check on a save path, then its lock: the name, the folder, one writer."""
    p = Path(path)
    check_name(p, state, plan_files)
    check_writable(p.parent if str(p.parent) else Path("."))
    return SaveLock(p)
