"""The input batch read from storage patch by patch: where only a tiled frozen prefix reads it, the C firmware never
holds it whole (no driver buffer, no arena slot), each tile's gather reads its rows through a reader, the schedule
and the arena leave it out, and training stays exact; the Python plan keeps its input as it was."""
from __future__ import annotations

import ctypes
import json
import random
import shutil
import subprocess
from ctypes import POINTER, byref, c_float, c_int, c_int32, c_uint32, c_void_p

import numpy as np
import pytest

from edgetrain.compiler.workbench import cli
from edgetrain.codegen.c.backend import CBackend
from edgetrain.compiler.graph.input_storage import (input_in_storage, read_bytes, readable_from_storage,
                                                    tiles_can_read_input, with_input_in_storage)
from edgetrain.compiler.graph.liveness import analyze
from edgetrain.compiler.graph.tiling import TILED_OP, tile_frozen_prefix
from edgetrain.compiler.pipeline import CompileOptions, build_graph, compile_model
from edgetrain.compiler.scheduling.budget import min_budget
from edgetrain.targets import load_target
from edgetrain.targets.boards import board_of

from tests.test_c_kernels import C_DIR, WARN

HAVE_ARM = bool(shutil.which("arm-none-eabi-gcc") and shutil.which("qemu-system-arm") and shutil.which("make"))
INPUT_40 = 4 * 3 * 40 * 40  # mcu_mbv2_40's batch of one


def _low(g) -> int:
    return min_budget(analyze(g))


@pytest.fixture(scope="module")
def tiled40():
    g = build_graph(CompileOptions(model="mcu_mbv2_40", target="nrf52840", budget="auto", out="unused", batch_size=1,
                                   emit="c"), load_target("nrf52840"))[2]
    return g, tile_frozen_prefix(g, lambda x: False, _low).graph


def test_only_a_tiled_prefix_reads_the_input_from_storage_and_the_budget_drops_by_its_bytes(tiled40):
    g, tiled = tiled40
    assert not readable_from_storage(g) and with_input_in_storage(g) is g  # the first conv reads it whole
    assert tiles_can_read_input(g)  # but a tiling could: the refusal's floor counts it nowhere
    stored = with_input_in_storage(tiled)
    assert input_in_storage(stored) and stored.nodes[0].bytes == 0 and tiled.nodes[0].bytes == INPUT_40
    assert _low(stored) == _low(tiled) - INPUT_40  # the peak is the tiled node's, which held the batch beside it
    reader = next(n for n in stored.nodes if n.op == TILED_OP)
    assert read_bytes(reader) >= INPUT_40  # every pixel at least once, halos twice


def test_the_python_plan_keeps_its_input_whole(tmp_path):
    r = compile_model(CompileOptions(model="mcu_mbv2_40", target="nrf52840", budget="400KB", out=str(tmp_path / "py"),
                                     batch_size=1, time_limit=10.0))
    body = json.loads((tmp_path / "py" / "schedule.json").read_text())
    x = next(n for n in body["graph"]["nodes"] if n["kind"] == "input")
    assert r["tiled"] and "in_storage" not in x["attrs"] and "input_read_bytes_per_step" not in r


class _Reader(ctypes.Structure):
    _fields_ = [("read", c_void_p), ("ctx", c_void_p)]


@pytest.fixture(scope="module")
def patch_lib(tmp_path_factory):
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("host gcc is not installed")
    so = tmp_path_factory.mktemp("patch") / "libpatch.so"
    subprocess.run([gcc, *WARN, "-O2", "-ffp-contract=off", "-shared", "-fPIC", f"-I{C_DIR}", "-o", str(so),
                    *(str(C_DIR / "kernels" / f) for f in ("patch.c", "q8_patch.c", "q8_convert.c")),
                    str(C_DIR / "storage_input.c")], check=True)
    lib = ctypes.CDLL(str(so))
    f = POINTER(c_float)
    lib.et_patch_gather.argtypes = [c_int] * 4 + [f] + [c_int] * 8 + [f]
    lib.et_patch_read.argtypes = [POINTER(_Reader)] + [c_int] * 12 + [f]
    lib.et_patch_read.restype = c_int
    lib.et_q8_patch_quantize.argtypes = [c_int] * 4 + [f] + [c_int] * 4 + [c_float, c_int32, c_void_p]
    lib.et_q8_patch_quantize_read.argtypes = [POINTER(_Reader)] + [c_int] * 8 + [c_float, c_int32, c_void_p]
    lib.et_q8_patch_quantize_read.restype = c_int
    lib.et_input_memory.argtypes, lib.et_input_memory.restype = [f], _Reader
    lib.et_input_bytes_read.restype = c_uint32
    return lib


def _ptr(a: np.ndarray):
    return a.ctypes.data_as(POINTER(c_float))


@pytest.mark.parametrize("seed", range(6))
def test_a_patch_read_from_storage_is_the_gather_from_memory_bit_for_bit(patch_lib, seed):
    rng = random.Random(seed)
    n, c, h, w = rng.randint(1, 2), rng.randint(1, 4), rng.randint(3, 12), rng.randint(3, 12)
    y, x = rng.randint(0, h - 1), rng.randint(0, w - 1)
    ch, cw = rng.randint(1, h - y), rng.randint(1, w - x)
    top, bottom, left, right = (rng.randint(0, 2) for _ in range(4))
    src = np.random.default_rng(seed).standard_normal(n * c * h * w).astype(np.float32)
    size = n * c * (top + ch + bottom) * (left + cw + right)
    want, got = np.full(size, np.nan, np.float32), np.full(size, np.nan, np.float32)
    patch_lib.et_patch_gather(n, c, h, w, _ptr(src), y, ch, x, cw, top, bottom, left, right, _ptr(want))
    reader = patch_lib.et_input_memory(_ptr(src))
    before = patch_lib.et_input_bytes_read()
    assert patch_lib.et_patch_read(byref(reader), n, c, h, w, y, ch, x, cw, top, bottom, left, right, _ptr(got)) == 0
    assert want.tobytes() == got.tobytes()  # every padding float written, every row where it belongs
    assert patch_lib.et_input_bytes_read() - before == 4 * n * c * ch * cw  # only the region, never the padding


@pytest.mark.parametrize("w", [5, 32, 70])  # within one read, exactly one, and three (32 floats at a time)
def test_an_int8_patch_quantised_as_it_is_read_is_the_one_quantised_from_memory(patch_lib, w):
    rng = np.random.default_rng(w)
    src = (30 * rng.standard_normal((2, 3, 9, w + 4))).astype(np.float32)
    want, got = np.zeros(2 * 3 * 5 * w, np.int8), np.ones(2 * 3 * 5 * w, np.int8)
    patch_lib.et_q8_patch_quantize(2, 3, 9, w + 4, _ptr(src), 2, 5, 3, w, 0.25, -3, want.ctypes.data)
    reader = patch_lib.et_input_memory(_ptr(src))
    before = patch_lib.et_input_bytes_read()
    assert patch_lib.et_q8_patch_quantize_read(byref(reader), 2, 3, 9, w + 4, 2, 5, 3, w, 0.25, -3,
                                               got.ctypes.data) == 0
    assert np.array_equal(want, got) and patch_lib.et_input_bytes_read() - before == 4 * 2 * 3 * 5 * w


def test_a_failing_read_stops_the_patch_with_its_error(patch_lib):
    calls = []

    @ctypes.CFUNCTYPE(c_int, c_void_p, c_uint32, c_uint32, POINTER(c_float))
    def broken(ctx, offset, count, dst):
        calls.append(offset)
        return -2  # ET_ERR_IO: the medium failed

    reader = _Reader(ctypes.cast(broken, c_void_p), None)
    out = np.zeros(2 * 5 * 5, np.float32)
    assert patch_lib.et_patch_read(byref(reader), 1, 2, 5, 5, 0, 3, 0, 3, 1, 1, 1, 1, _ptr(out)) == -2
    assert calls == [0]  # the first row's read failed: nothing after it was asked for


def _compile(out, budget: int, reads_input: bool) -> dict:
    held = CBackend.reads_input_from_storage
    CBackend.reads_input_from_storage = reads_input  # the same compile with the input kept whole, to compare
    try:
        return compile_model(CompileOptions(model="mcu_mbv2_40", target="nrf52840", budget=str(budget), out=str(out),
                                            batch_size=1, emit="c", time_limit=20.0))
    finally:
        CBackend.reads_input_from_storage = held


def _run(out, capsys, *flags) -> dict:
    rc = cli.main(["run", str(out), "--steps", "2", "--check", "--json", *flags])
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and res["ok"] and not res["mismatched"], res
    return res


def test_the_host_firmware_reads_its_input_patch_by_patch_exactly(tmp_path, capsys):
    """mcu_mbv2_40 at the smallest budget of its 8x8 tiling with the input whole (180,952 B), less the input's
    bytes: the same tiling, no input buffer, no arena slot, exact against autograd on the same batches."""
    out = tmp_path / "on"
    r = _compile(out, 180_952 - INPUT_40, True)
    assert [t["grid"] for t in r["tiled"]] == [8] and r["peak_bytes"] == 180_952 - INPUT_40
    plan, driver = (out / "plan.c").read_text(), (out / "main_host.c").read_text()
    assert "et_patch_read(x," in plan and "memcpy" not in plan.split("et_train_step_read")[1].split("stage 1:")[0]
    assert "g_x" not in driver and "#define ET_INPUT_IN_STORAGE 1" in (out / "plan.h").read_text()
    res = _run(out, capsys)
    assert res["input_read_bytes"] == [r["input_read_bytes_per_step"]] * 2  # the driver counted what compile said
    assert res["predicted_input_read_bytes_per_step"] == r["input_read_bytes_per_step"] > INPUT_40


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_ARM, reason="arm-none-eabi-gcc / qemu-system-arm missing")
def test_on_the_nrf52840_the_image_holds_the_input_nowhere(tmp_path, capsys):
    """The same model and tiling, the input whole (budget 180,952 B) and read from storage (19,200 B less): under
    QEMU both exact; arm-none-eabi-size's RAM (.data + .bss) lower by the input twice (the driver's buffer and its
    arena slot), the bytes read each step as compile predicted."""
    whole, stored = _compile(tmp_path / "off", 180_952, False), _compile(tmp_path / "on", 180_952 - INPUT_40, True)
    assert whole["tiled"] == stored["tiled"] and whole["arena_bytes"] - stored["arena_bytes"] == INPUT_40
    a, b = _run(tmp_path / "off", capsys, "--qemu"), _run(tmp_path / "on", capsys, "--qemu")
    assert a["ram_bytes"] - b["ram_bytes"] == 2 * INPUT_40, (a["ram_bytes"], b["ram_bytes"])
    assert b["ram_bytes"] + board_of(load_target("nrf52840")).stack_bytes <= 256 * 1024
    assert b["input_read_bytes"] == [stored["input_read_bytes_per_step"]] * 2 and b["max_abs_err"] < 1e-6
    assert b["text_bytes"] <= a["text_bytes"] + 4096  # a read per gathered plane's rows, in place of a copy


def test_an_int8_prefix_quantises_its_patches_as_it_reads_them(tmp_path):
    """mcu_mbv2_40 with its frozen prefix in int8, tiled to fit 65,000 B: the prefix's first op quantises each
    tile's crop of the float batch as it reads it from storage (et_q8_patch_quantize_read), no float batch in RAM;
    the host firmware's int8 boundary bit for bit the integer reference's, the head exact."""
    from edgetrain.compiler.workbench.run_c import run_firmware

    out = tmp_path / "q8"
    r = compile_model(CompileOptions(model="mcu_mbv2_40", target="nrf52840", budget="65000", out=str(out),
                                     batch_size=1, emit="c", time_limit=15.0, quantize_frozen="int8"))
    assert r["tiled"] and r["input_read_bytes_per_step"] >= INPUT_40
    plan = (out / "plan.c").read_text()
    assert "et_q8_patch_quantize_read(x," in plan and "et_q8_patch_quantize(" not in plan
    res = run_firmware(str(out), qemu=False, steps=2, check=True)
    assert res["ok"], res.get("error")
    assert res["int8_boundary_mismatches"] == 0 and not res["mismatched"]
    assert res["input_read_bytes"] == [r["input_read_bytes_per_step"]] * 2
