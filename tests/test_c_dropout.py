"""Dropout in the C runtime: a counter-based mask (runtime/c/kernels/dropout.h) that the firmware redraws in
the backward and on every recompute, and that the exactness reference draws too (compiler/frontend/
dropout_mask.py).

The kernel is held bit for bit against the numpy mirror and against torch's native_dropout_backward with that
mask; a tiny CNN with two nn.Dropout modules compiles with --emit c at store-all and at a budget where the
schedule recomputes a dropout's output, and trains exactly on the host build (and, `slow`, bit-identically
under QEMU). A check whose reference draws another mask fails. F.dropout, keyed by the module that calls it, trains
exactly too.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from edgetrain.compiler.errors import UnsupportedModelError
from edgetrain.compiler.frontend import dropout_mask
from edgetrain.compiler.pipeline import CompileOptions, compile_model
from edgetrain.compiler.workbench.run_c import run_firmware

from test_c_kernels import _error_table, empty, f32, fp, lib, lib_path, record  # noqa: F401 - fixtures

HAVE_HOST = bool(shutil.which("gcc") and shutil.which("make"))
HAVE_ARM = bool(HAVE_HOST and shutil.which("arm-none-eabi-gcc") and shutil.which("qemu-system-arm"))
needs_host = pytest.mark.skipif(not HAVE_HOST, reason="gcc and make are needed to build the firmware")
needs_arm = pytest.mark.skipif(not HAVE_ARM, reason="arm-none-eabi-gcc / qemu-system-arm missing: apt-get install "
                                                    "gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm")
MODEL = "tests.c_models:tiny_dropout_cnn"


def _compile(out, budget: str, model: str = MODEL) -> dict:
    return compile_model(CompileOptions(model=model, target="nrf52840", budget=budget, out=str(out), batch_size=2,
                                        emit="c", time_limit=20.0))


# -- the kernel against its mirror --------------------------------------------------------------------------

@pytest.mark.parametrize("seed, step, key, p", [(0, 0, "drop1", 0.25), (7, 3, "blocks.0.drop", 0.5),
                                                (0xFFFFFFFF, 1 << 31, "d#2", 0.1), (1, 2, "x", 0.0), (1, 2, "x", 1.0)])
def test_kernel_draws_the_references_mask_bit_for_bit(lib, seed, step, key, p):
    n = 4099
    rng = np.random.default_rng(step)
    x, gy = f32(rng.standard_normal(n)), f32(rng.standard_normal(n))
    keep = dropout_mask.keep_mask(seed, step, key, p, n)
    stream = lib.et_dropout_stream(seed & 0xFFFFFFFF, step, dropout_mask.key_hash(key))
    assert stream == dropout_mask.stream(seed, step, key)
    thr, scale = dropout_mask.threshold(p), dropout_mask.scale(p)
    assert [bool(lib.et_dropout_keep(stream, i, thr)) for i in range(64)] == keep[:64].tolist()
    y, gx = empty(n), empty(n)
    lib.et_dropout_forward(n, fp(x), stream, thr, scale, fp(y))
    lib.et_dropout_backward(n, fp(gy), stream, thr, scale, fp(gx))
    mask = torch.from_numpy(keep)
    # torch's own arithmetic with that mask: native_dropout's input * mask * scale, and its backward op
    record("dropout_forward", y, torch.from_numpy(x) * mask * scale, exact=True)
    record("dropout_backward", gx, torch.ops.aten.native_dropout_backward(torch.from_numpy(gy), mask, scale),
           exact=True)
    assert np.array_equal(y != 0, keep & (x != 0))


def test_masks_keep_one_minus_p_and_differ_by_step_key_and_seed():
    n = 200_000
    for p in (0.1, 0.5, 0.9):
        kept = dropout_mask.keep_mask(0, 0, "drop", p, n).mean()
        assert abs(kept - (1 - p)) < 4 * np.sqrt(p * (1 - p) / n)  # four standard deviations
    base = dropout_mask.keep_mask(0, 0, "drop", 0.5, 4096)
    for other in [(1, 0, "drop"), (0, 1, "drop"), (0, 0, "drop#2")]:
        agree = (dropout_mask.keep_mask(*other, 0.5, 4096) == base).mean()
        assert 0.45 < agree < 0.55, other  # independent masks agree on about half the elements
    assert dropout_mask.threshold(0.25) == 1 << 22 and dropout_mask.threshold(1.0) == 1 << 24
    with pytest.raises(ValueError):
        dropout_mask.threshold(1.5)


# -- firmware ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """The model at store-all and at 95%, where the schedule recomputes the first dropout's output."""
    out = {}
    for budget in ("100%", "95%"):
        d = tmp_path_factory.mktemp(f"drop{budget[:-1]}")
        out[budget] = (d, _compile(d, budget))
    return out


def test_the_mask_is_redrawn_not_kept(plans):
    d, r = plans["95%"]
    assert r["recomputes"] >= 1
    plan = (d / "plan.c").read_text()
    body = plan.split("int et_train_step", 1)[1].split("int et_predict")[0]
    assert "recompute native_dropout (" in body  # the dropout's output, recomputed for conv2's weight gradient
    assert body.count("et_dropout_forward(") >= 3 and body.count("et_dropout_backward(") == 2
    assert "#define ET_SEED 0u" in plan and "++et_step;" in body
    graph = json.loads((d / "schedule.json").read_text())["graph"]
    assert not any(n["dtype"] == "bool" for n in graph["nodes"])  # no mask node: nothing holds it
    tiny = (plans["100%"][0] / "plan.c").read_text()
    assert "et_dropout_forward(" in tiny


def test_plans_without_dropout_have_no_seed_or_step(tmp_path):
    compile_model(CompileOptions(model="tests.c_models:tiny_cnn", target="nrf52840", budget="100%",
                                 out=str(tmp_path), batch_size=1, emit="c"))
    assert "et_step" not in (tmp_path / "plan.c").read_text() + (tmp_path / "plan.h").read_text()
    assert "ET_SEED" not in (tmp_path / "plan.c").read_text()


@needs_host
@pytest.mark.parametrize("budget", ["100%", "95%"])
def test_host_build_trains_like_pytorch(plans, budget):
    r = run_firmware(str(plans[budget][0]), qemu=False, steps=4, check=True)
    assert r["ok"] and not r["mismatched"], r.get("error")
    assert r["losses"] == pytest.approx(r["reference_losses"], rel=1e-5)
    assert r["predict_max_abs_err"] <= 1e-5  # inference: dropout is the identity


@needs_host
def test_a_reference_with_other_masks_fails_the_check(plans, monkeypatch):
    """The check can fail: a reference that draws each step's masks of the step before disagrees."""
    real = dropout_mask.keep_mask
    monkeypatch.setattr(dropout_mask, "keep_mask", lambda seed, step, key, p, n: real(seed, step + 1, key, p, n))
    r = run_firmware(str(plans["95%"][0]), qemu=False, steps=2, check=True)
    assert not r["ok"] and r["error_kind"] == "CheckMismatch"


@needs_host
def test_dropout_with_p_zero_is_a_copy(tmp_path):
    _compile(tmp_path / "z", "100%", model="tests.c_models:dropout_zero")
    plan = (tmp_path / "z" / "plan.c").read_text()
    assert "memmove(" in plan and "et_dropout" not in plan and "et_step" not in plan
    r = run_firmware(str(tmp_path / "z"), qemu=False, steps=2, check=True)
    assert r["ok"] and not r["mismatched"], r.get("error")


@needs_host
def test_functional_dropout_trains_exactly(tmp_path):
    """F.dropout is keyed by the module whose forward calls it, so the reference redraws the C runtime's mask."""
    _compile(tmp_path / "f", "100%", model="tests.c_models:functional_dropout")
    assert "et_dropout" in (tmp_path / "f" / "plan.c").read_text()
    r = run_firmware(str(tmp_path / "f"), qemu=False, steps=2, check=True)
    assert r["ok"] and not r["mismatched"], r.get("error")


@needs_arm
@pytest.mark.slow
def test_host_and_qemu_draw_the_same_masks(plans):
    """uint32 hashing, float products: the M4F build ends with bit-identical weights (recompute included)."""
    d = str(plans["95%"][0])
    host = run_firmware(d, qemu=False, steps=3)
    mcu = run_firmware(d, qemu=True, steps=3, check=True)
    assert host["ok"] and mcu["ok"], (host.get("error"), mcu.get("error"))
    assert mcu["params_sha256"] == host["params_sha256"] and mcu["losses"] == host["losses"]
