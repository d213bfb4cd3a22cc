"""Frozen weights larger than the RAM left, paged in from storage by blocks of output channels: the rule takes
them, the graph counts one block as the reader's workspace and a page-in per block, the firmware keeps one
CRC-checked page per block, and (slow) the C firmware trains exactly under QEMU on the nRF52840's memory."""
from __future__ import annotations

import json
import shutil

import pytest

from edgetrain.compiler.graph.streaming import block_rows, choose_streamed
from edgetrain.compiler.pipeline import CompileOptions, build_graph, compile_model
from edgetrain.compiler.workbench import cli
from edgetrain.targets import load_target

HAVE_ARM = bool(shutil.which("arm-none-eabi-gcc") and shutil.which("qemu-system-arm") and shutil.which("make"))
RAM, FLASH = 256 * 1024, 1024 * 1024
MODEL, SHAPE = "tests.c_models:frozen_wide_head", (16, 2, 2)
WIDE = 1024 * 320 * 4  # wide.weight: 1,310,720 B, more than the flash and the RAM


def _opts(out: str, **kw) -> CompileOptions:
    return CompileOptions(model=MODEL, input_shape=SHAPE, target="nrf52840", budget="auto", out=out, batch_size=2,
                          emit="c", time_limit=10.0, **kw)


def test_a_weight_over_the_ram_is_streamed_when_its_rows_fit():
    frozen = {"small": 100, "big": 5000}
    with pytest.raises(Exception, match="paged into RAM whole"):
        choose_streamed(frozen, flash_room=1000, ram_room=1000, storage_bytes=10**9)
    assert choose_streamed(frozen, flash_room=1000, ram_room=1000, storage_bytes=10**9, sliceable={"big": 50}) == ["big"]
    assert block_rows(50, 100, 1000) == 10 and block_rows(50, 4, 1000) == 4 and block_rows(900, 4, 1000) == 1


def test_the_graph_holds_one_block_and_pays_a_page_in_per_block():
    g = build_graph(_opts("unused"), load_target("nrf52840"))[2]
    (reader,) = [n for n in g.nodes if "wide.weight" in n.streamed]
    rows = reader.attrs["stream_rows"]["wide.weight"]
    blocks = -(-320 // rows)
    assert 1 < blocks and reader.workspace_bytes == rows * 1024 * 4 < RAM // 2
    t = load_target("nrf52840")
    whole = t.page_in_time_s(WIDE)
    assert reader.time_s == pytest.approx(t.compute_time_s(reader.flops) + whole + (blocks - 1) * t.page_in_latency_s)


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_ARM, reason="arm-none-eabi-gcc / qemu-system-arm missing")
def test_the_firmware_pages_the_weight_block_by_block_and_trains_exactly(tmp_path, capsys):
    out = tmp_path / "c"
    r = compile_model(_opts(str(out)))
    assert r["streamed"] == ["wide.weight"] and r["streamed_bytes"] == WIDE
    manifest = json.loads((out / "firmware.json").read_text())
    blocks = [w for w in manifest["streamed"] if w["param"] == "wide.weight"]
    assert len(blocks) > 1 and sum(w["bytes"] for w in blocks) == WIDE
    assert [w["rows"][0] for w in blocks] == sorted(w["rows"][0] for w in blocks) and blocks[-1]["rows"][1] == 320
    rc = cli.main(["run", str(out), "--qemu", "--steps", "2", "--check", "--json"])
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # the check compares every parameter, the streamed weight read back from its CRC-checked blocks included
    assert rc == 0 and res["ok"] and not res["mismatched"], res
    assert res["paged_bytes_per_step"] == WIDE  # each step reads the weight once, block by block
    assert res["text_bytes"] + res["data_bytes"] <= FLASH and res["ram_bytes"] < RAM
