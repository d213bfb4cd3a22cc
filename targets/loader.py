"""Device profiles: load, validate and cost.

A profile is one TOML file per device in ``targets/profiles/``. Every figure in it is required and
cited in its ``[sources]`` table, because the solver's answers are only as credible as these numbers.
The cost model is the POET one (Patil et al., "POET: Training Neural Networks on Tiny Devices with
Integrated Rematerialization and Paging", ICML 2022):

    compute time    = FLOPs / FLOP-per-second
    compute energy  = FLOPs / FLOP-per-joule
    transfer time   = latency + bytes / bandwidth      (page-in and page-out separately)
    transfer energy = transfer time x memory power

This module must not import compiler/, codegen/ or runtime/: it is the leaf every stage may use.
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import tempfile
import time
import tomllib
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

# Device families: Jetson modules, single-board computers, microcontrollers, the machine itself.
FAMILIES = ("jetson", "sbc", "mcu", "host")

# Figures that a profile with ``measured = true`` may leave to the loader by writing "measured".
MEASURED = "measured"
MEASURABLE_FIELDS = frozenset({"ram_bytes", "storage_bytes", "flops_per_s"})

# Byte counts are whole numbers; everything else is a float. Latencies may be zero (an idealised
# store), and so may storage; other sizes, rates and powers must be positive, or a cost formula divides
# by zero or makes paging free.
_INT_FIELDS = ("ram_bytes", "storage_bytes")
_FLOAT_FIELDS = (
    "flops_per_s",
    "flops_per_joule",
    "page_in_latency_s",
    "page_in_bandwidth_bytes_per_s",
    "page_out_latency_s",
    "page_out_bandwidth_bytes_per_s",
    "memory_power_w",
)
# storage_bytes = 0: a device without storage (no SD card), from which no weight can be streamed.
_ZERO_ALLOWED = frozenset({"page_in_latency_s", "page_out_latency_s", "storage_bytes"})
FIGURE_FIELDS = _INT_FIELDS + _FLOAT_FIELDS
_TEXT_FIELDS = ("name", "description", "family")
REQUIRED_FIELDS = _TEXT_FIELDS + FIGURE_FIELDS + ("sources",)
# Program memory: required of microcontrollers (the firmware's code and constant weights must fit it).
_FLASH = "flash_bytes"
# torch's intra-op threads a Python plan's CPU kernels train with on the device (its cores); 1 where absent. A
# plan's kernel scratch is counted for it and the runtime pins it (oneDNN holds more scratch per extra thread).
_THREADS = "cpu_threads"
# The board a microcontroller's firmware is built and emulated on (targets/boards/<name>.toml; boards.py).
_BOARD = "board"
_OPTIONAL_FIELDS = frozenset({"measured", _FLASH, _THREADS, _BOARD})
_WHOLE_FIELDS = _INT_FIELDS + (_FLASH,)


class TargetError(ValueError):
    """Base class of every error this module raises about targets."""


class UnknownTargetError(TargetError):
    """A target name that is neither a built-in profile nor a path to a .toml file."""


class TargetProfileError(TargetError):
    """A profile file that cannot be read or fails validation; the message names file and field."""


@dataclass(frozen=True)
class Target:
    """One device: its memory, storage, compute and paging figures, and the POET cost model."""

    name: str
    description: str
    family: str
    ram_bytes: int
    storage_bytes: int
    flops_per_s: float
    flops_per_joule: float
    page_in_latency_s: float
    page_in_bandwidth_bytes_per_s: float
    page_out_latency_s: float
    page_out_bandwidth_bytes_per_s: float
    memory_power_w: float
    # Excluded from hashing because a mapping is unhashable; still compared for equality.
    sources: Mapping[str, str] = field(default_factory=dict, hash=False)
    measured: bool = False
    flash_bytes: int | None = None  # on-chip program flash (family "mcu"); None for devices with a disk
    cpu_threads: int = 1  # intra-op threads of torch's CPU kernels on the device (a plan's scratch counts them)
    board: str | None = None  # where its C firmware is built and emulated (targets/boards/); None: the default
    # Where the profile came from; informative only, so two equal profiles compare equal.
    path: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        # Freeze the citations too, so a shared Target cannot be edited behind a caller's back.
        object.__setattr__(self, "sources", MappingProxyType(dict(self.sources)))

    @property
    def is_mcu(self) -> bool:
        """Whether the device is a microcontroller: C firmware is all that runs there, within its RAM and flash."""
        return self.family == "mcu"

    @property
    def gpu(self) -> bool:
        """Whether the device's plans train on a CUDA GPU (a Jetson's), not on its CPU cores."""
        return self.family == "jetson"

    # -- compute ---------------------------------------------------------------------------

    def compute_time_s(self, flops: float) -> float:
        """Seconds to run ``flops`` floating-point operations at the profile's throughput."""
        return _non_negative(flops, "flops") / self.flops_per_s

    def compute_energy_j(self, flops: float) -> float:
        """Joules for ``flops`` operations: FLOPs / (FLOP per joule)."""
        return _non_negative(flops, "flops") / self.flops_per_joule

    # -- paging ----------------------------------------------------------------------------

    def page_in_time_s(self, nbytes: float) -> float:
        """Seconds to bring ``nbytes`` from storage into RAM: latency + bytes / bandwidth."""
        return _transfer_time(nbytes, self.page_in_latency_s, self.page_in_bandwidth_bytes_per_s)

    def page_out_time_s(self, nbytes: float) -> float:
        """Seconds to write ``nbytes`` from RAM to storage: latency + bytes / bandwidth."""
        return _transfer_time(nbytes, self.page_out_latency_s, self.page_out_bandwidth_bytes_per_s)

    def page_in_energy_j(self, nbytes: float) -> float:
        """Joules for a page-in: its time x the memory power."""
        return self.page_in_time_s(nbytes) * self.memory_power_w

    def page_out_energy_j(self, nbytes: float) -> float:
        """Joules for a page-out: its time x the memory power."""
        return self.page_out_time_s(nbytes) * self.memory_power_w

    # -- serialisation ---------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able copy (schedules embed the target they were solved for)."""
        # Built field by field: dataclasses.asdict would try to deep-copy the mapping proxy.
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["sources"] = dict(self.sources)
        if d["flash_bytes"] is None:  # devices without a flash figure serialise as they always have
            del d["flash_bytes"]
        if d["cpu_threads"] == 1:  # likewise a profile that names no thread count
            del d["cpu_threads"]
        if d["board"] is None:  # and one that names no board
            del d["board"]
        return d


def _non_negative(value: float, what: str) -> float:
    if value < 0:
        raise ValueError(f"{what} must be >= 0, got {value!r}")
    return value


def _transfer_time(nbytes: float, latency_s: float, bandwidth: float) -> float:
    # Moving nothing is not a transfer, so it pays no latency either; this keeps "page 0 bytes"
    # (e.g. an empty tensor) from looking expensive to the solver.
    if _non_negative(nbytes, "nbytes") == 0:
        return 0.0
    return latency_s + nbytes / bandwidth


# -- loading ------------------------------------------------------------------------------------


def _profiles_dir() -> Path:
    return Path(str(resources.files(__package__) / "profiles"))


def list_targets() -> list[str]:
    """Names of the built-in profiles, sorted."""
    return sorted(p.stem for p in _profiles_dir().glob("*.toml"))


def load_target(spec: str | os.PathLike[str] | Target) -> Target:
    """Load a target by built-in name (``"rpi4"``) or by path to a ``.toml`` profile.

    A ``Target`` passes through unchanged so that APIs can accept either form.
    """
    if isinstance(spec, Target):
        return spec
    text = os.fspath(spec)
    # Only something that looks like a path is read as one, so a stray file named "host" in the
    # working directory can never shadow the built-in profile of that name.
    if text.endswith(".toml") or os.sep in text or (os.altsep and os.altsep in text):
        path = Path(text)
        if not path.is_file():
            raise TargetProfileError(f"{path}: no such target profile file")
        return _load_file(path, builtin=False)
    path = _profiles_dir() / f"{text}.toml"
    if not path.is_file():
        known = ", ".join(list_targets())
        raise UnknownTargetError(
            f"unknown target {text!r}; known targets: {known} (or pass a path to a .toml profile)"
        )
    return _load_file(path, builtin=True)


def _load_file(path: Path, *, builtin: bool) -> Target:
    try:
        with path.open("rb") as f:
            raw = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise TargetProfileError(f"{path}: not valid TOML: {e}") from e
    except OSError as e:
        raise TargetProfileError(f"{path}: cannot read: {e}") from e
    values = _validate(raw, path)
    if builtin and values["name"] != path.stem:
        raise TargetProfileError(
            f"{path}: field 'name' is {values['name']!r} but a built-in profile must be named "
            f"after its file ({path.stem!r})"
        )
    if values["measured"]:
        values.update(_measure_host(values))
    return Target(**values, path=str(path))


def _validate(raw: dict[str, Any], path: Path) -> dict[str, Any]:
    """Check every field of a parsed profile; return the keyword arguments of ``Target``."""

    def fail(fld: str, problem: str) -> TargetProfileError:
        return TargetProfileError(f"{path}: field {fld!r} {problem}")

    for fld in REQUIRED_FIELDS:
        if fld not in raw:
            raise fail(fld, "is missing (required)")
    unknown = sorted(set(raw) - set(REQUIRED_FIELDS) - _OPTIONAL_FIELDS)
    if unknown:
        # Typos such as "page_in_latency" would otherwise be silently ignored.
        raise fail(unknown[0], f"is not a known field; known fields: {', '.join(REQUIRED_FIELDS)}, measured, "
                               f"{_FLASH}, {_THREADS}, {_BOARD}")

    measured = raw.get("measured", False)
    if not isinstance(measured, bool):
        raise fail("measured", f"must be true or false, got {measured!r}")

    out: dict[str, Any] = {"measured": measured}
    for fld in _TEXT_FIELDS:
        value = raw[fld]
        if not isinstance(value, str) or not value.strip():
            raise fail(fld, f"must be a non-empty string, got {value!r}")
        out[fld] = value

    if out["family"] not in FAMILIES:
        raise fail("family", f"must be one of {', '.join(FAMILIES)}, got {out['family']!r}")

    for fld in FIGURE_FIELDS:
        out[fld] = _validate_figure(raw[fld], fld, measured, fail)

    if _FLASH in raw:
        out[_FLASH] = _validate_figure(raw[_FLASH], _FLASH, False, fail)
    elif out["family"] == "mcu":
        raise fail(_FLASH, "is missing (required of a microcontroller: its program flash, in bytes)")
    if _THREADS in raw:
        threads = raw[_THREADS]
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise fail(_THREADS, f"must be a whole number of threads >= 1, got {threads!r}")
        out[_THREADS] = threads
    if _BOARD in raw:
        board = raw[_BOARD]
        if not isinstance(board, str) or not (_profiles_dir().parent / "boards" / f"{board}.toml").is_file():
            raise fail(_BOARD, f"must name a board of targets/boards/, got {board!r}")
        out[_BOARD] = board
    out["sources"] = _validate_sources(raw["sources"], fail, flash=_FLASH in raw, threads=_THREADS in raw)
    return out


def _validate_figure(value: Any, fld: str, measured: bool, fail) -> Any:
    if value == MEASURED:
        if not measured or fld not in MEASURABLE_FIELDS:
            raise fail(fld, f"may be \"measured\" only in a profile with measured = true, and only for "
                            f"{', '.join(sorted(MEASURABLE_FIELDS))}")
        return None  # filled in by _measure_host
    # bool is an int subclass in Python; `ram_bytes = true` is a mistake, not 1 byte.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail(fld, f"must be a number, got {value!r}")
    if fld in _WHOLE_FIELDS and not isinstance(value, int):
        raise fail(fld, f"must be a whole number of bytes, got {value!r}")
    if not math.isfinite(value):
        raise fail(fld, f"must be finite, got {value!r}")
    if value < 0 or (value == 0 and fld not in _ZERO_ALLOWED):
        bound = ">= 0" if fld in _ZERO_ALLOWED else "> 0"
        raise fail(fld, f"must be {bound}, got {value!r}")
    return value if fld in _WHOLE_FIELDS else float(value)


def _validate_sources(sources: Any, fail, flash: bool = False, threads: bool = False) -> dict[str, str]:
    if not isinstance(sources, dict):
        raise fail("sources", "must be a table of strings, one per figure")
    cited = FIGURE_FIELDS + ((_FLASH,) if flash else ()) + ((_THREADS,) if threads else ())
    for fld in cited:
        cite = sources.get(fld)
        if not isinstance(cite, str) or not cite.strip():
            raise fail(f"sources.{fld}", "is missing: every figure must cite where it comes from")
    unknown = sorted(set(sources) - set(cited))
    if unknown:
        raise fail(f"sources.{unknown[0]}", "cites no known figure")
    return dict(sources)


# -- measuring the host -------------------------------------------------------------------------


def _measure_host(values: dict[str, Any]) -> dict[str, Any]:
    """Fill the figures a measured profile left as "measured"."""
    measure = {
        "ram_bytes": measure_ram_bytes,
        "storage_bytes": measure_storage_bytes,
        "flops_per_s": measure_flops_per_s,
    }
    return {fld: measure[fld]() for fld in MEASURABLE_FIELDS if values[fld] is None}


# Measurements are cached per process so that every load of "host" in one run describes the same
# machine: two schedules compiled in one process must not differ because free disk space moved.
@functools.cache
def measure_ram_bytes() -> int:
    """Physical RAM, capped by the cgroup memory limit when this process runs in a container."""
    total = _meminfo_total()
    limit = _cgroup_memory_limit()
    return min(total, limit) if limit else total


def _meminfo_total() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024  # the kernel reports kB (KiB)
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _cgroup_memory_limit() -> int | None:
    # A container sees the host's MemTotal, but what it may actually use is its cgroup's limit.
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            return int(text)
    return None


@functools.cache
def measure_storage_bytes() -> int:
    """Free bytes where paged tensors would go (the temporary directory)."""
    return shutil.disk_usage(tempfile.gettempdir()).free


@functools.cache
def measure_flops_per_s(n: int = 512, repeats: int = 5) -> float:
    """FP32 throughput of the compiling machine from a short torch matmul benchmark (~0.1 s, once per process)."""
    import torch  # imported here so that loading a non-host profile never needs torch

    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen)
    b = torch.randn(n, n, generator=gen)
    torch.mm(a, b)  # warm-up: first call pays for thread-pool start and kernel selection
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    # Best-of-N: the machine's capability, not the noise of whatever else was running.
    return 2.0 * n**3 / max(best, 1e-9)
