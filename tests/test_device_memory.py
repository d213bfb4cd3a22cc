"""Every target is held against its memory: a budget above it is refused before tracing, a model whose fixed
state or smallest feasible budget exceeds it is refused before any solve, with one clear error (JSON under
--json) giving the sizes and the fix."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

import edgetrain.targets as targets
from edgetrain.compiler.scheduling.budget import device_memory_bytes
from edgetrain.compiler.workbench.cli import main
from edgetrain.targets import load_target


def _json_error(capsys, *args) -> dict:
    rc = main([str(a) for a in args] + ["--json"])
    out = capsys.readouterr()
    assert rc == 2, out
    assert "Traceback" not in out.err
    obj = json.loads(out.out)
    assert obj["ok"] is False
    return obj["error"]


def _rpi_with_ram(tmp_path: Path, ram_bytes: int) -> Path:
    """The rpi4 profile with another RAM size (every other figure as cited)."""
    text = (Path(targets.__file__).parent / "profiles" / "rpi4.toml").read_text()
    text = re.sub(r"(?m)^ram_bytes = .*$", f"ram_bytes = {ram_bytes}", text, count=1)  # the figure, not its source
    text = text.replace('name = "rpi4"', 'name = "rpi4-small"')
    path = tmp_path / "rpi4-small.toml"
    path.write_text(text)
    return path


def test_every_profile_has_its_memory():
    for name in targets.list_targets():
        t = load_target(name)
        assert t.ram_bytes > 0 and t.sources["ram_bytes"], name
        assert device_memory_bytes(t) == (None if t.family == "mcu" else t.ram_bytes), name  # MCUs: device_fit.py
    assert load_target("rpi4").ram_bytes == 2 * 2**30 and load_target("jetson-nano").ram_bytes == 4 * 2**30


def test_a_budget_above_the_device_is_refused_before_tracing(capsys, tmp_path):
    t0 = time.perf_counter()
    err = _json_error(capsys, "compile", "resnet18", "--target", "rpi4", "--budget", "4.8GB", "--out",
                      tmp_path / "o")
    assert time.perf_counter() - t0 < 5  # no trace of ResNet-18 happened
    assert err["kind"] == "DeviceFitError"
    assert "4800000000 B" in err["message"] and "2147483648 B" in err["message"] and "rpi4" in err["message"]
    assert "--budget 2147MB or less" in err["message"]
    assert not (tmp_path / "o").exists()
    err = _json_error(capsys, "compile", "small_cnn", "--target", "host", "--budget", "100000GB", "--out", tmp_path / "o")
    assert err["kind"] == "DeviceFitError" and "host's memory" in err["message"]


def test_a_percentage_above_the_device_is_refused_with_the_largest_that_fits(capsys, tmp_path):
    # small_cnn at batch 2 on rpi4: store-all 0.652 MB; a 0.8 MB device takes up to ~122%.
    err = _json_error(capsys, "compile", "small_cnn", "--target", _rpi_with_ram(tmp_path, 800_000), "--budget", "300%",
                      "--batch-size", "2", "--out", tmp_path / "o")
    assert err["kind"] == "DeviceFitError"
    assert "budget 300% = " in err["message"] and "800000 B" in err["message"]
    assert re.search(r"\(12\d\.\d% of plain backprop's peak", err["message"]), err["message"]


def test_a_model_whose_fixed_state_exceeds_the_device_is_refused(capsys, tmp_path):
    # small_cnn's weights (17.5 kB), momentum and buffers: ~35 kB; a 30 kB device cannot hold them.
    err = _json_error(capsys, "compile", "small_cnn", "--target", _rpi_with_ram(tmp_path, 30_000), "--budget", "min",
                      "--batch-size", "2", "--out", tmp_path / "o")
    assert err["kind"] == "DeviceFitError"
    m = err["message"]
    assert "fixed state" in m and "weights" in m and "optimizer state" in m and "30000 B" in m and "--train" in m


def test_a_model_whose_smallest_budget_exceeds_the_device_is_refused(capsys, tmp_path):
    # small_cnn at batch 2 on rpi4: fixed state ~0.35 MB with the kernel scratch, smallest feasible 0.502 MB.
    err = _json_error(capsys, "compile", "small_cnn", "--target", _rpi_with_ram(tmp_path, 450_000), "--budget", "min",
                      "--batch-size", "2", "--out", tmp_path / "o")
    assert err["kind"] == "DeviceFitError"
    m = err["message"]
    assert "needs at least" in m and "450000 B" in m and "--batch-size" in m
