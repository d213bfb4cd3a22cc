"""Boards: where a microcontroller's C firmware is built and run, as data (one TOML file per board).

A board names its QEMU machine, the CPU flags of its build, its port folder under runtime/c/port (startup
code and link script), the memory its link script gives the image, and the timer the firmware's driver
reads. The Makefile and driver templates, the QEMU runner and the device fit read these figures; a test
holds each port's link script to its board's. A target profile names its board (`board = "..."`); one that
names none is built for DEFAULT_BOARD.

Like loader.py, this module imports nothing from compiler/, codegen/ or runtime/.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path

from .loader import TargetProfileError

DEFAULT_BOARD = "mps2-an386"  # QEMU's Cortex-M4F board, linked to the nRF52840's memory map


@dataclass(frozen=True)
class Board:
    name: str
    description: str
    qemu_machine: str  # qemu-system-arm -M <machine>
    port: str  # runtime/c/port/<port>/: startup.c and link.ld
    cpu_flags: str  # the compiler's flags for the board's CPU
    memory_map: str  # whose memory the link script gives the image
    flash_origin: int
    flash_bytes: int
    ram_origin: int
    ram_bytes: int
    stack_bytes: int  # the link script's minimum stack
    timer: str  # the timer the driver counts a step with
    timer_base: int  # its registers' address
    timer_hz: int

    @property
    def instructions_per_tick(self) -> int:
        """Instructions a timer tick counts under QEMU's -icount shift=0 (one instruction a nanosecond)."""
        return 1_000_000_000 // self.timer_hz


def _boards_dir() -> Path:
    return Path(str(resources.files(__package__) / "boards"))


def list_boards() -> list[str]:
    return sorted(p.stem for p in _boards_dir().glob("*.toml"))


def load_board(name: str) -> Board:
    """The board `name` (targets/boards/<name>.toml); an unknown one fails naming the known ones."""
    path = _boards_dir() / f"{name}.toml"
    if not path.is_file():
        raise TargetProfileError(f"unknown board {name!r}; known boards: {', '.join(list_boards())} "
                                 "(targets/boards/<name>.toml)")
    with path.open("rb") as f:
        raw = tomllib.load(f)
    want = {f.name: f.type for f in fields(Board)}
    missing, unknown = sorted(set(want) - set(raw)), sorted(set(raw) - set(want))
    if missing or unknown or raw["name"] != name:
        raise TargetProfileError(f"{path}: " + (f"field {missing[0]!r} is missing" if missing else
                                                f"field {unknown[0]!r} is not a board's" if unknown else
                                                f"'name' must be the file's name ({name!r})"))
    for k, v in raw.items():
        if (want[k] == "int") != (isinstance(v, int) and not isinstance(v, bool)) or \
                (want[k] == "str" and not isinstance(v, str)):
            raise TargetProfileError(f"{path}: field {k!r} must be {'a whole number' if want[k] == 'int' else 'text'}")
    return Board(**raw)


def board_of(target) -> Board:
    """The board a target's firmware is built and emulated on."""
    return load_board(getattr(target, "board", None) or DEFAULT_BOARD)
