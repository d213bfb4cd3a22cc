"""int8 tensors through storage in C firmware (compile --quantize-frozen int8): a frozen int8 weight streamed from
the page store where flash does not hold it (its integer bytes in the store, the requantisation tables left in
flash), an int8 activation paged out and in under a tight budget, both run bit for bit against the Python integer
reference on the host and (slow) under QEMU; a store that holds float32 bytes where int8 ones are due is refused."""
from __future__ import annotations

import json
import re
import shutil
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file
from torch import nn

import edgetrain.targets as targets
from edgetrain.codegen.c.device_fit import figures_of_firmware
from edgetrain.codegen.c.firmware import _Emitter
from edgetrain.codegen.c.flash_data import write_storage
from edgetrain.codegen.c.ops import CodegenError
from edgetrain.codegen.c.runner import load_firmware, run_program, verified_firmware
from edgetrain.compiler.graph.quantize import conv_integers
from edgetrain.compiler.pipeline import CompileOptions, compile_model
from edgetrain.compiler.workbench.run import schedule_batches
from edgetrain.compiler.workbench.run_c import run_firmware
from edgetrain.runtime.python.integrity import IntegrityError

HAVE_HOST = bool(shutil.which("gcc") and shutil.which("make"))
HAVE_ARM = bool(HAVE_HOST and shutil.which("arm-none-eabi-gcc") and shutil.which("qemu-system-arm"))
needs_host = pytest.mark.skipif(not HAVE_HOST, reason="gcc and make are needed to build the firmware")
needs_arm = pytest.mark.skipif(not HAVE_ARM, reason="arm-none-eabi-gcc / qemu-system-arm missing")

SMALL_FLASH = 80_000  # a chip whose flash holds the code and all frozen weights but the widest
WIDE = "backbone.4.weight"  # that weight: 64x64x3x3, 36,864 B in int8
WIDE_BYTES = 64 * 64 * 9
BOUNDARY_BYTES = 2 * 8 * 16 * 16  # the prefix's int8 output at batch 2


class FrozenBackbone(nn.Module):
    """A frozen backbone the int8 prefix takes whole (3x3 convolutions with ReLU/ReLU6, a 1x1 one last), a float head
    of two trained 3x3 convolutions, a mean over the pixels and a trained classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 64, 3, padding=1),
                                      nn.ReLU6(), nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 8, 1))
        self.head = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1),
                                  nn.ReLU())
        self.fc = nn.Linear(16, 10)
        for p in self.backbone.parameters():
            p.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.head(self.backbone(x)).mean((2, 3)))


def frozen_backbone() -> nn.Module:
    torch.manual_seed(0)
    return FrozenBackbone()


frozen_backbone.input_shape = (3, 16, 16)  # type: ignore[attr-defined]
frozen_backbone.num_classes = 10  # type: ignore[attr-defined]


def _compile(out: Path, target: str, budget: str) -> dict:
    return compile_model(CompileOptions(model="tests.test_q8_store:frozen_backbone", target=target, budget=budget,
                                        out=str(out), batch_size=2, emit="c", time_limit=20.0,
                                        quantize_frozen="int8"))


def _flash_profile(root: Path, flash: int) -> str:
    """The nRF52840's profile with `flash` bytes of flash."""
    text = (Path(targets.__file__).parent / "profiles" / "nrf52840.toml").read_text()
    profile = root / "small-flash.toml"
    profile.write_text(text.replace('name = "nrf52840"', 'name = "small-flash"').replace(
        "flash_bytes = 1_048_576", f"flash_bytes = {flash}"))
    return str(profile)


@pytest.fixture(scope="module")
def streamed(tmp_path_factory):
    """Compiled for an nRF52840 with 80,000 B of flash: the widest int8 weight goes to storage."""
    root = tmp_path_factory.mktemp("q8stream")
    return root / "fw", _compile(root / "fw", _flash_profile(root, SMALL_FLASH), "auto")


@pytest.fixture(scope="module")
def paged(tmp_path_factory):
    """Compiled for the nRF52840 at the smallest feasible budget: the solver pages the int8 boundary out and in."""
    out = tmp_path_factory.mktemp("q8page") / "fw"
    return out, _compile(out, "nrf52840", "min")


def _schedule(out: Path) -> dict:
    return json.loads((out / "schedule.json").read_text())


def _reader(body: dict, param: str) -> dict:
    return next(n for n in body["graph"]["nodes"] if param in n.get("streamed", ()))


# -- streaming ---------------------------------------------------------------------------------------------------

def test_the_widest_int8_weight_is_streamed_at_its_int8_size(streamed):
    out, c = streamed
    body = _schedule(out)
    assert c["streamed"] == [WIDE] and body["graph"]["params"][WIDE]["dtype"] == "int8"
    reader = _reader(body, WIDE)
    assert reader["op"] == "edgetrain.q8_conv2d.default"
    scratch = 2 * (2 * 64 * 9 + (64 * 9 + 4) // 2)  # q8_conv2d.c's int16 scratch for a 64x3x3 window
    assert reader["workspace_bytes"] == scratch + WIDE_BYTES  # the weight counted in RAM at one byte an element
    assert c["paged_bytes_per_step"] == WIDE_BYTES  # its page-in each step, priced at its int8 size
    assert c["device_fit"]["fits"] and c["device_fit"]["flash_need_bytes"] <= SMALL_FLASH


def test_the_store_holds_the_integers_of_the_const_arrays_and_the_tables_stay_in_flash(streamed):
    out, _ = streamed
    body, manifest = _schedule(out), json.loads((out / "firmware.json").read_text())
    [block] = manifest["streamed"]
    assert (block["param"], block["dtype"], block["bytes"]) == (WIDE, "int8", WIDE_BYTES)
    raw = (out / block["file"]).read_bytes()
    magic, page, size, crc = struct.unpack_from("<4I", raw)
    assert (magic, page, size, len(raw)) == (0x47505445, block["page"], WIDE_BYTES, 16 + WIDE_BYTES)
    assert zlib.crc32(raw[16:], zlib.crc32(raw[:12])) == crc  # runtime/c/storage_block.c's check
    q8 = _reader(body, WIDE)["attrs"]["q8"]
    floats = {k[len("param/"):]: v for k, v in load_file(str(out / "weights.safetensors")).items()}
    want = conv_integers(q8, floats)[WIDE]
    assert np.array_equal(np.frombuffer(raw, dtype=np.int8, offset=16).reshape(want.shape), want)
    assert np.abs(want).max() > 1  # real integers, not a degenerate weight
    plan = (out / "plan.c").read_text()
    ident = "p_" + WIDE.replace(".", "_")
    assert f"{ident}[" not in plan  # no array in flash: paged into the arena before each reader
    assert "static const int32_t p_backbone_4_bias[" in plan  # its bias and requantisation stay const
    assert f"static const et_q8_requant q_{_reader(body, WIDE)['name']} =" in plan
    calls = re.findall(rf"ET_TRY\(et_page_in\({block['page']}u, ET_F\((\d+)\), {WIDE_BYTES}u\)\);", plan)
    assert len(calls) == 3  # training, inference, and the prefix's boundary for the check
    for off in calls:  # the kernel reads the bytes where they were paged in, as int8
        assert re.search(rf"et_q8_conv2d_forward\(&\w+, ET_Q\(\d+\), -?\d+, ET_Q\({off}\), p_backbone_4_bias,", plan)


def test_float_values_for_an_int8_store_are_refused_when_it_is_written(streamed, tmp_path):
    out, _ = streamed
    body = _schedule(out)
    em = _Emitter(body)
    floats = {k[len("param/"):]: v.reshape(-1) for k, v in load_file(str(out / "weights.safetensors")).items()}
    with pytest.raises(CodegenError, match=rf"`{re.escape(WIDE)}` is int8 in the schedule, but its values are not"):
        write_storage(str(tmp_path), em, floats)  # the float weights, not q8_integers' values


@needs_host
def test_the_host_firmware_streams_it_and_matches_the_integer_reference_bit_for_bit(streamed):
    out, _ = streamed
    r = run_firmware(str(out), qemu=False, steps=2, check=True)
    assert r["ok"], r.get("error")
    assert r["int8_boundary_mismatches"] == 0 and r["int8_boundary_floats"] == BOUNDARY_BYTES
    assert r["paged_bytes_per_step"] == r["predicted_paged_bytes_per_step"] == WIDE_BYTES
    assert not r["mismatched"]


@needs_host
def test_an_int32_bias_streamed_too_is_read_as_int32_bit_for_bit(tmp_path):
    """59,456 B of flash: all four int8 weights and one int32 bias streamed (the host build runs it; the flash
    estimate, the int8 kernels' code included, is at or above the M4F build's, which the slow test holds)."""
    out = tmp_path / "fw"
    c = _compile(out, _flash_profile(tmp_path, 59_456), "auto")
    body, manifest = _schedule(out), json.loads((out / "firmware.json").read_text())
    bias = next(b for b in manifest["streamed"] if b["dtype"] == "int32")
    assert bias["param"] == "backbone.2.bias" and bias["bytes"] == 64 * 4 and len(c["streamed"]) == 5
    q8 = _reader(body, bias["param"])["attrs"]["q8"]
    floats = {k[len("param/"):]: v for k, v in load_file(str(out / "weights.safetensors")).items()}
    raw = (out / bias["file"]).read_bytes()
    assert np.array_equal(np.frombuffer(raw, dtype="<i4", offset=16), conv_integers(q8, floats)[bias["param"]])
    assert re.search(r"et_q8_conv2d_forward\(&\w+, ET_Q\(\d+\), -?\d+, ET_Q\(\d+\), ET_I\(\d+\), &q_",
                     (out / "plan.c").read_text())
    r = run_firmware(str(out), qemu=False, steps=2, check=True)
    assert r["ok"], r.get("error")
    assert r["int8_boundary_mismatches"] == 0 and r["paged_bytes_per_step"] == r["predicted_paged_bytes_per_step"]


@needs_host
def test_a_store_written_as_float32_is_refused(streamed, tmp_path):
    """The block rewritten with the weight's float32 bytes (a well-formed block of its page, CRC and all): the
    folder check names the file, and the firmware run without that check stops the step at the page-in."""
    out, _ = streamed
    copy = tmp_path / "fw"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns("build", "run-*"))
    manifest = json.loads((copy / "firmware.json").read_text())
    [block] = manifest["streamed"]
    payload = load_file(str(copy / "weights.safetensors"))[f"param/{WIDE}"].astype("<f4").tobytes()
    head = struct.pack("<3I", 0x47505445, block["page"], len(payload))
    (copy / block["file"]).write_bytes(head + struct.pack("<I", zlib.crc32(payload, zlib.crc32(head))) + payload)
    with pytest.raises(IntegrityError, match=re.escape(block["file"])):
        verified_firmware(str(copy))
    body, manifest = load_firmware(str(copy))
    ran = run_program(str(copy), body, manifest, schedule_batches(body, "random", 1, 1), qemu=False)
    assert ran.result is not None and ran.result["status"] == -5  # ET_ERR_FORMAT: a block of another size
    assert ran.result["steps_done"] == 0


# -- paging --------------------------------------------------------------------------------------------------------

def test_the_solver_pages_the_int8_boundary_out_and_in_at_its_bytes(paged):
    out, c = paged
    body = _schedule(out)
    nodes = {n["name"]: n for n in body["graph"]["nodes"]}
    moved = [(s["action"], s["tensor"]) for s in body["steps"] if s["action"] in ("page_out", "page_in")
             and nodes[s["tensor"]]["dtype"] == "int8"]
    assert moved and {a for a, _ in moved} == {"page_out", "page_in"}
    name = moved[0][1]
    manifest = json.loads((out / "firmware.json").read_text())
    [page] = [p for p in manifest["pages"] if p["tensor"] == name]
    assert page["bytes"] == BOUNDARY_BYTES and page["paged_in"]
    plan = (out / "plan.c").read_text()
    assert re.search(rf"et_page_out\({page['id']}u, ET_F\(\d+\), {BOUNDARY_BYTES}u\)", plan)
    assert re.search(rf"et_page_in\({page['id']}u, ET_F\(\d+\), {BOUNDARY_BYTES}u\)", plan)
    # the ledger: the firmware's live bytes are the schedule's prediction (render refuses otherwise)
    assert manifest["activation_peak_bytes"] == body["predicted"]["peak_bytes"] - manifest["state_bytes"]
    assert c["peak_bytes"] <= c["budget_bytes"]


@needs_host
def test_the_host_firmware_pages_it_and_matches_the_integer_reference_bit_for_bit(paged):
    out, _ = paged
    r = run_firmware(str(out), qemu=False, steps=2, check=True)
    assert r["ok"], r.get("error")
    assert r["int8_boundary_mismatches"] == 0 and not r["mismatched"]
    assert r["paged_bytes_per_step"] == r["predicted_paged_bytes_per_step"] >= 2 * BOUNDARY_BYTES


@needs_arm
@pytest.mark.slow
def test_under_qemu_streaming_and_paging_match_the_reference_bit_for_bit(streamed, paged):
    """The M4F build, its SMLAD kernels reading the streamed weight and the paged boundary: the same bits."""
    for (out, _), flash in ((streamed, SMALL_FLASH), (paged, 1 << 20)):
        r = run_firmware(str(out), qemu=True, steps=2, check=True)
        assert r["ok"], r.get("error")
        assert r["int8_boundary_mismatches"] == 0 and not r["mismatched"]
        assert r["paged_bytes_per_step"] == r["predicted_paged_bytes_per_step"]
        assert r["flash_bytes"] <= flash and r["ram_bytes"] < 256 << 10
        # the compile's flash estimate, the int8 kernels' code included, at or above the build (5.5 KB under without)
        schedule = json.loads((out / "schedule.json").read_text())
        fig = figures_of_firmware(schedule, json.loads((out / "firmware.json").read_text()))
        assert fig.int8_code_bytes and r["flash_bytes"] <= fig.flash_bytes <= r["flash_bytes"] + 12 * 1024, (fig, r["flash_bytes"])
