"""The backends by `--emit` name: the one table the pipeline and the CLI read (the interface: backend.py)."""
from __future__ import annotations

from edgetrain.compiler.errors import UnsupportedModelError

from .backend import Backend
from .c.backend import CBackend
from .python_backend import PythonBackend

BACKENDS: dict[str, Backend] = {b.name: b for b in (PythonBackend(), CBackend())}
EMITS = tuple(BACKENDS)  # the runtimes a plan is generated for: torch (runtime/python) or C firmware (runtime/c)


def backend_for(emit: str) -> Backend:
    """The backend `--emit emit` names; an unknown one fails naming the choices."""
    if emit not in BACKENDS:
        raise UnsupportedModelError(f"unknown --emit {emit!r}; choose one of {', '.join(EMITS)}")
    return BACKENDS[emit]
