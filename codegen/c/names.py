"""Names and values from the model never reach C source as written: every name becomes a safe identifier or
comment, every float an exact literal.

A module may be called anything Python accepts (`add_module('x; system("rm -rf /")', ...)`), and its
name flows into parameter and node names. In identifiers only `[A-Za-z0-9_]` survive, every other run of
characters becomes one `_`, the result gets a fixed prefix (so it never starts with a digit, an
underscore or a C keyword), is cut to a length every C99 compiler distinguishes, and is made unique
with a numeric suffix. In comments, only printable ASCII survives, and the sequences that could end a
comment (`*/`) or form a trigraph (`??/` would splice lines under -std=c99) are broken up.
"""
from __future__ import annotations

import re

import numpy as np

from edgetrain.compiler.errors import UnsupportedModelError

_NOT_IDENT = re.compile(r"[^A-Za-z0-9]+")
MAX_IDENT = 48  # C99 guarantees 63 significant initial characters for internal identifiers


def c_ident(name: str, prefix: str) -> str:
    """`prefix` + the name's letters and digits, runs of anything else as one `_` (not unique: see Namer)."""
    body = _NOT_IDENT.sub("_", name).strip("_")
    ident = f"{prefix}_{body}" if body else prefix
    return ident[:MAX_IDENT].rstrip("_")


class Namer:
    """Deterministic unique identifiers: the same names in the same order give the same identifiers."""

    def __init__(self) -> None:
        self._taken: set[str] = set()
        self._given: dict[tuple[str, str], str] = {}

    def __call__(self, name: str, prefix: str) -> str:
        key = (prefix, name)
        if key in self._given:
            return self._given[key]
        base = c_ident(name, prefix)
        ident, k = base, 2
        while ident in self._taken:
            ident = f"{base[:MAX_IDENT - 6]}_{k}"
            k += 1
        self._taken.add(ident)
        self._given[key] = ident
        return ident


def c_comment(text: str, limit: int = 160) -> str:
    """Text safe inside /* ... */: printable ASCII, no comment end, no trigraph, one line."""
    out = "".join(ch if " " <= ch <= "~" and ch != "\\" else "?" for ch in str(text))
    while "*/" in out or "/*" in out:
        out = out.replace("*/", "* /").replace("/*", "/ *")
    while "??" in out:
        out = out.replace("??", "?-?")
    if len(out) > limit:
        out = out[: limit - 3] + "..."
    return out


def c_float(v: float) -> str:
    """An exact float32 literal: 9 significant digits round-trip every float32, parsed with the f suffix."""
    v = float(np.float32(v))
    if not np.isfinite(v):
        raise UnsupportedModelError(f"a non-finite value ({v}) cannot be written as a C initializer")
    s = "%.9g" % v
    if not any(ch in s for ch in ".e"):
        s += ".0"
    return s + "f"
