"""Fine-tuning MCU-class models in C under QEMU (mps2-an386, with the nRF52840's 256 KB of RAM and 1 MB of
flash enforced by the linker script): frozen weights are const in flash, only the chosen layers train, and 5
steps on Fashion-MNIST match PyTorch trained with the same frozen set.

They build and run real firmware (`slow`), and skip when the toolchain or the dataset is missing.
"""
from __future__ import annotations

import json
import re
import shutil

import pytest
from safetensors.numpy import load_file

from edgetrain.compiler.pipeline import CompileOptions, compile_model
from edgetrain.compiler.workbench import cli

HAVE_ARM = bool(shutil.which("arm-none-eabi-gcc") and shutil.which("qemu-system-arm") and shutil.which("make"))
RAM, FLASH = 256 * 1024, 1024 * 1024
STEPS = 5

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not HAVE_ARM, reason="arm-none-eabi-gcc / qemu-system-arm "
                                                   "missing: apt-get install gcc-arm-none-eabi "
                                                   "libnewlib-arm-none-eabi qemu-system-arm")]


def _fashion_mnist_or_skip():
    from edgetrain.compiler.workbench.data import FASHION_MNIST_DIR

    if not FASHION_MNIST_DIR.is_dir():
        pytest.skip(f"Fashion-MNIST not installed in {FASHION_MNIST_DIR} (apt-get install dataset-fashion-mnist)")


CASES = {  # id: (model, --train, the C kernels the plan must call)
    "mobilenetv2": ("mcu_mobilenetv2", None, ("et_batch_norm_backward_sgd", "et_relu6_backward", "et_add_forward")),
    "mobilenetv2-biases": ("mcu_mobilenetv2", "biases", ("et_batch_norm_backward_sgd", "et_conv2d_backward_input")),
    "mobilenetv3-se": ("mcu_mobilenetv3", "features.4.*,features.5.*,classifier.*",
                       ("et_mul_bcast_forward", "et_hardsigmoid_backward", "et_hardswish_backward",
                        "et_sum_planes")),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fine_tuning_fits_the_chip_and_trains_like_pytorch(tmp_path, capsys, case):
    _fashion_mnist_or_skip()
    model, train, calls = CASES[case]
    out = tmp_path / case
    c = compile_model(CompileOptions(model=model, target="nrf52840", budget="auto", out=str(out), batch_size=1,
                                     emit="c", train=train, time_limit=20.0))
    assert c["peak_bytes"] <= c["budget_bytes"] and c["arena_bytes"] + c["state_bytes"] <= c["budget_bytes"]
    plan = (out / "plan.c").read_text()
    for call in calls:
        assert call in plan, call
    body = json.loads((out / "schedule.json").read_text())
    trainable = set(body["graph"]["trainable"])
    frozen = [p for p in body["graph"]["params"] if p not in trainable]
    assert trainable and frozen
    for p in frozen:  # a frozen weight is const: it stays in flash
        ident = re.search(rf"/\* {re.escape(p)}: \[[^\]]*\](?:\[[^\]]*\])*, frozen: const, kept in flash \*/\n"
                          r"static const float (p_\w+)\[", plan)
        assert ident, p

    rc = cli.main(["run", str(out), "--qemu", "--steps", str(STEPS), "--data", "fashion-mnist", "--check", "--json"])
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and r["ok"], r.get("error")
    assert r["steps_done"] == STEPS and not r["mismatched"]  # parameters and running statistics, rtol 1e-5
    assert r["losses"] == pytest.approx(r["reference_losses"], rel=1e-5)
    assert r["ram_bytes"] == r["data_bytes"] + r["bss_bytes"] <= RAM
    assert r["text_bytes"] + r["data_bytes"] <= FLASH
    assert r["arena_bytes"] <= r["budget_bytes"]

    # The frozen weights come back from the device bit for bit as they went in.
    from edgetrain.codegen.c.runner import read_result

    got = read_result(str(out / "run-qemu"), json.loads((out / "firmware.json").read_text()))["params"]
    w = load_file(str(out / "weights.safetensors"))
    for p in frozen:
        assert (got[p].numpy() == w[f"param/{p}"]).all(), p
    assert any(not (got[p].numpy() == w[f"param/{p}"]).all() for p in trainable)
