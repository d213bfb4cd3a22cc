"""Device profiles for edgetrain: one cited TOML file per device, loaded into a ``Target``.

    >>> from edgetrain.targets import load_target
    >>> orin = load_target("jetson-agx-orin")
    >>> orin.page_in_time_s(1_000_000)   # latency + bytes / bandwidth

Importing this package pulls in nothing from compiler/, codegen/ or runtime/.
"""

from .boards import DEFAULT_BOARD, Board, board_of, list_boards, load_board
from .loader import (FAMILIES, Target, TargetError, TargetProfileError, UnknownTargetError, list_targets, load_target, measure_flops_per_s)

__all__ = [
    "DEFAULT_BOARD",
    "Board",
    "board_of",
    "list_boards",
    "load_board",
    "FAMILIES",
    "Target",
    "TargetError",
    "TargetProfileError",
    "UnknownTargetError",
    "list_targets",
    "load_target",
    "measure_flops_per_s",
]
