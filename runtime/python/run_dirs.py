"""A page store of its own for every run: two runs of one compiled folder never share page files."""
from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def alive(pid: int) -> bool:
    """Whether process `pid` still runs (one that is not ours counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_pages(plan_dir: str | os.PathLike) -> list[str]:
    """Page stores of runs whose process is gone (killed mid-run); returns what was removed."""
    gone = []
    for p in Path(plan_dir).glob("pages-*-*"):
        pid = p.name.split("-")[1]
        if p.is_dir() and pid.isdigit() and not alive(int(pid)):
            shutil.rmtree(p, ignore_errors=True)
            gone.append(str(p))
    return gone


@contextmanager
def run_pages(plan_dir: str | os.PathLike) -> Iterator[str]:
    """A fresh `pages-*` folder inside the plan's folder (or the system's temporary folder when that one
    cannot be written), removed with every page in it when the run ends, however it ends."""
    remove_stale_pages(plan_dir)
    try:
        path = tempfile.mkdtemp(prefix=f"pages-{os.getpid()}-", dir=plan_dir)
    except OSError:
        path = tempfile.mkdtemp(prefix=f"edgetrain-pages-{Path(plan_dir).name}-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
