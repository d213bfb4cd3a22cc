"""Device profiles for edgetrain: one cited TOML file per device, loaded into a ``Target``.

    >>> from targets import load_target
    >>> orin = load_target("jetson-agx-orin")
    >>> orin.page_in_time_s(1_000_000)   # latency + bytes / bandwidth

Importing this package pulls in nothing from compiler/, codegen/ or runtime/.
"""

from .loader import (FAMILY_CODEGEN, Target, TargetError, TargetProfileError, UnknownTargetError, list_targets, load_target, measure_flops_per_s)

__all__ = [
    "FAMILY_CODEGEN",
    "Target",
    "TargetError",
    "TargetProfileError",
    "UnknownTargetError",
    "list_targets",
    "load_target",
    "measure_flops_per_s",
]
