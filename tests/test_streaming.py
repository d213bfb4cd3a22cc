"""Frozen weights beyond flash, streamed from storage (Cortex-M C backend): the rule that picks them, the graph
and schedule that count them (workspace of every reader, page-in time, energy and bytes), the firmware that
pages them in from CRC-checked blocks, the refusals, and (slow) 5 training steps under QEMU with the nRF52840's
memory enforced by the linker script, exact against PyTorch trained with the same frozen set."""
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
from edgetrain.compiler.errors import DeviceFitError
from edgetrain.compiler.graph.streaming import choose_streamed
from edgetrain.compiler.pipeline import CompileOptions, compile_model
from edgetrain.compiler.workbench import cli
from edgetrain.runtime.python.integrity import IntegrityError
from edgetrain.targets import load_target

HAVE_ARM = bool(shutil.which("arm-none-eabi-gcc") and shutil.which("qemu-system-arm") and shutil.which("make"))
RAM, FLASH = 256 * 1024, 1024 * 1024
WEIGHT = 196 * 196 * 4  # one frozen Linear(196, 196) weight of mcu_wide_mlp


# -- the rule ----------------------------------------------------------------------------------------------------

def test_largest_frozen_weights_go_to_storage_until_the_rest_fits():
    frozen = {"a": 100, "b": 400, "c": 400, "d": 50}
    assert choose_streamed(frozen, flash_room=950, ram_room=1000, storage_bytes=10**9) == []
    assert choose_streamed(frozen, flash_room=900, ram_room=1000, storage_bytes=10**9) == ["b"]  # earlier on ties
    assert choose_streamed(frozen, flash_room=500, ram_room=1000, storage_bytes=10**9) == ["b", "c"]
    # A weight is paged into RAM whole: one larger than the RAM left cannot be streamed.
    assert choose_streamed(frozen, flash_room=850, ram_room=399, storage_bytes=10**9) == ["a"]
    assert choose_streamed(frozen, flash_room=800, ram_room=399, storage_bytes=10**9) == ["a", "d"]


def test_weights_that_cannot_be_streamed_are_refused_with_the_figures():
    with pytest.raises(DeviceFitError, match=r"only 300 B of RAM .*`b`, has 400 B"):
        choose_streamed({"a": 100, "b": 400}, flash_room=200, ram_room=300, storage_bytes=10**9, device="chip")
    with pytest.raises(DeviceFitError, match=r"400 B of frozen weights must be streamed .*chip has no storage"):
        choose_streamed({"a": 100, "b": 400}, flash_room=200, ram_room=1000, storage_bytes=0, device="chip")


def test_a_device_without_storage_refuses_the_model_before_tracing(tmp_path):
    text = (Path(targets.__file__).parent / "profiles" / "nrf52840.toml").read_text()
    text = text.replace('name = "nrf52840"', 'name = "no-sd"').replace("storage_bytes = 32_000_000_000",
                                                                       "storage_bytes = 0")
    profile = tmp_path / "no-sd.toml"
    profile.write_text(text)
    assert load_target(profile).storage_bytes == 0
    out = tmp_path / "o"
    with pytest.raises(DeviceFitError, match=r"no-sd has no storage .*storage_bytes"):
        compile_model(CompileOptions(model="mcu_wide_mlp", target=str(profile), budget="auto", out=str(out),
                                     batch_size=1, emit="c"))
    assert not out.exists() or not any(out.iterdir())


# -- compile -----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    out = tmp_path_factory.mktemp("stream") / "fw"
    c = compile_model(CompileOptions(model="mcu_wide_mlp", target="nrf52840", budget="auto", out=str(out),
                                     batch_size=1, emit="c", time_limit=20.0))
    return out, c


def test_streamed_weights_are_counted_by_the_schedule(wide):
    out, c = wide
    body = json.loads((out / "schedule.json").read_text())
    g = body["graph"]
    assert c["frozen_bytes"] == 1_235_584 > FLASH  # float32 weights beyond the chip's flash
    readers: dict[str, list[str]] = {}
    for n in g["nodes"]:
        for p in n.get("streamed", ()):
            readers.setdefault(p, []).append(n["op"])
        # What a node pages in is its workspace: the schedule holds it in RAM while the node runs.
        assert n["workspace_bytes"] == WEIGHT * len(n.get("streamed", ()))
    assert list(readers) == ["body.1.weight", "body.3.weight"]  # just enough to fit the flash
    for p, ops in readers.items():  # its forward and its input-gradient backward (the stem trains)
        assert ops == ["aten.addmm.default", "aten.mm.default"], p
    target = load_target("nrf52840")
    reads = sum(len(v) for v in readers.values())
    assert body["predicted"]["paged_bytes"] == c["paged_bytes_per_step"] == reads * WEIGHT == 614_656
    assert body["predicted"]["paging_time_s"] == pytest.approx(reads * target.page_in_time_s(WEIGHT), rel=1e-12)
    assert c["arena_bytes"] >= WEIGHT and c["peak_bytes"] <= c["budget_bytes"]
    fit = c["device_fit"]
    assert fit["fits"] and fit["flash_need_bytes"] <= FLASH and fit["ram_need_bytes"] <= RAM


def test_the_firmware_pages_streamed_weights_from_crc_checked_blocks(wide):
    out, c = wide
    man = json.loads((out / "firmware.json").read_text())
    plan = (out / "plan.c").read_text()
    w = load_file(str(out / "weights.safetensors"))
    assert man["streamed_bytes"] == 2 * WEIGHT and man["storage_dir"] == "storage"
    for s in man["streamed"]:
        raw = (out / s["file"]).read_bytes()
        magic, page, size, crc = struct.unpack_from("<4I", raw)
        assert (magic, page, size) == (0x47505445, s["page"], WEIGHT) and len(raw) == 16 + WEIGHT
        assert zlib.crc32(raw[16:], zlib.crc32(raw[:12])) == crc  # runtime/c/storage_block.c's check
        assert (np.frombuffer(raw, dtype="<f4", offset=16) == w[f"param/{s['param']}"].reshape(-1)).all()
        # No array in flash; a page-in before each of its readers, in training (2) and inference (1).
        assert f"/* {s['param']}: [" not in plan
        calls = re.findall(rf"ET_TRY\(et_page_in\({s['page']}u, ET_F\((\d+)\), {WEIGHT}u\)\);", plan)
        assert len(calls) == 3, s["param"]
    frozen_in_flash = re.findall(r"frozen: const, kept in flash \*/", plan)
    assert len(frozen_in_flash) == 16 - 2  # 8 weights and 8 biases, less the two streamed weights


def test_a_changed_storage_block_is_refused_before_running(wide, tmp_path):
    out, _ = wide
    copy = tmp_path / "fw"
    shutil.copytree(out, copy)
    block = copy / json.loads((copy / "firmware.json").read_text())["streamed"][0]["file"]
    raw = bytearray(block.read_bytes())
    raw[100] ^= 1
    block.write_bytes(bytes(raw))
    with pytest.raises(IntegrityError, match=re.escape(str(block))):
        from edgetrain.codegen.c.runner import verified_firmware

        verified_firmware(str(copy))


# -- the MILP's choice ----------------------------------------------------------------------------------------

class ReadOnceOrTwice(nn.Module):
    """Frozen `pre` Linear(784, 40) (read by its forward alone: nothing before it trains), a trainable
    Linear(40, 40), frozen `post` Linear(40, 800) (the larger, read by its forward and its input-gradient
    backward) and a trainable Linear(800, 10) classifier; ReLU between."""

    def __init__(self) -> None:
        super().__init__()
        self.pre, self.mid, self.post, self.head = (nn.Linear(784, 40), nn.Linear(40, 40), nn.Linear(40, 800),
                                                    nn.Linear(800, 10))
        for p in (*self.pre.parameters(), *self.post.parameters()):
            p.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.pre(torch.flatten(x, 1)))
        return self.head(torch.relu(self.post(torch.relu(self.mid(x)))))


def read_once_or_twice() -> nn.Module:
    torch.manual_seed(0)
    return ReadOnceOrTwice()


read_once_or_twice.input_shape = (1, 28, 28)  # type: ignore[attr-defined]
read_once_or_twice.num_classes = 10  # type: ignore[attr-defined]


def test_the_milp_streams_the_weight_read_once_where_the_rule_takes_the_largest(tmp_path):
    text = (Path(targets.__file__).parent / "profiles" / "nrf52840.toml").read_text()
    profile = tmp_path / "small-flash.toml"  # room in flash for one of the two frozen weights
    profile.write_text(text.replace('name = "nrf52840"', 'name = "small-flash"').replace(
        "flash_bytes = 1_048_576", "flash_bytes = 260_000"))
    out = tmp_path / "fw"
    c = compile_model(CompileOptions(model="tests.test_streaming:read_once_or_twice", target=str(profile),
                                     budget="auto", out=str(out), batch_size=1, emit="c", time_limit=20.0))
    s = c["streaming"]
    assert s["rule"] == ["post.weight"] and s["milp"] == ["pre.weight"] == c["streamed"]
    assert s["objective_j"] < s["rule_objective_j"]  # one page-in a step instead of two larger ones
    assert s["kept"] == "milp" and s["skipped"] is None and s["seconds"] <= s["share_s"] + 2.0  # a solve's overrun
    assert c["paged_bytes_per_step"] == 784 * 40 * 4
    body = json.loads((out / "schedule.json").read_text())
    readers = [n["op"] for n in body["graph"]["nodes"] if n.get("streamed")]
    assert readers == ["aten.addmm.default"]
    assert c["device_fit"]["fits"] and c["peak_bytes"] <= c["budget_bytes"]


# -- QEMU --------------------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.skipif(not HAVE_ARM, reason="arm-none-eabi-gcc / qemu-system-arm missing: apt-get install "
                    "gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm")
def test_streamed_model_trains_like_pytorch_under_qemu(wide, capsys):
    from edgetrain.compiler.workbench.data import FASHION_MNIST_DIR

    if not FASHION_MNIST_DIR.is_dir():
        pytest.skip(f"Fashion-MNIST not installed in {FASHION_MNIST_DIR} (apt-get install dataset-fashion-mnist)")
    out, c = wide
    rc = cli.main(["run", str(out), "--qemu", "--steps", "5", "--data", "fashion-mnist", "--check", "--json"])
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and r["ok"], r.get("error")
    assert r["steps_done"] == 5 and not r["mismatched"]  # every parameter, streamed ones from the medium
    assert r["losses"] == pytest.approx(r["reference_losses"], rel=1e-5)
    assert r["paged_bytes_per_step"] == c["paged_bytes_per_step"] == 614_656  # as the firmware counted them
    assert r["ram_bytes"] == r["data_bytes"] + r["bss_bytes"] <= RAM
    assert r["text_bytes"] + r["data_bytes"] <= FLASH
    assert r["arena_bytes"] <= r["budget_bytes"]
