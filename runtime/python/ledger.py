"""The memory ledger: every byte the runtime holds, by tensor name, with the peak.

It counts what the schedule's memory model counts: parameters, momentum buffers, buffers, labels,
activations, gradients, aux outputs, and, while a kernel's result is being applied, its parameter
gradients and scratch (`transient`). Views are not tensors here: they cost nothing.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


class LedgerError(RuntimeError):
    pass


class Ledger:
    def __init__(self) -> None:
        self._held: dict[str, int] = {}
        self._live = 0
        self._peak = 0
        self._peak_at = ""

    # -- counting -------------------------------------------------------------------------------------
    def alloc(self, name: str, nbytes: int) -> None:
        if name in self._held:
            raise LedgerError(f"ledger: '{name}' is already allocated ({self._held[name]} bytes)")
        if nbytes < 0:
            raise LedgerError(f"ledger: negative size {nbytes} for '{name}'")
        self._held[name] = int(nbytes)
        self._grow(int(nbytes), name)

    def release(self, name: str) -> int:
        if name not in self._held:
            raise LedgerError(f"ledger: release of '{name}', which is not allocated")
        nbytes = self._held.pop(name)
        self._live -= nbytes
        return nbytes

    def hand_over(self, name: str, to: str) -> None:
        """`to` takes `name`'s bytes (an output written into that operand): `name` holds none until its release."""
        if name not in self._held:
            raise LedgerError(f"ledger: hand-over of '{name}', which is not allocated")
        if to in self._held:
            raise LedgerError(f"ledger: '{to}' is already allocated ({self._held[to]} bytes)")
        self._held[to], self._held[name] = self._held[name], 0

    @contextmanager
    def transient(self, nbytes: int, label: str = "transient") -> Iterator[None]:
        """Workspace held only for the duration of the `with` block (counted in the peak)."""
        nbytes = int(nbytes)
        self.enter(nbytes, label)
        try:
            yield
        finally:
            self.leave(nbytes)

    def enter(self, nbytes: int, label: str) -> None:
        """`transient` without its context object (hundreds a step): held until `leave(nbytes)`."""
        self._grow(nbytes, label)

    def leave(self, nbytes: int) -> None:
        self._live -= nbytes

    def _grow(self, nbytes: int, label: str) -> None:
        self._live += nbytes
        if self._live > self._peak:
            self._peak, self._peak_at = self._live, label

    # -- reading --------------------------------------------------------------------------------------
    @property
    def live_bytes(self) -> int:
        return self._live

    @property
    def peak_bytes(self) -> int:
        return self._peak

    @property
    def peak_at(self) -> str:
        """The allocation (or transient label) that set the peak."""
        return self._peak_at

    def reset_peak(self) -> None:
        self._peak, self._peak_at = self._live, "reset"

    def __contains__(self, name: str) -> bool:
        return name in self._held

    def bytes_of(self, name: str) -> int:
        return self._held[name]

    def names(self) -> list[str]:
        return list(self._held)
