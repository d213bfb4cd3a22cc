"""`edgetrain run DIR [--qemu]` for C firmware: build it, run it, read the weights back, check them.

Without --qemu the generated Makefile builds the firmware with the host gcc and runs it here; with --qemu
it builds for the Cortex-M4F with arm-none-eabi-gcc and runs it under `qemu-system-arm -M mps2-an386`
with semihosting (the page store is a host folder) and `-icount shift=0`, so the board's timer counts
instructions. The run is gated on the exit code; the final weights (and the loss of every step) come
back through files and are held against PyTorch autograd from the same initial weights and data.
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

import numpy as np
import torch

from edgetrain.compiler.schedule_file import format as schedule_format
from edgetrain.compiler.errors import DeviceFitError, EdgetrainError
from edgetrain.runtime.python.integrity import verify_folder
from .reference import train_reference

RTOL, ATOL = 1e-5, 1e-6
APT = "apt-get install gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm"
STATUS = {0: "ET_OK", -1: "ET_ERR_ARG", -2: "ET_ERR_IO", -3: "ET_ERR_NOT_FOUND", -4: "ET_ERR_CRC",
          -5: "ET_ERR_FORMAT", -6: "ET_ERR_NOT_INIT"}
PR_SET_PDEATHSIG = 1  # linux/prctl.h
DATA_MAGIC, RESULT_MAGIC, NO_PAGE = 0x54445445, 0x53525445, 0xFFFFFFFF
QEMU_ARGS = ["-M", "mps2-an386", "-nographic", "-monitor", "none", "-semihosting-config",
             "enable=on,target=native", "-icount", "shift=0"]


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
        out[w["param"]] = torch.from_numpy(np.frombuffer(raw, dtype="<f4", offset=16).copy()).reshape(w["shape"])
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
    from edgetrain.codegen.c.device_fit import applies, check_elf
    from edgetrain.targets import Target

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
    params, k = {}, 0
    for p in manifest["params"]:
        params[p["name"]] = torch.from_numpy(floats[k:k + p["floats"]].copy()).reshape(p["shape"])
        k += p["floats"]
    losses = np.fromfile(os.path.join(work, "losses.bin"), dtype="<f4").tolist()
    ticks = np.fromfile(os.path.join(work, "ticks.bin"), dtype="<u4").tolist()
    return {"status": status, "steps_done": done, "paged_out": p_out, "paged_in": p_in, "params": params,
            "logits": torch.from_numpy(floats[n_params:].copy()), "losses": losses, "ticks": ticks,
            "params_sha256": hashlib.sha256(raw[32:32 + 4 * n_params]).hexdigest()}


def _compare(ours: dict, model) -> tuple[float, float, list[str]]:
    """The firmware's parameters and float buffers (running statistics) against the reference's."""
    max_abs = max_rel = 0.0
    bad = []
    refs = list(model.named_parameters()) + [(k, b) for k, b in model.named_buffers() if k in ours]
    for k, ref in refs:
        a, b = ours[k], ref.detach().cpu()
        diff = (a - b).abs()
        max_abs = max(max_abs, float(diff.max()) if diff.numel() else 0.0)
        max_rel = max(max_rel, float((diff / b.abs().clamp_min(ATOL)).max()) if diff.numel() else 0.0)
        if not torch.allclose(a, b, rtol=RTOL, atol=ATOL):
            bad.append(f"param {k}")
    return max_abs, max_rel, bad


def run_firmware(out_dir: str, *, qemu: bool, steps: int = 1, data: str = "random", check: bool = False,
                 seed: int = 1, cycle: int | None = None, timeout_s: float = 600.0, corrupt_page: int | None = None,
                 corrupt_step: int = 0) -> dict:
    from .run import schedule_batches

    body, manifest = verified_firmware(out_dir)
    if cycle:  # the first `cycle` batches in turn
        base = schedule_batches(body, data, min(cycle, steps), seed)
        batches = [base[k % len(base)] for k in range(steps)]
    else:
        batches = schedule_batches(body, data, steps, seed)
    with _exclusive(out_dir) as waited_for:  # one build and run of a folder at a time
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
        cmd = ["qemu-system-arm", *QEMU_ARGS, "-kernel", os.path.abspath(program)] if qemu else [
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
    result: dict = {
        "ok": p.returncode == 0, "build": where, "exit_code": p.returncode, "steps": len(batches), "data": data,
        "cycle": cycle,
        "checked": check, "arena_bytes": manifest["arena_bytes"], "budget_bytes": manifest["budget_bytes"],
        "state_bytes": manifest["state_bytes"], "predicted_peak_bytes": manifest["predicted_peak_bytes"],
        "predicted_paged_bytes_per_step": manifest["paged_bytes_per_step"], "max_abs_err": None,
        "max_rel_err": None, "instructions_per_step": None, "waited_for_pid": waited_for,
    }
    result.update(sizes)
    if p.returncode not in (0, 3):
        meaning = {1: "the MCU faulted (HardFault/BusFault/...)", 2: "the driver could not read data.bin or "
                   "write its results"}.get(p.returncode, "unexpected exit code")
        result["error_kind"] = "FirmwareFault"
        result["error"] = f"the firmware exited with {p.returncode} ({where}): {meaning}. {(p.stdout + p.stderr)[-500:]}"
        return result
    done = r["steps_done"]
    result.update(steps_done=done, losses=r["losses"], status=STATUS.get(r["status"], str(r["status"])),
                  paged_bytes=r["paged_out"] + r["paged_in"],
                  paged_bytes_per_step=(r["paged_out"] + r["paged_in"]) / done if done else None,
                  params_sha256=r["params_sha256"])
    if qemu and done:
        instr = [t * manifest["instructions_per_tick"] for t in r["ticks"]]
        result.update(instructions=instr, instructions_per_step=sum(instr) / len(instr))
    if r["status"] != 0:
        result["ok"] = False
        result["error_kind"] = "FirmwareStatus"
        result["error"] = (f"training step {done} stopped with {result['status']} ({r['status']})"
                           + (": a page failed its CRC check at page-in; the step never used it"
                              if r["status"] == -4 else "")
                           + (f": page file {missing} is missing from the medium" if missing else ""))
        return result
    if check:
        model, ref_losses = train_reference(body, os.path.join(out_dir, "weights.safetensors"), batches,
                                            torch.device("cpu"))
        max_abs, max_rel, bad = _compare(r["params"], model)
        model.eval()  # et_predict is inference: batch norm with its running statistics
        with torch.no_grad():
            ref_logits = model(batches[-1][0]).reshape(-1) if batches else torch.zeros(0)
        logit_err = float((r["logits"] - ref_logits).abs().max()) if batches else 0.0
        result.update(max_abs_err=max_abs, max_rel_err=max_rel, reference_losses=ref_losses, mismatched=bad[:20],
                      predict_max_abs_err=logit_err)
        if bad:
            result["ok"] = False
            result["error_kind"] = "CheckMismatch"
            result["error"] = (f"{len(bad)} tensors differ from autograd beyond rtol={RTOL}, atol={ATOL}: "
                               f"{', '.join(bad[:5])} (max abs err {max_abs:.3g}, max rel err {max_rel:.3g})")
    return result
