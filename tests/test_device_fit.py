"""Microcontroller limits: flash_bytes in the profiles, the RAM/flash figures of a firmware, `--budget auto`,
the refusal of a model that cannot fit, and the size check of a real Cortex-M4F build."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

import edgetrain.targets as targets
from edgetrain.codegen.c.device_fit import (STACK_BYTES, FirmwareFigures, check_elf, device_budget, device_fit,
                                            figures_of_firmware, runtime_reserve_bytes)
from edgetrain.compiler.errors import BudgetError, DeviceFitError
from edgetrain.compiler.graph.ir import OptimizerConfig
from edgetrain.compiler.pipeline import CompileOptions, compile_model
from edgetrain.compiler.workbench import cli
from edgetrain.codegen.c.runner import check_size, elf_size
from edgetrain.targets import Target, TargetProfileError, load_target

HAVE_ARM = bool(shutil.which("make") and shutil.which("arm-none-eabi-gcc") and shutil.which("arm-none-eabi-size"))
needs_arm = pytest.mark.skipif(not HAVE_ARM, reason="arm-none-eabi-gcc missing: apt-get install gcc-arm-none-eabi "
                                                    "libnewlib-arm-none-eabi")


# -- profiles --------------------------------------------------------------------------------------------------

def test_mcu_profiles_have_flash():
    assert load_target("nrf52840").flash_bytes == 1024 * 1024 and load_target("nrf52840").ram_bytes == 256 * 1024
    assert load_target("mkr1000").flash_bytes == 256 * 1024
    for name in targets.list_targets():
        t = load_target(name)
        assert (t.flash_bytes is not None) == (t.family == "mcu"), name
        assert ("flash_bytes" in t.to_dict()) == (t.family == "mcu")  # other schedules are as they were
        if t.flash_bytes:
            assert t.sources["flash_bytes"]


def _mcu_profile(tmp_path, drop: str | None = None, flash: str = "1_048_576") -> Path:
    text = (Path(targets.__file__).parent / "profiles" / "nrf52840.toml").read_text()
    text = text.replace('name = "nrf52840"', 'name = "my-mcu"')
    lines = []
    for line in text.splitlines():
        if line.startswith("flash_bytes = 1"):
            line = f"flash_bytes = {flash}"
        if drop and line.startswith(drop):
            continue
        lines.append(line)
    path = tmp_path / "my-mcu.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_loader_validates_flash(tmp_path):
    assert load_target(_mcu_profile(tmp_path)).flash_bytes == 1_048_576
    with pytest.raises(TargetProfileError, match="'flash_bytes' is missing"):
        load_target(_mcu_profile(tmp_path, drop="flash_bytes = 1"))
    with pytest.raises(TargetProfileError, match="sources.flash_bytes"):
        load_target(_mcu_profile(tmp_path, drop='flash_bytes = "'))
    for bad in ("0", "1.5", '"lots"', "-4"):
        with pytest.raises(TargetProfileError, match="flash_bytes"):
            load_target(_mcu_profile(tmp_path, flash=bad))


# -- the figures -----------------------------------------------------------------------------------------------

def test_ram_and_flash_figures():
    nrf = load_target("nrf52840")
    fig = FirmwareFigures(arena_bytes=40_000, trainable_bytes=30_000, optimizer_bytes=30_000, frozen_bytes=500_000,
                          io_bytes=3_000, steps=100)
    fit = device_fit(fig, nrf)
    assert fit.fits and fit.ram_need == 40_000 + 60_000 + runtime_reserve_bytes(3_000)
    assert fit.flash_need == fig.code_bytes + 30_000 + 500_000  # frozen weights stay const in flash
    over = device_fit(FirmwareFigures(arena_bytes=200_000, trainable_bytes=30_000, optimizer_bytes=30_000), nrf)
    assert not over.fits
    for words in ("RAM: needs", "arena 200000 B", "262144 B", "--batch-size", "--train"):
        assert words in over.message
    flash = device_fit(FirmwareFigures(trainable_bytes=1_000, frozen_bytes=2_000_000), nrf)
    assert "Flash: needs" in flash.message and "1048576 B" in flash.message and "RAM" not in flash.message


def test_auto_budget_is_the_ram_less_the_firmware():
    assert device_budget(load_target("nrf52840"), 100) == 262_144 - runtime_reserve_bytes(100)
    assert runtime_reserve_bytes(100) >= STACK_BYTES + 100
    assert device_budget(load_target("rpi4")) is None


# -- compile ---------------------------------------------------------------------------------------------------

def test_a_big_model_is_refused_before_emitting_with_the_ram_figure(tmp_path, capsys):
    out = tmp_path / "o"
    rc = cli.main(["compile", "resnet18", "--target", "nrf52840", "--budget", "1GB", "--emit", "c", "--batch-size",
                   "1", "--out", str(out), "--json"])
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 2 and r["error"]["kind"] == "DeviceFitError"
    msg = r["error"]["message"]
    assert "resnet18" in msg and "RAM: needs" in msg and "262144 B" in msg and "No firmware was written" in msg
    assert "--train" in msg  # what would fit
    assert not out.exists() or not any(out.iterdir())


def test_a_tiny_model_fits_at_the_default_budget(tmp_path):
    r = compile_model(CompileOptions(model="tests.c_models:tiny_cnn", target="nrf52840", budget="auto",
                                     out=str(tmp_path / "o"), batch_size=1, emit="c", time_limit=20.0))
    fit = r["device_fit"]
    assert fit["fits"] and fit["ram_need_bytes"] <= fit["ram_bytes"] == 262_144
    assert r["budget"] == "auto" and r["budget_bytes"] == 262_144 - runtime_reserve_bytes(4 * (36 + 1 + 3))
    assert r["arena_bytes"] + r["state_bytes"] + runtime_reserve_bytes(4 * (36 + 1 + 3)) == fit["ram_need_bytes"]


def test_an_arena_over_the_ram_is_refused(tmp_path):
    with pytest.raises(DeviceFitError, match=r"arena \d+ B .*--batch-size"):
        compile_model(CompileOptions(model="mcu_cnn", target="nrf52840", budget="10MB", out=str(tmp_path / "o"),
                                     batch_size=8, emit="c", scheduler="store-all"))
    assert not (tmp_path / "o" / "plan.c").exists()


def test_a_budget_over_the_boards_linked_ram_is_refused_before_solving(tmp_path):
    # mps2-an386's profile has QEMU's 4 MB, its board's link script the nRF52840's 256 KB: a 1 MB budget
    # would solve, then fail to link; it is refused naming both figures, before any solve.
    with pytest.raises(DeviceFitError, match=r"4194304 B .*link script gives the image 262144 B.*Nothing was solved"):
        compile_model(CompileOptions(model="mcu_cnn", target="mps2-an386", budget="1MB", out=str(tmp_path / "o"),
                                     batch_size=1, emit="c", time_limit=10.0))
    assert not (tmp_path / "o" / "schedule.json").exists()
    r = compile_model(CompileOptions(model="tests.c_models:tiny_cnn", target="mps2-an386", budget="auto",
                                     out=str(tmp_path / "a"), batch_size=1, emit="c", time_limit=10.0))
    assert r["budget_bytes"] == 262_144 - runtime_reserve_bytes(4 * (36 + 1 + 3))  # auto: the linked RAM


WIDE_MLP = """
import torch
from torch import nn


def wide_mlp() -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Flatten(), nn.Linear(192, 400), nn.ReLU(), nn.Linear(400, 10))
    m.input_shape, m.num_classes = (3, 8, 8), 10
    return m
"""


def test_the_fit_holds_the_ram_the_board_links_not_the_profiles(tmp_path):
    # mps2-an386's profile has 4 MB of RAM, its board's link script 256 KB: 300 KB of weights would fit the
    # profile and overflow the link; it is refused before tracing, naming the link script.
    qemu = load_target("mps2-an386")
    fig = FirmwareFigures(trainable_bytes=300_000)
    fit = device_fit(fig, qemu)
    assert fig.ram_bytes < qemu.ram_bytes and not fit.fits and fit.ram_bytes == 262_144
    assert "link script gives the image 262144 B" in fit.message
    assert "over the 262144 B" in check_elf({"text_bytes": 1000, "data_bytes": 300_000, "bss_bytes": 0}, qemu)
    (tmp_path / "wide.py").write_text(WIDE_MLP)  # 77,210 weights: 308,840 B, trained by SGD without momentum
    with pytest.raises(DeviceFitError, match=r"weights and optimizer state alone.*RAM: needs .*link script gives"):
        compile_model(CompileOptions(model=f"{tmp_path / 'wide.py'}:wide_mlp", target="mps2-an386", budget="auto",
                                     out=str(tmp_path / "o"), batch_size=1, emit="c", time_limit=10.0,
                                     optimizer=OptimizerConfig.of("sgd", momentum=0.0)))
    assert not (tmp_path / "o").exists()


def test_auto_budget_needs_a_microcontroller(tmp_path):
    with pytest.raises(BudgetError, match="give --budget"):
        compile_model(CompileOptions(model="tests.c_models:tiny_cnn", target="rpi4", budget="auto",
                                     out=str(tmp_path / "o"), batch_size=1))


# -- the built image -------------------------------------------------------------------------------------------

@needs_arm
def test_size_check_reads_a_real_build(tmp_path):
    out = tmp_path / "fw"
    compile_model(CompileOptions(model="tests.c_models:tiny_cnn", target="nrf52840", budget="100%", out=str(out),
                                 batch_size=1, emit="c", time_limit=20.0))
    subprocess.run(["make", "-s", "-C", str(out), "qemu"], check=True, capture_output=True, timeout=600)
    sizes = elf_size(str(out / "build" / "m4f" / "fw.elf"))
    assert sizes["text_bytes"] > 1000 and sizes["data_bytes"] > 0 and sizes["bss_bytes"] > 0
    nrf = load_target("nrf52840")
    assert check_elf(sizes, nrf) is None
    _estimate_is_conservative(out, sizes)
    check_size(sizes, json.loads((out / "schedule.json").read_text())["target"])  # fits: no error
    ram = sizes["data_bytes"] + sizes["bss_bytes"] + STACK_BYTES
    small = Target(**{**nrf.to_dict(), "ram_bytes": ram - 1, "flash_bytes": sizes["text_bytes"]})
    msg = check_elf(sizes, small)
    assert f"= {ram} B, over the {ram - 1} B" in msg and "flash: .text" in msg
    with pytest.raises(DeviceFitError, match="does not fit"):
        check_size(sizes, {k: v for k, v in small.to_dict().items()})


def _estimate_is_conservative(out: Path, sizes: dict) -> None:
    """The flash the plan's figures estimate (code at CODE_BASE_BYTES + CODE_PER_STEP_BYTES a step) is at least
    the build's .text + .data, and over it by no more than 12 KB (measured: 1.2 KB tiny_cnn, 8.6 KB mcu_mobilenetv3)."""
    schedule = json.loads((out / "schedule.json").read_text())
    fig = figures_of_firmware(schedule, json.loads((out / "firmware.json").read_text()))
    built = sizes["text_bytes"] + sizes["data_bytes"]
    assert built <= fig.flash_bytes <= built + 12 * 1024, (fig.steps, fig.code_bytes, built, fig.flash_bytes)


@pytest.mark.slow
@needs_arm
def test_the_code_size_estimate_holds_a_mobilenet_build(tmp_path):
    # 194 schedule steps, squeeze-excitation and hardswish kernels, frozen weights const in flash
    out = tmp_path / "fw"
    compile_model(CompileOptions(model="mcu_mobilenetv3", target="mps2-an386", budget="auto", out=str(out),
                                 batch_size=1, emit="c", time_limit=15.0))
    subprocess.run(["make", "-s", "-C", str(out), "qemu"], check=True, capture_output=True, timeout=600)
    _estimate_is_conservative(out, elf_size(str(out / "build" / "m4f" / "fw.elf")))
