"""C firmware's way to run: build a compiled folder, run it on a batch file, read its weights back.

Without qemu the generated Makefile builds the firmware with the host gcc and runs it here; with qemu it
builds for the target's board (targets/boards/) with arm-none-eabi-gcc and runs it under `qemu-system-arm
-M <the board's machine>` with semihosting (the page store is a host folder) and `-icount shift=0`, so the
board's timer counts instructions. The final weights (and the loss of every step) come back through files;
holding them against autograd is the workbench's (compiler/workbench/run_c.py).
"""
from __future__ import annotations

import ctypes
import fcntl
import hashlib
import json
import os
import shutil
import signal
import struct
import subprocess
import zlib
from contextlib import contextmanager

from dataclasses import dataclass, field

import numpy as np
import torch

from edgetrain.compiler.errors import DeviceFitError, EdgetrainError  # the user's errors
from edgetrain.compiler.schedule_file import format as schedule_format  # the schedule format
from edgetrain.runtime.python.integrity import verify_folder
from edgetrain.targets import Target
from edgetrain.targets.boards import board_of

from .device_fit import applies, check_elf
from .flash_data import STORE_DTYPES  # a streamed block's dtype

APT = "apt-get install gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm"
STATUS = {0: "ET_OK", -1: "ET_ERR_ARG", -2: "ET_ERR_IO", -3: "ET_ERR_NOT_FOUND", -4: "ET_ERR_CRC",
          -5: "ET_ERR_FORMAT", -6: "ET_ERR_NOT_INIT"}
PR_SET_PDEATHSIG = 1  # linux/prctl.h
DATA_MAGIC, RESULT_MAGIC, NO_PAGE = 0x54445445, 0x53525445, 0xFFFFFFFF
QEMU_ARGS = ["-nographic", "-monitor", "none", "-semihosting-config", "enable=on,target=native", "-icount",
             "shift=0"]  # after -M <the board's machine>


class FirmwareError(EdgetrainError):
    """The firmware could not be built or run (toolchain missing, compile error, crash, timeout)."""


@contextmanager
def _exclusive(out_dir: str):
    """Hold DIR/.run.lock (with our pid in it) while building and running; yields the pid waited for, if any."""
    fd = os.open(os.path.join(out_dir, ".run.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    waited = None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            waited = int(holder) if holder.isdigit() else None
            fcntl.flock(fd, fcntl.LOCK_EX)  # another run of this folder: its turn first
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield waited
    finally:
        os.close(fd)  # closing releases the lock


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux to SIGKILL it when the process that started it dies."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the timeout still bounds the run
        pass


def page_file(work: str, page_id: int) -> str:
    """The file the C page store keeps page `page_id` in (runtime/c/storage_block.c's name)."""
    return os.path.join(work, "pages", f"et_page_{page_id:08x}.bin")


def _missing_page(work: str, manifest: dict) -> str | None:
    """The first page the schedule pages in (an activation's or a streamed weight's) whose file is not on the
    medium."""
    ids = [p["id"] for p in manifest["pages"] if p.get("paged_in")] + [w["page"] for w in manifest.get("streamed", ())]
    return next((page_file(work, i) for i in ids if not os.path.exists(page_file(work, i))), None)


def load_streamed(out_dir: str, work: str, manifest: dict) -> None:
    """Put the streamed weights' blocks (compile's storage/) on the medium the firmware pages from."""
    for w in manifest.get("streamed", ()):
        shutil.copyfile(os.path.join(out_dir, w["file"]), page_file(work, w["page"]))


def read_streamed(work: str, manifest: dict) -> dict[str, torch.Tensor]:
    """The streamed weights as they are on the medium after the run, each block's header and CRC checked."""
    out = {}
    for w in manifest.get("streamed", ()):
        with open(page_file(work, w["page"]), "rb") as f:
            raw = f.read()
        magic, page, size, crc = struct.unpack_from("<4I", raw)
        if (magic, page, size, len(raw)) != (0x47505445, w["page"], w["bytes"], 16 + w["bytes"]) or \
                zlib.crc32(raw[16:], zlib.crc32(raw[:12])) != crc:
            raise FirmwareError(f"{page_file(work, w['page'])}: the block of streamed weight `{w['param']}` is damaged")
        dtype = STORE_DTYPES[w.get("dtype", "float32")]  # an int8 prefix's weights as their integers
        block = torch.from_numpy(np.frombuffer(raw, dtype=dtype, offset=16).copy()).reshape(w["shape"])
        out[w["param"]] = torch.cat([out[w["param"]], block]) if w["param"] in out else block  # blocks in row order
    return out


def _need(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        raise FirmwareError(f"{', '.join(missing)} not found. Install the toolchain: `{APT}` "
                            "(as root; `make toolchain` or `make test` in the edgetrain checkout does it)")


def is_c_plan(out_dir: str) -> bool:
    """Whether a compiled folder holds C firmware (its schedule was compiled with --emit c)."""
    return schedule_format.load(out_dir).get("backend") == "c"


def load_firmware(out_dir: str) -> tuple[dict, dict]:
    body = schedule_format.load(out_dir)
    if body.get("backend") != "c":
        raise EdgetrainError(f"{out_dir} holds a plan for the Python runtime; --qemu needs C firmware: compile "
                             "with `--emit c`")
    path = os.path.join(out_dir, "firmware.json")
    try:
        with open(path) as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise EdgetrainError(f"{out_dir} has a C schedule but no firmware.json; recompile with --emit c") from None
    if manifest.get("schedule_content") != schedule_format.content_hash(body):
        raise EdgetrainError(f"{out_dir}: the firmware was generated from another schedule; recompile the model")
    return body, manifest


def verified_firmware(out_dir: str) -> tuple[dict, dict]:
    """load_firmware, after every generated file (sources, Makefile, weights) is checked against the schedule:
    `make` runs the folder's Makefile, so nothing is built from a file compile did not write."""
    verify_folder(out_dir)
    return load_firmware(out_dir)


def build(out_dir: str, qemu: bool) -> str:
    """Run the generated Makefile; returns the path of the program."""
    if qemu:
        _need("make", "arm-none-eabi-gcc", "qemu-system-arm")
    else:
        _need("make", "gcc")
    target = "qemu" if qemu else "host"
    p = subprocess.run(["make", "-s", "-C", out_dir, target], capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise FirmwareError(f"building the firmware ({target}) failed:\n{(p.stdout + p.stderr)[-3000:]}")
    return os.path.join(out_dir, "build", "m4f", "fw.elf") if qemu else os.path.join(out_dir, "build", "host", "fw")


def elf_size(elf: str) -> dict:
    """text/data/bss of the firmware as arm-none-eabi-size reports them (Berkeley format)."""
    _need("arm-none-eabi-size")
    out = subprocess.run(["arm-none-eabi-size", elf], capture_output=True, text=True, check=True).stdout
    text, data, bss = (int(v) for v in out.splitlines()[1].split()[:3])
    return {"text_bytes": text, "data_bytes": data, "bss_bytes": bss, "ram_bytes": data + bss, "flash_bytes": text + data}


def check_size(sizes: dict, target: dict) -> None:
    """The built image's text+data against the device's flash and data+bss (and the stack) against its RAM."""
    device = Target(**target)
    message = check_elf(sizes, device) if applies(device) else None
    if message:
        raise DeviceFitError(message)


def write_data(path: str, manifest: dict, batches: list, corrupt_step: int | None,
               corrupt_page: int | None) -> None:
    """The driver's input: a header, then each step's x (float32) and labels (int32), little-endian."""
    with open(path, "wb") as f:
        f.write(struct.pack("<8I", DATA_MAGIC, 1, len(batches), manifest["input_floats"], manifest["batch"],
                            NO_PAGE if corrupt_step is None else corrupt_step,
                            NO_PAGE if corrupt_page is None else corrupt_page, 0))
        for x, y in batches:
            f.write(np.ascontiguousarray(x.numpy(), dtype="<f4").tobytes())
            f.write(np.ascontiguousarray(y.numpy(), dtype="<i4").tobytes())


def _boundary(work: str, count: int, status: int) -> np.ndarray:
    """An int8 prefix's dequantised output on the last batch (boundary.bin, which the driver writes as the plan
    hands it over); empty without one, or where the run stopped before it."""
    path = os.path.join(work, "boundary.bin")
    if not count or status != 0 or not os.path.exists(path):
        return np.zeros(0, dtype=np.float32)
    floats = np.fromfile(path, dtype="<f4")
    if floats.size != count:
        raise FirmwareError(f"{path} holds {floats.size} floats, expected {count}")
    return floats


def read_result(work: str, manifest: dict) -> dict:
    with open(os.path.join(work, "result.bin"), "rb") as f:
        raw = f.read()
    magic, version, status, done, p_out, p_in, n_params, n_logits = struct.unpack_from("<8I", raw)
    if magic != RESULT_MAGIC or version != 1:
        raise FirmwareError(f"{work}/result.bin is not a result file")
    status = struct.unpack("<i", struct.pack("<I", status))[0]
    floats = np.frombuffer(raw, dtype="<f4", offset=32)
    if floats.size != n_params + n_logits:
        raise FirmwareError(f"{work}/result.bin is truncated ({floats.size} floats, expected {n_params + n_logits})")
    boundary = _boundary(work, manifest.get("int8_boundary_floats", 0), status)
    params, int32, k = {}, {}, 0
    for p in manifest["params"]:
        if p.get("dtype") == "int32":  # int8 bias training's int32 biases, their bits in the floats' slots
            int32[p["name"]] = floats[k:k + p["floats"]].view("<i4").astype(np.int32).reshape(p["shape"])
        else:
            params[p["name"]] = torch.from_numpy(floats[k:k + p["floats"]].copy()).reshape(p["shape"])
        k += p["floats"]
    losses = np.fromfile(os.path.join(work, "losses.bin"), dtype="<f4").tolist()
    ticks = np.fromfile(os.path.join(work, "ticks.bin"), dtype="<u4").tolist()
    return {"status": status, "steps_done": done, "paged_out": p_out, "paged_in": p_in, "params": params,
            "int32_params": int32,
            "logits": torch.from_numpy(floats[n_params:n_params + n_logits].copy()),
            "int8_boundary": boundary, "losses": losses, "ticks": ticks,
            "params_sha256": hashlib.sha256(raw[32:32 + 4 * n_params]).hexdigest()}


@dataclass
class Ran:
    """One run of a firmware folder: how it ended, and what it wrote back (`result`: read_result's, None when
    it exited before writing one)."""

    where: str  # "host" or "qemu"
    exit_code: int
    output: str  # its stdout and stderr
    result: dict | None
    missing_page: str | None  # the page file a run stopped with ET_ERR_NOT_FOUND for, if it is absent
    sizes: dict = field(default_factory=dict)  # the image's text/data/bss (qemu builds)
    waited_for: int | None = None  # the pid of another run of the folder this one waited for


def run_program(out_dir: str, body: dict, manifest: dict, batches: list, *, qemu: bool, timeout_s: float = 600.0,
                corrupt_page: int | None = None, corrupt_step: int = 0) -> Ran:
    """Build the folder's firmware (host or the target's board under QEMU), run it on `batches` in a work folder
    of its own and read its results back; one build and run of a folder at a time."""
    with _exclusive(out_dir) as waited_for:
        program = build(out_dir, qemu)
        sizes = elf_size(program) if qemu else {}
        if qemu:
            check_size(sizes, body["target"])  # before running: an image that does not fit is refused
        where = "qemu" if qemu else "host"
        work = os.path.join(out_dir, f"run-{where}")
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(os.path.join(work, "pages"))
        load_streamed(out_dir, work, manifest)
        write_data(os.path.join(work, "data.bin"), manifest, batches,
                   corrupt_step if corrupt_page is not None else None, corrupt_page)
        machine = board_of(Target(**body["target"])).qemu_machine
        cmd = ["qemu-system-arm", "-M", machine, *QEMU_ARGS, "-kernel", os.path.abspath(program)] if qemu else [
            os.path.abspath(program)]
        try:
            # The firmware (or QEMU) dies with this process: a killed `edgetrain run` leaves no orphan behind.
            p = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=timeout_s,
                               preexec_fn=_die_with_parent)
        except subprocess.TimeoutExpired:
            raise FirmwareError(f"the firmware ran past {timeout_s:.0f} s ({where}) and was stopped") from None
        r = read_result(work, manifest) if p.returncode in (0, 3) else None
        missing = _missing_page(work, manifest) if r is not None and r["status"] == -3 else None
        if r is not None and p.returncode == 0:
            r["params"].update(read_streamed(work, manifest))  # the frozen weights the device streamed
        shutil.rmtree(os.path.join(work, "pages"), ignore_errors=True)  # pages live only within a step
    return Ran(where, p.returncode, p.stdout + p.stderr, r, missing, sizes, waited_for)
