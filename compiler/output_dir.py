"""Atomic compile outputs: write into a temporary folder beside --out, fsync it, swap it in whole.

A compile that fails, runs out of disk or is killed leaves the previous output exactly as it was (at worst
a hidden `.NAME.edgetrain-tmp-PID-*` folder beside it, removed by the next compile). Two compiles into one
folder each swap in a complete folder of their own: the last one wins, nothing mixes. The schedule is
written last, with the sha256 of every other file and the table of the weights, so `run` and `inspect`
can refuse a folder that was changed afterwards.
"""
from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import uuid
from pathlib import Path

from edgetrain.runtime.python.integrity import SCHEDULE, file_table
from edgetrain.runtime.python.run_dirs import alive as _alive  # one test for staging folders and page stores

from .errors import OutputDirError

_TMP_TAG = ".edgetrain-tmp-"
_RENAME_EXCHANGE = 2  # linux/fs.h


def _tmp_prefix(out: Path) -> str:
    return f".{out.name}{_TMP_TAG}"


def _remove_stale(out: Path) -> None:
    """Temporary folders of compiles into `out` whose process is gone (killed mid-compile)."""
    prefix = _tmp_prefix(out)
    try:
        entries = list(out.parent.iterdir())
    except OSError:
        return
    for p in entries:
        if p.name.startswith(prefix) and p.is_dir():
            pid = p.name[len(prefix):].split("-", 1)[0]
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(p, ignore_errors=True)


# What compile writes (folders without an `outputs` record), and what runs and builds leave: replaced freely.
GENERATED = {SCHEDULE, "plan.py", "weights.safetensors", "plan.c", "plan.h", "main_host.c", "main_qemu.c", "Makefile",
             "firmware.json", "et_runtime"}
DISPOSABLE = {"build", "run-host", "run-qemu", "pages", ".run.lock", "__pycache__"}


def _looks_compiled(out: Path) -> bool:
    return (out / SCHEDULE).is_file()


def _kept_files(out: Path) -> list[str]:
    """What in an earlier output compile did not write and a swap would throw away (saved weights, a
    local-learning run's work folder, notes): those are the user's."""
    try:
        recorded = json.loads((out / SCHEDULE).read_text()).get("outputs", {}).get("files", {})
    except (OSError, ValueError, AttributeError):
        recorded = {}
    ours = GENERATED | DISPOSABLE | {rel.split("/")[0] for rel in recorded}
    return sorted(p.name for p in out.iterdir() if p.name not in ours and not p.name.startswith("pages-"))


def check_out_dir(path: str) -> Path:
    """Fail before any solving if --out cannot be replaced: a file, a folder of someone else's files, or a
    parent folder that cannot be written."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise OutputDirError(f"--out {path!r} is a file; give a folder")
    if out.is_dir() and any(out.iterdir()) and not _looks_compiled(out):
        raise OutputDirError(f"--out {path!r} holds files that edgetrain did not write (no {SCHEDULE}); compile "
                             "replaces the whole folder, so give a new or empty folder")
    kept = _kept_files(out) if out.is_dir() and _looks_compiled(out) else []
    if kept:
        raise OutputDirError(f"--out {path!r} is an earlier output that also holds {', '.join(kept[:5])}"
                             f"{' ...' if len(kept) > 5 else ''}, which compile did not write; compile replaces the "
                             "whole folder, so move them out first or give another --out")
    parent = out.absolute().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        probe = parent / f"{_tmp_prefix(out)}{os.getpid()}-probe"
        probe.mkdir()
        probe.rmdir()
    except OSError as e:
        blocker = next((p for p in (parent, *parent.parents) if p.exists() and not p.is_dir()), None)
        why = f"{blocker} is a file, not a folder" if blocker else f"{e.strerror or e} in {parent}"
        raise OutputDirError(f"cannot write to output directory {path!r} ({why}; compile writes beside it, "
                             "then swaps it in). Choose another --out or fix its permissions.") from None
    return out


def _fsync_tree(folder: Path) -> None:
    for root, _dirs, files in os.walk(folder):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(root))


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot fsync a folder; the files themselves are synced
        pass
    finally:
        os.close(fd)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    rc = fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


class StagedOutput:
    """`with StagedOutput(out) as stage:` write into `stage.path`, then `stage.commit(save_schedule)`."""

    def __init__(self, out: str) -> None:
        self.out = check_out_dir(out)
        _remove_stale(self.out)
        self.path = self.out.absolute().parent / f"{_tmp_prefix(self.out)}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.path.mkdir()
        self.committed = False

    def __enter__(self) -> "StagedOutput":
        return self

    def __exit__(self, *exc) -> None:
        if not self.committed:
            shutil.rmtree(self.path, ignore_errors=True)

    def outputs(self, tensors: dict) -> dict:
        """The `outputs` section of the schedule: sha256 of every file written so far, the weights' table."""
        return {"files": file_table(self.path), "tensors": tensors}

    def commit(self) -> None:
        """fsync every file, then swap the folder in whole (the old output, if any, is removed after)."""
        _fsync_tree(self.path)
        target = self.out.absolute()
        for _ in range(10):  # another compile may create or swap the folder between our steps
            try:
                if target.exists():
                    if not _exchange(self.path, target):
                        self._swap_by_renames(target)
                        break
                    shutil.rmtree(self.path, ignore_errors=True)  # now holds the previous output
                else:
                    os.rename(self.path, target)
                break
            except FileNotFoundError:
                continue
            except OSError as e:
                if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
                    continue
                raise
        else:
            raise OutputDirError(f"could not swap the new output into {self.out} (another process keeps "
                                 "changing it)")
        _fsync_dir(target.parent)
        self.committed = True

    def _swap_by_renames(self, target: Path) -> None:
        """Without an atomic exchange: move the old output aside, the new one in, then drop the old."""
        old = target.parent / f"{_tmp_prefix(self.out)}{os.getpid()}-old-{uuid.uuid4().hex[:8]}"
        os.rename(target, old)
        os.rename(self.path, target)
        shutil.rmtree(old, ignore_errors=True)
