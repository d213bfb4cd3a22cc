"""How a failed command reports: one message, one JSON shape, one exit code.

Anticipated failures (bad input, a damaged compiled folder, a full or read-only disk, a missing toolchain,
a broken model file) print `edgetrain CMD: error: MESSAGE` on stderr, or under --json the one object
`{"ok": false, "error": {"kind": KIND, "message": MESSAGE}}` on stdout, and exit 2 without a traceback
(--debug adds it). Anything else is a bug: the same object with kind "internal", and the traceback. Ctrl-C that
ends a command (kind "Interrupted") exits 130.
"""
from __future__ import annotations

import errno
import json
import math
import re

from safetensors import SafetensorError

from edgetrain.compiler.errors import EdgetrainError
from edgetrain.runtime.python import (IntegrityError, LedgerError, PageStoreError, PlanError, WeightsError)
from edgetrain.runtime.python.checks import NonFiniteError, PeakMismatchError
from edgetrain.runtime.python.local_trainer import TrainingStateError

ANTICIPATED = (EdgetrainError, ValueError, IntegrityError, WeightsError, PlanError, PageStoreError, LedgerError,
               PeakMismatchError, NonFiniteError, SafetensorError, TrainingStateError, OSError)
EXIT_ERROR, EXIT_FAILED, EXIT_INTERNAL = 2, 1, 3
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports a command killed by SIGINT (128 + 2)

_OS_KINDS = {errno.ENOSPC: ("StorageFull", "free space on that disk or choose another folder"),
             errno.EDQUOT: ("StorageFull", "free space on that disk or choose another folder"),
             errno.EROFS: ("ReadOnlyStorage", "choose a folder on a writable disk"),
             errno.EACCES: ("PermissionDenied", "fix its permissions or choose another folder"),
             errno.EPERM: ("PermissionDenied", "fix its permissions or choose another folder"),
             errno.ENOENT: ("FileNotFound", "check the path")}


def describe(e: BaseException) -> tuple[str, str]:
    """(kind, message) of an anticipated failure."""
    if isinstance(e, OSError) and not isinstance(e, (EdgetrainError,)):
        kind, fix = _OS_KINDS.get(e.errno, ("StorageError", "check the disk and the path"))
        where = f" ({e.filename})" if e.filename else ""
        return kind, f"{e.strerror or e}{where}: {fix}"
    if isinstance(e, PageStoreError) and getattr(e, "errno", None) in _OS_KINDS:
        kind, fix = _OS_KINDS[e.errno]
        return kind, f"{e}: {fix}"
    if isinstance(e, SafetensorError):  # safetensors' writer reports the OS error only in its text
        m = re.search(r"os error (\d+)", str(e))
        if m and int(m.group(1)) in _OS_KINDS:
            kind, fix = _OS_KINDS[int(m.group(1))]
            return kind, f"{e}: {fix}"
    return type(e).__name__, str(e)


def error_object(kind: str, message: str) -> dict:
    return {"ok": False, "error": {"kind": kind, "message": message}}


def json_safe(value):
    """`value` with every non-finite float written as the string "nan", "inf" or "-inf": JSON has no NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def dumps(obj: dict) -> str:
    return json.dumps(json_safe(obj), default=str, allow_nan=False)
