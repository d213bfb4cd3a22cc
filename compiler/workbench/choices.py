"""argparse choices read from their registry on first use, so that parsing needs no torch."""
from __future__ import annotations

import importlib


class Choices:
    """The names of a registry (`module.attr`, a tuple or a dict), imported when argparse first checks a value
    against them or prints them."""

    def __init__(self, module: str, attr: str) -> None:
        self._module, self._attr = module, attr
        self._names: tuple[str, ...] | None = None

    def _get(self) -> tuple[str, ...]:
        if self._names is None:
            self._names = tuple(getattr(importlib.import_module(self._module), self._attr))
        return self._names

    def __contains__(self, value) -> bool:
        return value in self._get()

    def __iter__(self):
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())
