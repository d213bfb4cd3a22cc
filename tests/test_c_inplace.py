"""The C runtime writing outputs over dying operands: every kernel the op table lets do so (codegen/c/ops.py's
`in_place`) gives, with its output at its operand's address, the bits it gives out of place; the firmware's
arena places such an output at its operand's offset, and the README's kind of CNN trains like PyTorch there.

The kernel library and helpers are tests/test_c_kernels.py's (one build per module).
"""
from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest

from edgetrain.codegen.c.ops import C_OPS, DROPOUT, DROPOUT_BACKWARD, IN_PLACE_ARGS
from edgetrain.compiler.pipeline import CompileOptions, compile_model
from edgetrain.compiler.workbench.run_c import run_firmware
from test_c_kernels import SgdParams, f32, fp, lib, lib_path  # noqa: F401 - lib_path, lib are fixtures
from test_c_codegen import needs_arm, needs_host

N, C, HW = 2, 3, 20
COUNT = N * C * HW


def _draw(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [f32(rng.standard_normal(COUNT) * 3 + 0.25) for _ in range(2)]


def _sgd() -> SgdParams:
    return SgdParams(0.05, 0.9, 0.01)


# Each case: its kernel call on (operands, out), the operands (by their argument position in the aten op) the
# output may be written over. Every op of the table with `in_place` names its cases here.
def _unary(fn, *lit):
    return lambda lib, a, b, out: getattr(lib, fn)(COUNT, fp(a), *lit, fp(out))


def _binary(fn, *lit):
    return lambda lib, a, b, out: getattr(lib, fn)(COUNT, fp(a), fp(b), *lit, fp(out))


def _stats(lib, x):
    mean, invstd, var_sum = (np.zeros(C, np.float32) for _ in range(3))
    lib.et_batch_norm_forward(N, C, HW, fp(x.copy()), None, None, 1e-5, fp(np.empty_like(x)), fp(mean), fp(invstd),
                              fp(var_sum))
    return mean, invstd


def _bn_forward(lib, a, b, out):
    w, bias = f32(np.linspace(0.5, 1.5, C)), f32(np.linspace(-0.2, 0.2, C))
    mean, invstd, var_sum = (np.zeros(C, np.float32) for _ in range(3))
    lib.et_batch_norm_forward(N, C, HW, fp(a), fp(w), fp(bias), 1e-5, fp(out), fp(mean), fp(invstd), fp(var_sum))


def _bn_backward(lib, gy, x, out):
    mean, invstd = _stats(lib, x)
    w = f32(np.linspace(0.5, 1.5, C))
    gw, gb = np.zeros(C, np.float32), np.zeros(C, np.float32)
    lib.et_batch_norm_backward(N, C, HW, fp(gy), fp(x), fp(w), fp(mean), fp(invstd), fp(out), fp(gw), fp(gb))


def _bn_backward_sgd(lib, gy, x, out):
    mean, invstd = _stats(lib, x)
    w, b = f32(np.linspace(0.5, 1.5, C)), f32(np.linspace(-0.2, 0.2, C))
    wb, bb = np.zeros(C, np.float32), np.zeros(C, np.float32)
    opt = _sgd()
    lib.et_batch_norm_backward_sgd(N, C, HW, fp(gy), fp(x), fp(mean), fp(invstd), opt, fp(out), fp(w), fp(wb),
                                   fp(b), fp(bb))


def _mul_planes(lib, a, b, out):
    lib.et_mul_bcast_forward(N * C, HW, fp(a), fp(b[:N * C].copy()), fp(out))


def _dropout(fn):
    return lambda lib, a, b, out: getattr(lib, fn)(COUNT, fp(a), lib.et_dropout_stream(7, 3, 11), 1 << 23, 2.0,
                                                   fp(out))


CASES = {
    "aten.relu.default": [(_unary("et_relu_forward"), (0,))],
    "aten.threshold_backward.default": [(_binary("et_relu_backward"), (0, 1))],
    "aten.hardtanh.default": [(_unary("et_relu6_forward"), (0,))],
    "aten.hardtanh_backward.default": [(_binary("et_relu6_backward"), (0, 1))],
    "aten._native_batch_norm_legit_functional.default": [(_bn_forward, (0,))],
    "aten.native_batch_norm_backward.default": [(_bn_backward, (0, 1)), (_bn_backward_sgd, (0, 1))],
    "aten.sigmoid.default": [(_unary("et_sigmoid_forward"), (0,))],
    "aten.sigmoid_backward.default": [(_binary("et_sigmoid_backward"), (0, 1))],
    "aten.hardsigmoid.default": [(_unary("et_hardsigmoid_forward"), (0,))],
    "aten.hardsigmoid_backward.default": [(_binary("et_hardsigmoid_backward"), (0, 1))],
    "aten.hardswish.default": [(_unary("et_hardswish_forward"), (0,))],
    "aten.hardswish_backward.default": [(_binary("et_hardswish_backward"), (0, 1))],
    "aten.leaky_relu.default": [(_unary("et_leaky_relu_forward", 0.1), (0,))],
    "aten.leaky_relu_backward.default": [(_binary("et_leaky_relu_backward", 0.1), (0, 1))],
    "aten.gelu.default": [(_unary("et_gelu_forward", 0), (0,)), (_unary("et_gelu_forward", 1), (0,))],
    "aten.gelu_backward.default": [(_binary("et_gelu_backward", 0), (0, 1)), (_binary("et_gelu_backward", 1), (0, 1))],
    DROPOUT: [(_dropout("et_dropout_forward"), (0,))],
    DROPOUT_BACKWARD: [(_dropout("et_dropout_backward"), (0,))],
    "aten.mul.Tensor": [(_binary("et_mul_forward"), (0, 1)), (_mul_planes, (0,))],
    "aten.div.Tensor": [(_binary("et_div_forward"), (0, 1)), (_unary("et_div_scalar", 3.0), (0,))],
    "aten.add.Tensor": [(_binary("et_add_forward"), (0, 1))],
    "aten.silu.default": [(_unary("et_silu_forward"), (0,))],
    "aten.silu_backward.default": [(_binary("et_silu_backward"), (0, 1))],
    "aten.sub.Tensor": [(_binary("et_sub_forward"), (0, 1))],
    "aten.add.Scalar": [(_unary("et_add_scalar", 1.5), (0,))],
}


def _i8(x: np.ndarray):
    return x.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))


# An int8 prefix's activations (codegen/c/q8_emit.py): zero point -3, ReLU6's six at 40.
Q8_CASES = {
    "edgetrain.q8_relu.default": [(lambda lib, x, out: lib.et_q8_relu_forward(COUNT, _i8(x), -3, _i8(out)), (0,))],
    "edgetrain.q8_relu6.default": [(lambda lib, x, out: lib.et_q8_relu6_forward(COUNT, _i8(x), -3, 40, _i8(out)),
                                    (0,))],
}


def test_every_op_the_table_writes_in_place_has_its_kernels_checked_here():
    assert set(CASES) | set(Q8_CASES) == set(IN_PLACE_ARGS)
    for op, cases in (CASES | Q8_CASES).items():
        assert {k for _, ks in cases for k in ks} == set(C_OPS[op].in_place), op


@pytest.mark.parametrize("op", sorted(Q8_CASES))
def test_int8_kernel_written_over_its_operand_gives_the_same_bytes(lib, op):
    (call, _), = Q8_CASES[op]
    x = np.random.default_rng(len(op)).integers(-128, 128, COUNT, dtype=np.int8)
    want = np.zeros(COUNT, np.int8)
    call(lib, x.copy(), want)
    assert not np.array_equal(want, x)  # the op changed something: the comparison below can fail
    ops = x.copy()
    call(lib, ops, ops)  # the output at its operand's address
    assert np.array_equal(ops, want), op


@pytest.mark.parametrize("op, k", [(op, k) for op in sorted(CASES) for k in range(len(CASES[op]))])
def test_kernel_written_over_its_operand_gives_the_same_bits(lib, op, k):
    call, positions = CASES[op][k]
    a, b = _draw(len(op) + k)
    want = np.full(COUNT, np.nan, np.float32)
    call(lib, a.copy(), b.copy(), want)
    assert not np.isnan(want).any()
    for at in positions:
        ops = [a.copy(), b.copy()]
        call(lib, ops[0], ops[1], ops[at])  # the output at its operand's address
        assert np.array_equal(ops[at].view(np.uint32), want.view(np.uint32)), (op, at)


# -- the firmware ------------------------------------------------------------------------------------------------

@needs_host
def test_the_cnn_trains_like_pytorch_with_outputs_at_their_operands_offsets(tmp_path):
    """conv-BN-ReLU-pool twice at 3x32x32 for the nRF52840 (batch 1: a batch of 8 needs 1.09 MB at least, beyond
    the 256 KB every board's image is linked for) at its smallest feasible budget: ReLU's and batch norm's
    backward write over their gradient operands, so that budget is about half of store-all's."""
    out = tmp_path / "cnn"
    c = compile_model(CompileOptions(model="tests.user_models:conv_bn_relu_pool", target="nrf52840", budget="min",
                                     out=str(out), batch_size=1, emit="c", time_limit=20.0))
    assert c["min_feasible_bytes"] <= 0.6 * c["store_all_peak_bytes"], c
    plan = (out / "plan.c").read_text()
    # batch norm's backward: its input gradient at its output gradient's address (ET_F(offset) twice)
    calls = re.findall(r"et_batch_norm_backward_sgd\(1, 16, 1024, ET_F\((\d+)\), ET_F\(\d+\), ET_F\(\d+\), "
                       r"ET_F\(\d+\), &et_sgd, ET_F\((\d+)\)", plan)
    assert calls and all(gy == gx for gy, gx in calls), calls
    calls = re.findall(r"et_relu_backward\(\d+, ET_F\((\d+)\), ET_F\(\d+\), ET_F\((\d+)\)\)", plan)
    assert len(calls) == 2 and all(gy == gx for gy, gx in calls), calls
    r = run_firmware(str(out), qemu=False, steps=2, check=True)
    assert r["ok"] and not r["mismatched"], r.get("error")
    assert r["losses"] == pytest.approx(r["reference_losses"], rel=1e-5)
    assert r["arena_bytes"] + r["state_bytes"] <= r["budget_bytes"]


@pytest.mark.slow
@needs_arm
def test_the_cnn_trains_like_pytorch_under_qemu_in_the_nrf52840s_ram(tmp_path):
    """The same CNN at batch 1 for the nRF52840 (256 KB of RAM, the QEMU image's too), at its smallest feasible
    budget: about half of store-all's, within the RAM, exact under qemu-system-arm."""
    out = tmp_path / "cnn"
    c = compile_model(CompileOptions(model="tests.user_models:conv_bn_relu_pool", target="nrf52840", budget="min",
                                     out=str(out), batch_size=1, emit="c", time_limit=20.0))
    assert c["min_feasible_bytes"] <= 0.6 * c["store_all_peak_bytes"], c
    r = run_firmware(str(out), qemu=True, steps=2, check=True)
    assert r["ok"] and not r["mismatched"], r.get("error")
    assert r["losses"] == pytest.approx(r["reference_losses"], rel=1e-5)
    assert r["arena_bytes"] + r["state_bytes"] <= r["budget_bytes"] <= 256 * 1024
