"""The C runtime (runtime/c) held against PyTorch: kernels, SGD, exp/log, CRC-32 and the page store.

The sources are compiled with the real host gcc into a shared library (the flags generated firmware uses:
-O2 -ffp-contract=off, warning-free under -Wall -Wextra -Werror -std=c99 -pedantic) and called through
ctypes on numpy buffers. Forward kernels are compared with torch.nn.functional, backward kernels with
torch.autograd, at rtol 1e-5 / atol 1e-6 per element; kernels whose loops reproduce torch's own order
(pooling, activations, add, concat, SGD) are held to bit equality. Each comparison records its maximum
error in ERRORS; run `pytest -s tests/test_c_kernels.py` to print the table.

With arm-none-eabi-gcc present every source also compiles for the Cortex-M4F, and the objects are
checked for what the runtime promises: no heap calls, and fmaf inlined as VFMA (so SGD rounds the same
on the MCU as on the host).
"""
from __future__ import annotations

import ctypes
import platform
import re
import shutil
import subprocess
import zlib
from ctypes import POINTER, c_float, c_int, c_int32, c_uint32, c_void_p
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from edgetrain.targets.boards import DEFAULT_BOARD, load_board

ROOT = Path(__file__).resolve().parents[1]
C_DIR = ROOT / "runtime" / "c"
SOURCES = sorted(C_DIR.glob("*.c")) + sorted((C_DIR / "kernels").glob("*.c"))
HOST_SOURCES = [p for p in SOURCES if p.name != "storage_semihost.c"]  # storage_file.c + one back end
WARN = ["-Wall", "-Wextra", "-Werror", "-std=c99", "-pedantic", "-Wvla"]
BOARD = load_board(DEFAULT_BOARD)  # the board the MCU build and QEMU run are for: its CPU, port and machine
M4F = [*BOARD.cpu_flags.split(), "-O2", "-ffp-contract=off"]
RTOL, ATOL = 1e-5, 1e-6

ET_OK, ET_ERR_ARG, ET_ERR_IO, ET_ERR_NOT_FOUND, ET_ERR_CRC, ET_ERR_FORMAT, ET_ERR_NOT_INIT = 0, -1, -2, -3, -4, -5, -6

# Test-only helpers compiled next to the runtime: array loops over et_expf/et_logf (a ctypes call per
# element would dominate the test's time).
_HELPERS = r"""
#include "et_math.h"
void t_expf_array(int n, const float *x, float *y) { int i; for (i = 0; i < n; ++i) y[i] = et_expf(x[i]); }
void t_logf_array(int n, const float *x, float *y) { int i; for (i = 0; i < n; ++i) y[i] = et_logf(x[i]); }
"""

ERRORS: dict[str, dict] = {}  # kernel -> {"max_abs", "max_rel", "worst_tol_ratio", "exact"}


# -- building -----------------------------------------------------------------------------------------

def _gcc() -> str:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("host gcc is not installed (apt-get install gcc): the C runtime cannot be built")
    return gcc


class ConvShape(ctypes.Structure):
    _fields_ = [(f, c_int) for f in (
        "n", "c_in", "h_in", "w_in", "c_out", "h_out", "w_out", "k_h", "k_w", "stride_h", "stride_w",
        "pad_h", "pad_w", "dil_h", "dil_w", "groups")]


class PoolShape(ctypes.Structure):
    _fields_ = [(f, c_int) for f in (
        "n", "c", "h_in", "w_in", "h_out", "w_out", "k_h", "k_w", "stride_h", "stride_w", "pad_h", "pad_w",
        "dil_h", "dil_w", "count_include_pad")]


class SgdParams(ctypes.Structure):
    _fields_ = [("lr", c_float), ("momentum", c_float), ("weight_decay", c_float)]


_F = POINTER(c_float)
_I = POINTER(c_int32)
_SIGNATURES = {
    "et_status_str": (ctypes.c_char_p, [c_int]),
    "et_expf": (c_float, [c_float]),
    "et_logf": (c_float, [c_float]),
    "t_expf_array": (None, [c_int, _F, _F]),
    "t_logf_array": (None, [c_int, _F, _F]),
    "et_crc32_update": (c_uint32, [c_uint32, c_void_p, c_uint32]),
    "et_storage_init": (c_int, [ctypes.c_char_p]),
    "et_page_out": (c_int, [c_uint32, c_void_p, c_uint32]),
    "et_page_in": (c_int, [c_uint32, c_void_p, c_uint32]),
    "et_storage_counters": (None, [POINTER(c_uint32), POINTER(c_uint32)]),
    "et_sgd_update": (None, [POINTER(SgdParams), _F, c_float, _F]),
    "et_sgd_step": (None, [POINTER(SgdParams), c_int, _F, _F, _F]),
    "et_conv2d_shape_check": (c_int, [POINTER(ConvShape)]),
    "et_conv2d_forward": (None, [POINTER(ConvShape), _F, _F, _F, _F]),
    "et_conv2d_backward_input": (None, [POINTER(ConvShape), _F, _F, _F]),
    "et_conv2d_backward_weight": (None, [POINTER(ConvShape), _F, _F, _F, _F]),
    "et_conv2d_wgrad_sgd": (None, [POINTER(ConvShape), _F, _F, POINTER(SgdParams), _F, _F, _F, _F]),
    "et_linear_forward": (None, [c_int, c_int, c_int, _F, _F, _F, _F]),
    "et_linear_backward_input": (None, [c_int, c_int, c_int, _F, _F, _F]),
    "et_linear_backward_weight": (None, [c_int, c_int, c_int, _F, _F, _F, _F]),
    "et_linear_wgrad_sgd": (None, [c_int, c_int, c_int, _F, _F, POINTER(SgdParams), _F, _F, _F, _F]),
    "et_relu_forward": (None, [c_int, _F, _F]),
    "et_relu_backward": (None, [c_int, _F, _F, _F]),
    "et_relu6_forward": (None, [c_int, _F, _F]),
    "et_relu6_backward": (None, [c_int, _F, _F, _F]),
    "et_maxpool2d_shape_check": (c_int, [POINTER(PoolShape)]),
    "et_maxpool2d_forward": (None, [POINTER(PoolShape), _F, _F, _I]),
    "et_maxpool2d_gather": (None, [POINTER(PoolShape), _F, _I, _F]),
    "et_maxpool2d_backward": (None, [POINTER(PoolShape), _F, _I, _F]),
    "et_avgpool2d_shape_check": (c_int, [POINTER(PoolShape)]),
    "et_avgpool2d_forward": (None, [POINTER(PoolShape), _F, _F]),
    "et_avgpool2d_backward": (None, [POINTER(PoolShape), _F, _F]),
    "et_global_avgpool_forward": (None, [c_int, c_int, c_int, _F, _F]),
    "et_global_avgpool_backward": (None, [c_int, c_int, c_int, _F, _F]),
    "et_add_forward": (None, [c_int, _F, _F, _F]),
    "et_add_scalar": (None, [c_int, _F, c_float, _F]),
    "et_sub_forward": (None, [c_int, _F, _F, _F]),
    "et_div_forward": (None, [c_int, _F, _F, _F]),
    "et_div_scalar": (None, [c_int, _F, c_float, _F]),
    "et_fill": (None, [c_int, c_float, _F]),
    "et_sum_planes": (None, [c_int, c_int, _F, _F]),
    "et_concat_forward_part": (None, [c_int, c_int, c_int, c_int, c_int, _F, _F]),
    "et_concat_backward_part": (None, [c_int, c_int, c_int, c_int, c_int, _F, _F]),
    "et_flatten_copy": (None, [c_int, _F, _F]),
    "et_log_softmax_forward": (None, [c_int, c_int, _F, _F]),
    "et_log_softmax_backward": (None, [c_int, c_int, _F, _F, _F]),
    "et_nll_loss_forward": (None, [c_int, c_int, _F, _I, c_int, _F, _F]),
    "et_nll_loss_backward": (None, [c_int, c_int, _F, _I, c_int, _F, _F]),
    # tests/test_c_kernels_mcu.py: the ops of MCU CNNs beyond the basic set
    "et_batch_norm_forward": (None, [c_int, c_int, c_int, _F, _F, _F, ctypes.c_double, _F, _F, _F, _F]),
    "et_batch_norm_update_running_stats": (None, [c_int, ctypes.c_long, c_float, _F, _F, _F, _F]),
    "et_batch_norm_backward": (None, [c_int, c_int, c_int, _F, _F, _F, _F, _F, _F, _F, _F]),
    "et_batch_norm_backward_sgd": (None, [c_int, c_int, c_int, _F, _F, _F, _F, POINTER(SgdParams), _F, _F, _F,
                                          _F, _F]),
    "et_sigmoid_forward": (None, [c_int, _F, _F]),
    "et_sigmoid_backward": (None, [c_int, _F, _F, _F]),
    "et_hardsigmoid_forward": (None, [c_int, _F, _F]),
    "et_hardsigmoid_backward": (None, [c_int, _F, _F, _F]),
    "et_hardswish_forward": (None, [c_int, _F, _F]),
    "et_hardswish_backward": (None, [c_int, _F, _F, _F]),
    "et_silu_forward": (None, [c_int, _F, _F]),
    "et_silu_backward": (None, [c_int, _F, _F, _F]),
    "et_leaky_relu_forward": (None, [c_int, _F, c_float, _F]),
    "et_leaky_relu_backward": (None, [c_int, _F, _F, c_float, _F]),
    "et_gelu_forward": (None, [c_int, _F, c_int, _F]),
    "et_gelu_backward": (None, [c_int, _F, _F, c_int, _F]),
    "et_tanhf": (c_float, [c_float]),
    "et_erff": (c_float, [c_float]),
    "et_layer_norm_forward": (None, [c_int, c_int, _F, _F, _F, ctypes.c_double, _F, _F, _F]),
    "et_layer_norm_backward": (None, [c_int, c_int, _F, _F, _F, _F, _F, _F, _F, _F]),
    "et_layer_norm_backward_sgd": (None, [c_int, c_int, _F, _F, _F, _F, POINTER(SgdParams), _F, _F, _F, _F, _F]),
    "et_dropout_stream": (c_uint32, [c_uint32, c_uint32, c_uint32]),
    "et_dropout_keep": (c_int, [c_uint32, c_uint32, c_uint32]),
    "et_dropout_forward": (None, [c_int, _F, c_uint32, c_uint32, c_float, _F]),
    "et_dropout_backward": (None, [c_int, _F, c_uint32, c_uint32, c_float, _F]),
    "et_mul_forward": (None, [c_int, _F, _F, _F]),
    "et_mul_bcast_forward": (None, [c_int, c_int, _F, _F, _F]),
    "et_mul_bcast_backward_scale": (None, [c_int, c_int, _F, _F, _F]),
}


def _load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    for name, (res, args) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


@pytest.fixture(scope="module")
def lib_path(tmp_path_factory) -> Path:
    gcc = _gcc()
    out = tmp_path_factory.mktemp("c_runtime")
    helpers = out / "helpers.c"
    helpers.write_text(_HELPERS)
    so = out / "libet.so"
    cmd = [gcc, *WARN, "-O2", "-ffp-contract=off", "-fPIC", "-shared", f"-I{C_DIR}",
           *map(str, HOST_SOURCES), str(helpers), "-o", str(so), "-lm"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stderr}"
    return so


@pytest.fixture(scope="module")
def lib(lib_path) -> ctypes.CDLL:
    return _load(lib_path)


# -- buffers and comparison ---------------------------------------------------------------------------

def fp(a):
    """float* of a float32 C-contiguous numpy array (None stays NULL)."""
    if a is None:
        return None
    assert a.dtype == np.float32 and a.flags.c_contiguous
    return a.ctypes.data_as(_F)


def ip(a):
    assert a.dtype == np.int32 and a.flags.c_contiguous
    return a.ctypes.data_as(_I)


def f32(t) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        t = t.detach().cpu().numpy()
    return np.ascontiguousarray(t, dtype=np.float32)


def empty(*shape) -> np.ndarray:
    return np.full(shape, np.nan, dtype=np.float32)  # NaN: a kernel that skips an element shows


def record(kernel: str, got: np.ndarray, want, exact: bool = False, scale=None) -> None:
    """Compare got with torch's result, record the error, and assert the tolerance (or equality).

    Per element |got - want| <= ATOL * max(1, scale) + RTOL * |want|. `scale` (default 1) is, for a
    reduction, the root-sum-square of its terms: the size the sum would have without cancellation. A sum
    that cancels to near zero keeps the rounding of its big partial sums in ANY order - torch's blocked
    kernels and these loops round differently - so the absolute tolerance is taken relative to that
    scale; for unit-scale terms it is exactly atol. `exact`: values must be equal (+0 == -0).
    """
    want = f32(want).reshape(got.shape)
    scale = np.ones(got.shape) if scale is None else np.maximum(1.0, np.asarray(scale, np.float64).reshape(got.shape))
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    mag = np.abs(want.astype(np.float64))
    max_abs = float(diff.max()) if diff.size else 0.0
    big = mag >= 1e-3 * (mag.max() if mag.size else 0.0)  # relative error where it means something
    max_rel = float((diff[big] / np.maximum(mag[big], 1e-30)).max()) if big.any() else 0.0
    ratio = float((diff / (ATOL * scale + RTOL * mag)).max()) if diff.size else 0.0
    plain = float((diff / (ATOL + RTOL * mag)).max()) if diff.size else 0.0  # the same without `scale`
    equal = np.array_equal(got, want)
    e = ERRORS.setdefault(kernel, {"max_abs": 0.0, "max_rel": 0.0, "worst_tol_ratio": 0.0, "plain_ratio": 0.0,
                                   "exact": True})
    e["max_abs"] = max(e["max_abs"], max_abs)
    e["max_rel"] = max(e["max_rel"], max_rel)
    e["worst_tol_ratio"] = max(e["worst_tol_ratio"], ratio)
    e["plain_ratio"] = max(e["plain_ratio"], plain)
    e["exact"] = e["exact"] and equal
    assert not np.isnan(got).any() or np.isnan(want).any(), f"{kernel}: an element was not written"
    if exact:
        assert equal, f"{kernel}: not identical to torch, max abs diff {max_abs}"
    else:
        assert ratio <= 1.0, f"{kernel}: |err| up to {ratio:.3f}x the tolerance (max abs {max_abs:.3e})"


def term_scale(fn, inputs, gy):
    """Root-sum-square of the terms of each output and gradient element of a bilinear fn: the same fn
    and autograd in float64 on squared inputs (and a squared upstream gradient) sums the squared terms."""
    sq = [None if t is None else t.astype(np.float64) ** 2 for t in inputs]
    y2, g2 = grads(fn, sq, gy.astype(np.float64) ** 2)
    return [None if t is None else np.sqrt(t.numpy()) for t in [y2, *g2]]


@pytest.fixture(scope="module", autouse=True)
def _error_table():
    yield
    if ERRORS:
        print("\nC kernels vs torch (float32): max abs err | max rel err (|ref| >= 1e-3 max) | worst "
              "|err|/tolerance | the same with plain atol (no term scale) | identical to torch")
        for k, e in sorted(ERRORS.items()):
            print(f"  {k:40s} {e['max_abs']:.2e}  {e['max_rel']:.2e}  {e['worst_tol_ratio']:.3f}  "
                  f"{e.get('plain_ratio', 0.0):.3f}  {'yes' if e['exact'] else 'no'}")


def grads(fn, inputs, gy):
    """Output and torch.autograd gradients of fn(*inputs) wrt every input that is not None."""
    xs = [None if t is None else torch.from_numpy(t.copy()).requires_grad_(True) for t in inputs]
    y = fn(*xs)
    wrt = [x for x in xs if x is not None]
    gs = torch.autograd.grad(y, wrt, None if gy is None else torch.from_numpy(gy))
    it = iter(gs)
    return y.detach(), [None if x is None else next(it) for x in xs]


# -- compilation --------------------------------------------------------------------------------------

def test_every_source_compiles_warning_free_on_host():
    gcc = _gcc()
    for src in SOURCES:
        res = subprocess.run([gcc, *WARN, "-O2", "-ffp-contract=off", "-fsyntax-only", str(src)],
                             capture_output=True, text=True)
        assert res.returncode == 0, f"{src.name}:\n{res.stderr}"
    # Every header compiles on its own (each includes what it uses); et_runtime.h includes them all.
    for hdr in sorted(C_DIR.glob("*.h")) + sorted((C_DIR / "kernels").glob("*.h")):
        res = subprocess.run([gcc, *WARN, "-fsyntax-only", "-x", "c", "-"], input=f'#include "{hdr}"\n',
                             capture_output=True, text=True)
        assert res.returncode == 0, f"{hdr.name}:\n{res.stderr}"


def test_every_source_compiles_for_cortex_m4f(tmp_path):
    arm = shutil.which("arm-none-eabi-gcc")
    if arm is None:
        pytest.skip("arm-none-eabi-gcc missing (apt-get install gcc-arm-none-eabi libnewlib-arm-none-eabi)")
    nm = shutil.which("arm-none-eabi-nm")
    objdump = shutil.which("arm-none-eabi-objdump")
    for src in SOURCES:
        obj = tmp_path / f"{src.stem}.o"
        res = subprocess.run([arm, *WARN, *M4F, "-fstack-usage", "-c", str(src), "-o", str(obj)],
                             capture_output=True, text=True, cwd=tmp_path)
        assert res.returncode == 0, f"{src.name}:\n{res.stderr}"
        if nm:  # no heap: nothing the runtime compiles may call the allocator
            undefined = subprocess.run([nm, "-u", str(obj)], capture_output=True, text=True).stdout.split()
            assert not {"malloc", "calloc", "realloc", "free", "alloca"} & set(undefined), (src.name, undefined)
        # Every stack frame has a fixed size (no VLA, no alloca): gcc marks each function "static".
        for line in (tmp_path / f"{src.stem}.su").read_text().splitlines():
            assert line.rsplit("\t", 1)[-1] == "static", f"{src.name}: {line}"
        if objdump:  # no function calls itself (the kernels are loops, never recursion)
            current = None
            for line in subprocess.run([objdump, "-d", str(obj)], capture_output=True, text=True).stdout.splitlines():
                head = re.match(r"^[0-9a-f]+ <(\w+)>:$", line)
                if head:
                    current = head.group(1)
                elif current and re.search(rf"\bbl?\s+[0-9a-f]+ <{current}>", line):
                    raise AssertionError(f"{src.name}: {current} calls itself")
    if nm:  # the page store is written once: its two back ends define nothing but the raw file I/O
        def defined(stem):
            out = subprocess.run([nm, "-g", "--defined-only", str(tmp_path / f"{stem}.o")], capture_output=True, text=True)
            return {line.split()[-1] for line in out.stdout.splitlines()}
        assert defined("storage_stdio") == defined("storage_semihost") == {"et_file_write", "et_file_read"}
        assert defined("storage_file") == {"et_storage_init", "et_storage_counters", "et_page_out", "et_page_in"}
    if objdump:  # fmaf must be a fused VFP instruction, not a call into newlib's (double-rounding) fmaf
        fused = [src.stem for src in SOURCES if re.search(r"\bfmaf\s*\(", src.read_text())]
        assert {"sgd", "batch_norm", "conv2d", "linear"} <= set(fused), fused
        for stem in fused:
            dis = subprocess.run([objdump, "-d", str(tmp_path / f"{stem}.o")], capture_output=True, text=True).stdout
            assert re.search(r"\bvfn?m[as]\.f32", dis) and "fmaf" not in dis, (stem, dis[-2000:])


# -- exp, log, CRC ------------------------------------------------------------------------------------

def _ulp_error(got: np.ndarray, ref64: np.ndarray) -> float:
    ref32 = ref64.astype(np.float32)
    ulp = np.spacing(np.abs(ref32)).astype(np.float64)
    return float((np.abs(got.astype(np.float64) - ref64) / ulp).max())


def test_exp_and_log_are_faithful(lib):
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-103.9, 88.7, 400_000), rng.uniform(-20, 0, 400_000),
                        rng.uniform(-1e-3, 1e-3, 10_000), np.arange(-87, 88, 0.125)]).astype(np.float32)
    y = empty(x.size)
    lib.t_expf_array(x.size, fp(x), fp(y))
    ref = np.exp(x.astype(np.float64))
    normal = ref >= np.finfo(np.float32).tiny  # ulp error is for normal results; subnormals below
    err_exp = _ulp_error(y[normal], ref[normal])
    assert err_exp < 1.0, err_exp
    assert lib.et_expf(0.0) == 1.0 and lib.et_expf(-200.0) == 0.0 and np.isinf(lib.et_expf(100.0))
    assert abs(lib.et_expf(-100.0) - np.exp(-100.0)) <= np.spacing(np.float32(np.exp(-100.0)))

    x = np.concatenate([rng.uniform(1, 1000, 400_000), np.exp(rng.uniform(-80, 80, 400_000)),
                        rng.uniform(0.5, 2.0, 100_000)]).astype(np.float32)
    y = empty(x.size)
    lib.t_logf_array(x.size, fp(x), fp(y))
    ref = np.log(x.astype(np.float64))
    nonzero = np.abs(ref) > 1e-30
    err_log = _ulp_error(y[nonzero], ref[nonzero])
    assert err_log < 1.0, err_log
    assert lib.et_logf(1.0) == 0.0 and np.isneginf(lib.et_logf(0.0)) and np.isnan(lib.et_logf(-1.0))
    for name, err in (("et_expf (max abs = ulps vs exact)", err_exp), ("et_logf (max abs = ulps vs exact)", err_log)):
        ERRORS[name] = {"max_abs": err, "max_rel": 0.0, "worst_tol_ratio": 0.0, "exact": False}


def test_crc32_is_zlibs(lib):
    rng = np.random.default_rng(1)
    for n in (0, 1, 3, 64, 1001):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert lib.et_crc32_update(0, data, n) == zlib.crc32(data)
        half = n // 2  # chaining pieces gives the CRC of the whole
        assert lib.et_crc32_update(lib.et_crc32_update(0, data[:half], half), data[half:], n - half) == zlib.crc32(data)
    assert lib.et_crc32_update(0, b"123456789", 9) == 0xCBF43926  # the standard check value


# -- conv2d -------------------------------------------------------------------------------------------

# n, c_in, c_out, h, w, (kh, kw), (sh, sw), (ph, pw), (dh, dw), groups, bias
CONV_CASES = [
    (1, 1, 4, 8, 8, (3, 3), (1, 1), (1, 1), (1, 1), 1, True),
    (2, 3, 5, 9, 7, (3, 3), (2, 2), (1, 1), (1, 1), 1, True),
    (1, 4, 6, 10, 10, (3, 2), (1, 2), (0, 1), (1, 1), 2, False),
    (2, 6, 6, 8, 8, (3, 3), (1, 1), (1, 1), (1, 1), 6, True),      # depthwise
    (1, 4, 8, 7, 9, (3, 3), (2, 1), (2, 1), (1, 1), 4, True),      # depthwise, channel multiplier 2
    (1, 3, 4, 11, 11, (3, 3), (1, 1), (2, 2), (2, 2), 1, True),    # dilation
    (3, 2, 3, 5, 6, (1, 1), (1, 1), (0, 0), (1, 1), 1, False),     # pointwise
    (1, 8, 16, 14, 14, (5, 5), (2, 2), (2, 2), (1, 1), 1, True),   # a 25*8-term reduction
    (1, 8, 8, 5, 6, (1, 1), (1, 1), (1, 1), (1, 1), 1, True),      # pointwise in blocks of 4, padding rows
    (1, 5, 8, 7, 7, (3, 3), (1, 1), (1, 1), (1, 1), 1, True),      # unrolled 3x3 rows, odd pixel and channel
    (2, 8, 8, 9, 12, (3, 3), (1, 1), (1, 1), (1, 1), 8, False),    # depthwise, 4 pixels at a time
    (1, 4, 4, 13, 13, (3, 3), (2, 2), (1, 1), (1, 1), 4, True),    # depthwise, stride 2
]


def _random_conv_cases(k: int, seed: int):
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < k:
        groups = int(rng.choice([1, 1, 2, 3]))
        c_in, c_out = groups * int(rng.integers(1, 4)), groups * int(rng.integers(1, 4))
        kh, kw = int(rng.integers(1, 5)), int(rng.integers(1, 5))
        sh, sw = int(rng.integers(1, 4)), int(rng.integers(1, 4))
        ph, pw = int(rng.integers(0, 3)), int(rng.integers(0, 3))
        dh, dw = int(rng.integers(1, 3)), int(rng.integers(1, 3))
        h, w = int(rng.integers(3, 12)), int(rng.integers(3, 12))
        if h + 2 * ph - dh * (kh - 1) - 1 < 0 or w + 2 * pw - dw * (kw - 1) - 1 < 0:
            continue
        out.append((int(rng.integers(1, 4)), c_in, c_out, h, w, (kh, kw), (sh, sw), (ph, pw), (dh, dw), groups,
                    bool(rng.integers(0, 2))))
    return out


def _conv_shape(n, c_in, c_out, h, w, k, s, p, d, groups) -> ConvShape:
    ho = (h + 2 * p[0] - d[0] * (k[0] - 1) - 1) // s[0] + 1
    wo = (w + 2 * p[1] - d[1] * (k[1] - 1) - 1) // s[1] + 1
    return ConvShape(n, c_in, h, w, c_out, ho, wo, k[0], k[1], s[0], s[1], p[0], p[1], d[0], d[1], groups)


def _dyadic(rng, shape, denom):
    """Small multiples of 1/denom: every product and partial sum of a kernel is exact in float32, so any
    summation order gives the same bits and the comparison tests the index arithmetic alone."""
    return f32(rng.integers(-4, 5, shape) / denom)


def _check_conv(lib, case, x, wt, b, gy, exact, tag=""):
    n, c_in, c_out, h, w, k, s, p, d, groups, bias = case
    shape = _conv_shape(n, c_in, c_out, h, w, k, s, p, d, groups)
    assert lib.et_conv2d_shape_check(shape) == ET_OK
    y = empty(n, c_out, shape.h_out, shape.w_out)
    lib.et_conv2d_forward(shape, fp(x), fp(wt), fp(b), fp(y))
    fn = lambda x_, w_, b_: F.conv2d(x_, w_, b_, s, p, d, groups)  # noqa: E731
    ref_y, (ref_gx, ref_gw, ref_gb) = grads(fn, [x, wt, b], gy)
    sy, sgx, sgw, sgb = term_scale(fn, [x, wt, b], gy)
    record("conv2d_forward" + tag, y, ref_y, exact, sy)
    gx = empty(*x.shape)
    lib.et_conv2d_backward_input(shape, fp(gy), fp(wt), fp(gx))
    record("conv2d_backward_input" + tag, gx, ref_gx, exact, sgx)
    gw, gb = empty(*wt.shape), (empty(c_out) if bias else None)
    lib.et_conv2d_backward_weight(shape, fp(gy), fp(x), fp(gw), fp(gb))
    record("conv2d_backward_weight" + tag, gw, ref_gw, exact, sgw)
    if bias:
        record("conv2d_backward_bias" + tag, gb, ref_gb, exact, sgb)
    return shape, gw, gb


@pytest.mark.parametrize("case", CONV_CASES + _random_conv_cases(12, seed=7), ids=str)
def test_conv2d_forward_and_backward_match_torch(lib, case):
    n, c_in, c_out, h, w, k, s, p, d, groups, bias = case
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    # Exact data first: indices, padding, stride, dilation and groups must give torch's bits.
    _check_conv(lib, case, _dyadic(rng, (n, c_in, h, w), 4), _dyadic(rng, (c_out, c_in // groups, *k), 8),
                _dyadic(rng, c_out, 8) if bias else None,
                _dyadic(rng, (n, c_out, *F.conv2d(torch.zeros(1, c_in, h, w), torch.zeros(c_out, c_in // groups, *k),
                                                  None, s, p, d, groups).shape[2:]), 4),
                exact=True, tag=" (exact data)")
    # Then random data at torch's default init scale: rounding differs only by summation order.
    bound = 1.0 / np.sqrt(c_in // groups * k[0] * k[1])  # nn.Conv2d's kaiming-uniform(a=sqrt(5)) bound
    x = f32(rng.standard_normal((n, c_in, h, w)))
    wt = f32(rng.uniform(-bound, bound, (c_out, c_in // groups, *k)))
    b = f32(rng.uniform(-bound, bound, c_out)) if bias else None
    shape = _conv_shape(n, c_in, c_out, h, w, k, s, p, d, groups)
    gy = f32(rng.standard_normal((n, c_out, shape.h_out, shape.w_out)))
    # torch takes its im2col + GEMM path for batch-1 kernels up to 3x3, whose order the C loops follow.
    tag = " [batch 1, k<=3x3]" if n == 1 and max(k) <= 3 else ""
    shape, gw, gb = _check_conv(lib, case, x, wt, b, gy, exact=False, tag=tag)

    # Fused weight gradient + SGD == separate gradient then SGD, bit for bit (momentum buffers mid-run).
    opt = SgdParams(0.05, 0.9, 1e-3)
    w_sep, w_fused = wt.copy(), wt.copy()
    wbuf_sep = f32(rng.standard_normal(wt.shape) * 0.1)
    wbuf_fused = wbuf_sep.copy()
    lib.et_sgd_step(opt, wt.size, fp(w_sep), fp(gw), fp(wbuf_sep))
    b_sep = b_fused = bbuf_sep = bbuf_fused = None
    if bias:
        b_sep, b_fused = b.copy(), b.copy()
        bbuf_sep = f32(rng.standard_normal(c_out) * 0.1)
        bbuf_fused = bbuf_sep.copy()
        lib.et_sgd_step(opt, c_out, fp(b_sep), fp(gb), fp(bbuf_sep))
    lib.et_conv2d_wgrad_sgd(shape, fp(gy), fp(x), opt, fp(w_fused), fp(wbuf_fused), fp(b_fused), fp(bbuf_fused))
    for got, want in ((w_fused, w_sep), (wbuf_fused, wbuf_sep), (b_fused, b_sep), (bbuf_fused, bbuf_sep)):
        if got is not None:
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_conv2d_shape_check_rejects_inconsistent_shapes(lib):
    good = _conv_shape(1, 4, 6, 8, 8, (3, 3), (1, 1), (1, 1), (1, 1), 2)
    assert lib.et_conv2d_shape_check(good) == ET_OK
    for field, value in (("groups", 3), ("h_out", 7), ("stride_w", 0), ("k_h", 20), ("c_out", 5)):
        bad = ConvShape.from_buffer_copy(good)
        setattr(bad, field, value)
        assert lib.et_conv2d_shape_check(bad) == ET_ERR_ARG, field


# -- linear -------------------------------------------------------------------------------------------

def _check_linear(lib, n, fin, fout, x, wt, b, gy, exact, tag=""):
    y = empty(n, fout)
    lib.et_linear_forward(n, fin, fout, fp(x), fp(wt), fp(b), fp(y))
    ref_y, (ref_gx, ref_gw, ref_gb) = grads(F.linear, [x, wt, b], gy)
    sy, sgx, sgw, sgb = term_scale(F.linear, [x, wt, b], gy)
    record("linear_forward" + tag, y, ref_y, exact, sy)
    gx = empty(n, fin)
    lib.et_linear_backward_input(n, fin, fout, fp(gy), fp(wt), fp(gx))
    record("linear_backward_input" + tag, gx, ref_gx, exact, sgx)
    gw, gb = empty(fout, fin), (empty(fout) if b is not None else None)
    lib.et_linear_backward_weight(n, fin, fout, fp(gy), fp(x), fp(gw), fp(gb))
    record("linear_backward_weight" + tag, gw, ref_gw, exact or n == 1, sgw)  # batch 1: one product each
    if b is not None:
        record("linear_backward_bias" + tag, gb, ref_gb, exact, sgb)
    return gw, gb


@pytest.mark.parametrize("n,fin,fout,bias", [(1, 10, 4, True), (1, 784, 10, True), (4, 33, 7, False),
                                             (16, 64, 10, True), (3, 1, 1, True)])
def test_linear_forward_and_backward_match_torch(lib, n, fin, fout, bias):
    rng = np.random.default_rng(n * 1000 + fin + fout)
    _check_linear(lib, n, fin, fout, _dyadic(rng, (n, fin), 4), _dyadic(rng, (fout, fin), 8),
                  _dyadic(rng, fout, 8) if bias else None, _dyadic(rng, (n, fout), 4), exact=True, tag=" (exact data)")
    bound = 1.0 / np.sqrt(fin)  # nn.Linear's init bound
    x = f32(rng.standard_normal((n, fin)))
    wt = f32(rng.uniform(-bound, bound, (fout, fin)))
    b = f32(rng.uniform(-bound, bound, fout)) if bias else None
    gy = f32(rng.standard_normal((n, fout)))
    gw, gb = _check_linear(lib, n, fin, fout, x, wt, b, gy, exact=False)

    opt = SgdParams(0.1, 0.5, 5e-4)
    w_sep, w_fused = wt.copy(), wt.copy()
    buf_sep, buf_fused = np.zeros_like(wt), np.zeros_like(wt)
    lib.et_sgd_step(opt, wt.size, fp(w_sep), fp(gw), fp(buf_sep))
    b_sep = b.copy() if bias else None
    b_fused = b.copy() if bias else None
    bbuf_sep = np.zeros(fout, np.float32) if bias else None
    bbuf_fused = np.zeros(fout, np.float32) if bias else None
    if bias:
        lib.et_sgd_step(opt, fout, fp(b_sep), fp(gb), fp(bbuf_sep))
    lib.et_linear_wgrad_sgd(n, fin, fout, fp(gy), fp(x), opt, fp(w_fused), fp(buf_fused), fp(b_fused),
                            fp(bbuf_fused))
    assert np.array_equal(w_fused.view(np.uint32), w_sep.view(np.uint32))
    assert np.array_equal(buf_fused.view(np.uint32), buf_sep.view(np.uint32))
    if bias:
        assert np.array_equal(b_fused.view(np.uint32), b_sep.view(np.uint32))


# -- SGD ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("lr,momentum,wd", [(0.1, 0.9, 5e-4), (0.01, 0.0, 0.0), (0.05, 0.0, 1e-2),
                                            (0.3, 0.99, 0.0)])
def test_sgd_three_steps_equal_torch_optim_sgd(lib, lr, momentum, wd):
    rng = np.random.default_rng(3)
    p0 = f32(rng.standard_normal(1037))
    gs = [f32(rng.standard_normal(1037)) for _ in range(3)]
    param = torch.nn.Parameter(torch.from_numpy(p0.copy()))
    opt_t = torch.optim.SGD([param], lr=lr, momentum=momentum, weight_decay=wd)
    p, buf = p0.copy(), np.zeros_like(p0)
    opt = SgdParams(lr, momentum, wd)
    for g in gs:
        param.grad = torch.from_numpy(g.copy())
        opt_t.step()
        lib.et_sgd_step(opt, p.size, fp(p), fp(g), fp(buf) if momentum else None)
    # torch's add(alpha=) is a fused multiply-add wherever its CPU kernels use FMA (AVX2, AVX-512): there
    # fmaf makes the C update bit-identical; on a CPU without FMA it is within rounding.
    exact = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
    record("sgd_step (3 steps)", p, param.detach(), exact=exact)
    if momentum:
        record("sgd_step momentum buffer", buf, opt_t.state[param]["momentum_buffer"], exact=exact)


# -- activations --------------------------------------------------------------------------------------

def _activation_input(rng, n=2000):
    x = rng.standard_normal(n) * 4
    x[::7] = 0.0
    x[::11] = 6.0
    x[::13] = -0.0
    return f32(x)


@pytest.mark.parametrize("name", ["relu", "relu6"])
def test_activations_match_torch_bitwise(lib, name):
    rng = np.random.default_rng(4)
    x, gy = _activation_input(rng), f32(rng.standard_normal(2000))
    fn = F.relu if name == "relu" else F.relu6
    fwd, bwd = getattr(lib, f"et_{name}_forward"), getattr(lib, f"et_{name}_backward")
    y = empty(x.size)
    fwd(x.size, fp(x), fp(y))
    ref_y, (ref_gx,) = grads(fn, [x], gy)
    record(f"{name}_forward", y, ref_y, exact=True)
    gx = empty(x.size)
    bwd(x.size, fp(gy), fp(y), fp(gx))
    record(f"{name}_backward", gx, ref_gx, exact=True)
    inplace = x.copy()  # in-place use is allowed
    fwd(x.size, fp(inplace), fp(inplace))
    assert np.array_equal(inplace, y)


# -- pooling ------------------------------------------------------------------------------------------

# n, c, h, w, (kh, kw), (sh, sw), (ph, pw), (dh, dw), ceil_mode
MAXPOOL_CASES = [
    (1, 3, 8, 8, (2, 2), (2, 2), (0, 0), (1, 1), False),
    (2, 4, 9, 7, (3, 3), (2, 2), (1, 1), (1, 1), False),
    (1, 2, 10, 10, (3, 3), (1, 1), (1, 1), (1, 1), False),   # overlapping windows: gradients add up
    (1, 2, 11, 9, (3, 2), (2, 1), (1, 1), (2, 2), False),    # dilation
    (2, 3, 7, 7, (2, 2), (2, 2), (0, 0), (1, 1), True),      # ceil_mode: a clipped last window
    (1, 1, 5, 6, (3, 3), (2, 2), (1, 1), (1, 1), True),
]


def _pool_shape(n, c, h, w, k, s, p, d, ho, wo, count_include_pad=1) -> PoolShape:
    return PoolShape(n, c, h, w, ho, wo, k[0], k[1], s[0], s[1], p[0], p[1], d[0], d[1], count_include_pad)


def _check_maxpool(lib, x, case, tag):
    n, c, h, w, k, s, p, d, ceil = case
    ref_y, ref_idx = F.max_pool2d(torch.from_numpy(x), k, s, p, d, ceil_mode=ceil, return_indices=True)
    shape = _pool_shape(n, c, h, w, k, s, p, d, ref_y.shape[2], ref_y.shape[3])
    assert lib.et_maxpool2d_shape_check(shape) == ET_OK
    y = empty(*ref_y.shape)
    idx = np.full(ref_y.shape, -1, dtype=np.int32)
    lib.et_maxpool2d_forward(shape, fp(x), fp(y), ip(idx))
    record(f"maxpool2d_forward{tag}", y, ref_y, exact=True)
    assert np.array_equal(idx, ref_idx.numpy()), "argmax differs from torch's"
    lib.et_maxpool2d_forward(shape, fp(x), None, ip(idx))  # values are optional: argmax only
    assert np.array_equal(idx, ref_idx.numpy())
    gathered = empty(*ref_y.shape)
    lib.et_maxpool2d_gather(shape, fp(x), ip(idx), fp(gathered))
    assert np.array_equal(gathered, y)
    gy = f32(np.random.default_rng(5).standard_normal(ref_y.shape))
    _, (ref_gx,) = grads(lambda x_: F.max_pool2d(x_, k, s, p, d, ceil_mode=ceil), [x], gy)
    gx = empty(*x.shape)
    lib.et_maxpool2d_backward(shape, fp(gy), ip(idx), fp(gx))
    record(f"maxpool2d_backward{tag}", gx, ref_gx, exact=True)


@pytest.mark.parametrize("case", MAXPOOL_CASES, ids=str)
def test_maxpool2d_matches_torch_including_argmax(lib, case):
    n, c, h, w = case[:4]
    rng = np.random.default_rng(6)
    _check_maxpool(lib, f32(rng.standard_normal((n, c, h, w))), case, "")
    # Ties: a constant input (every window all ties) and small integers (many ties): first max wins.
    _check_maxpool(lib, np.full((n, c, h, w), 0.5, dtype=np.float32), case, " (ties)")
    _check_maxpool(lib, f32(rng.integers(-2, 3, (n, c, h, w))), case, " (ties)")


def test_maxpool2d_nan_and_infinity_pick_torchs_indices(lib):
    """A NaN wins its window (the last NaN, as torch's `val > max || isnan(val)`); an all -inf window
    points at its first element."""
    x = f32(np.random.default_rng(15).standard_normal((1, 2, 6, 6)))
    x[0, 0, 1, 1] = x[0, 0, 1, 2] = x[0, 0, 4, 5] = np.nan
    x[0, 1, :2, :2] = -np.inf
    ref_y, ref_idx = F.max_pool2d(torch.from_numpy(x), 2, 2, return_indices=True)
    shape = _pool_shape(1, 2, 6, 6, (2, 2), (2, 2), (0, 0), (1, 1), 3, 3)
    y, idx = empty(1, 2, 3, 3), np.full((1, 2, 3, 3), -1, np.int32)
    lib.et_maxpool2d_forward(shape, fp(x), fp(y), ip(idx))
    assert np.array_equal(idx, ref_idx.numpy())
    assert np.array_equal(y, ref_y.numpy(), equal_nan=True)


# n, c, h, w, (kh, kw), (sh, sw), (ph, pw), ceil_mode, count_include_pad
AVGPOOL_CASES = [
    (1, 3, 8, 8, (2, 2), (2, 2), (0, 0), False, True),
    (2, 4, 9, 7, (3, 3), (2, 2), (1, 1), False, True),
    (2, 4, 9, 7, (3, 3), (2, 2), (1, 1), False, False),
    (1, 2, 10, 10, (3, 3), (1, 1), (1, 1), False, True),   # overlapping windows
    (1, 2, 7, 8, (4, 3), (3, 2), (2, 1), False, True),
    (1, 2, 7, 7, (2, 2), (2, 2), (1, 1), True, True),      # ceil_mode also works (h_out comes from torch)
]


@pytest.mark.parametrize("case", AVGPOOL_CASES, ids=str)
def test_avgpool2d_matches_torch_bitwise(lib, case):
    n, c, h, w, k, s, p, ceil, cip = case
    rng = np.random.default_rng(8)
    x = f32(rng.standard_normal((n, c, h, w)))
    fn = lambda x_: F.avg_pool2d(x_, k, s, p, ceil_mode=ceil, count_include_pad=cip)  # noqa: E731
    ref_y = fn(torch.from_numpy(x))
    shape = _pool_shape(n, c, h, w, k, s, p, (1, 1), ref_y.shape[2], ref_y.shape[3], int(cip))
    assert lib.et_avgpool2d_shape_check(shape) == ET_OK
    y = empty(*ref_y.shape)
    lib.et_avgpool2d_forward(shape, fp(x), fp(y))
    record("avgpool2d_forward", y, ref_y, exact=True)
    gy = f32(rng.standard_normal(ref_y.shape))
    _, (ref_gx,) = grads(fn, [x], gy)
    gx = empty(*x.shape)
    lib.et_avgpool2d_backward(shape, fp(gy), fp(gx))
    record("avgpool2d_backward", gx, ref_gx, exact=True)


@pytest.mark.parametrize("n,c,h,w", [(1, 8, 7, 7), (3, 5, 4, 6), (2, 16, 14, 14), (1, 1, 1, 1)])
def test_global_avgpool_matches_torch(lib, n, c, h, w):
    rng = np.random.default_rng(9)
    x, gy = f32(rng.standard_normal((n, c, h, w))), f32(rng.standard_normal((n, c, 1, 1)))
    ref_y, (ref_gx,) = grads(lambda x_: F.adaptive_avg_pool2d(x_, 1), [x], gy)
    y = empty(n, c, 1, 1)
    lib.et_global_avgpool_forward(n, c, h * w, fp(x), fp(y))
    record("global_avgpool_forward", y, ref_y, scale=np.sqrt((x.astype(np.float64) ** 2).sum((2, 3))) / (h * w))
    gx = empty(*x.shape)
    lib.et_global_avgpool_backward(n, c, h * w, fp(gy), fp(gx))
    record("global_avgpool_backward", gx, ref_gx, exact=True)


# -- structure: add, concat, flatten ------------------------------------------------------------------

def test_elementwise_add_sub_div_fill_are_bitwise_and_sum_planes_matches(lib):
    aten = torch.ops.aten
    rng = np.random.default_rng(10)
    a, b = (f32(rng.standard_normal(999)) for _ in range(2))
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    y = empty(999)
    lib.et_add_forward(999, fp(a), fp(b), fp(y))
    record("add_forward", y, aten.add.Tensor(ta, tb), exact=True)
    lib.et_add_scalar(999, fp(a), 0.1, fp(y))
    record("add_scalar", y, aten.add.Scalar(ta, 0.1), exact=True)
    lib.et_sub_forward(999, fp(a), fp(b), fp(y))
    record("sub_forward", y, aten.sub.Tensor(ta, tb), exact=True)
    for v in (2.0, 3.0, 0.7):  # a true division, as torch's: not a multiply by the reciprocal
        lib.et_div_scalar(999, fp(a), v, fp(y))
        record(f"div_scalar_{v}", y, aten.div.Tensor(ta, v), exact=True)
    lib.et_div_forward(999, fp(a), fp(b), fp(y))
    record("div_forward", y, aten.div.Tensor(ta, tb), exact=True)
    lib.et_fill(999, 1.0, fp(y))
    record("fill", y, aten.fill.Scalar(torch.empty(999), 1), exact=True)
    x = f32(rng.standard_normal((3, 5, 7, 6)))
    s = empty(3, 5)
    lib.et_sum_planes(15, 42, fp(x), fp(s))
    record("sum_planes", s, aten.sum.dim_IntList(torch.from_numpy(x), [2, 3], False))


@pytest.mark.parametrize("n", [1, 3])
def test_concat_channels_and_its_backward(lib, n):
    rng = np.random.default_rng(11)
    parts = [f32(rng.standard_normal((n, ch, 5, 4))) for ch in (2, 3, 1)]
    c_total, hw = 6, 20
    y = empty(n, c_total, 5, 4)
    off = 0
    for part in parts:
        lib.et_concat_forward_part(n, hw, c_total, off, part.shape[1], fp(part), fp(y))
        off += part.shape[1]
    ts = [torch.from_numpy(p_) for p_ in parts]
    record("concat_forward", y, torch.cat(ts, 1), exact=True)
    gy = f32(rng.standard_normal(y.shape))
    _, ref = grads(lambda *xs: torch.cat(xs, 1), parts, gy)
    off = 0
    for part, ref_g in zip(parts, ref):
        g = empty(*part.shape)
        lib.et_concat_backward_part(n, hw, c_total, off, part.shape[1], fp(gy), fp(g))
        record("concat_backward", g, ref_g, exact=True)
        off += part.shape[1]


def test_flatten_is_a_no_op_on_nchw(lib):
    x = f32(np.random.default_rng(12).standard_normal((2, 3, 4, 5)))
    assert np.array_equal(torch.flatten(torch.from_numpy(x), 1).numpy().reshape(-1), x.reshape(-1))
    y = empty(2, 60)
    lib.et_flatten_copy(x.size, fp(x), fp(y))
    record("flatten", y, torch.flatten(torch.from_numpy(x), 1), exact=True)
    before = x.copy()
    lib.et_flatten_copy(x.size, fp(x), fp(x))  # same buffer: nothing moves
    assert np.array_equal(x, before)


# -- loss ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n,classes,scale,ignore", [(1, 10, 1.0, False), (4, 10, 3.0, False), (37, 7, 10.0, False),
                                                    (8, 100, 1.0, True), (2, 2, 30.0, False), (300, 10, 2.0, True)])
def test_cross_entropy_matches_torch(lib, n, classes, scale, ignore):
    """log_softmax then nll_loss, forward and backward, each against its aten op; chained, F.cross_entropy's
    loss and gradient."""
    aten = torch.ops.aten
    rng = np.random.default_rng(n + classes)
    logits = f32(rng.standard_normal((n, classes)) * scale)
    labels = rng.integers(0, classes, n).astype(np.int32)
    if ignore:
        labels[::3] = -100
    z = torch.from_numpy(logits.copy()).requires_grad_(True)
    loss_t = F.cross_entropy(z, torch.from_numpy(labels).long())
    (ref_g,) = torch.autograd.grad(loss_t, [z])
    logp = empty(n, classes)
    lib.et_log_softmax_forward(n, classes, fp(logits), fp(logp))
    record("log_softmax_forward", logp, aten._log_softmax(torch.from_numpy(logits), 1, False))
    loss, total = np.zeros(1, np.float32), np.zeros(1, np.float32)
    lib.et_nll_loss_forward(n, classes, fp(logp), ip(labels), -100, fp(loss), fp(total))
    ref_loss, ref_total = aten.nll_loss_forward(torch.from_numpy(logp), torch.from_numpy(labels).long(), None, 1, -100)
    record("nll_loss_forward", loss, ref_loss.reshape(1))
    assert total[0] == ref_total.item()
    record("cross_entropy_forward", loss, loss_t.detach().reshape(1))
    one = np.ones(1, np.float32)
    g_logp = empty(n, classes)
    lib.et_nll_loss_backward(n, classes, fp(one), ip(labels), -100, fp(total), fp(g_logp))
    ref_g_logp = aten.nll_loss_backward(torch.ones(()), torch.from_numpy(logp), torch.from_numpy(labels).long(), None,
                                        1, -100, ref_total)
    record("nll_loss_backward", g_logp, ref_g_logp, exact=True)
    g = empty(n, classes)
    lib.et_log_softmax_backward(n, classes, fp(g_logp), fp(logp), fp(g))
    record("log_softmax_backward", g, aten._log_softmax_backward_data(
        torch.from_numpy(g_logp), torch.from_numpy(logp), 1, torch.float32))
    record("cross_entropy_backward", g, ref_g)


# -- storage ------------------------------------------------------------------------------------------

def _page_file(directory: Path, page_id: int) -> Path:
    return directory / f"et_page_{page_id:08x}.bin"


def test_storage_round_trip_and_counters(lib, tmp_path):
    assert lib.et_storage_init(str(tmp_path).encode()) == ET_OK
    rng = np.random.default_rng(13)
    blocks = {0: f32(rng.standard_normal(1)), 7: f32(rng.standard_normal((3, 8, 8))), 0xDEADBEEF: f32(rng.standard_normal(1000))}
    for pid, a in blocks.items():
        assert lib.et_page_out(pid, a.ctypes.data, a.nbytes) == ET_OK
    blocks[7] = f32(rng.standard_normal((3, 8, 8)))  # paging an id out again replaces its block
    assert lib.et_page_out(7, blocks[7].ctypes.data, blocks[7].nbytes) == ET_OK
    for pid, a in blocks.items():
        back = empty(*a.shape)
        assert lib.et_page_in(pid, back.ctypes.data, back.nbytes) == ET_OK
        assert np.array_equal(back.view(np.uint32), a.view(np.uint32))
        assert _page_file(tmp_path, pid).stat().st_size == 16 + a.nbytes
    out_b, in_b = c_uint32(), c_uint32()
    lib.et_storage_counters(ctypes.byref(out_b), ctypes.byref(in_b))
    assert out_b.value == 4 + 768 * 2 + 4000 and in_b.value == 4 + 768 + 4000
    assert lib.et_page_out(1, None, 0) == ET_OK and lib.et_page_in(1, None, 0) == ET_OK  # empty block


def test_corrupted_page_is_caught_by_the_crc(lib, tmp_path):
    assert lib.et_storage_init(str(tmp_path).encode()) == ET_OK
    a = f32(np.random.default_rng(14).standard_normal(256))
    path = _page_file(tmp_path, 42)
    size = 16 + a.nbytes
    # Any single flipped byte - in the magic, id, size, CRC or payload - reads as ET_ERR_CRC.
    for pos in (0, 5, 9, 13, 16, 17, 500, size - 1):
        assert lib.et_page_out(42, a.ctypes.data, a.nbytes) == ET_OK
        raw = bytearray(path.read_bytes())
        raw[pos] ^= 0x01 if pos != 500 else 0x80
        path.write_bytes(bytes(raw))
        back = empty(256)
        assert lib.et_page_in(42, back.ctypes.data, back.nbytes) == ET_ERR_CRC, pos
        assert lib.et_status_str(ET_ERR_CRC) == b"ET_ERR_CRC"
    # Not corruption but still refused: a truncated file, a page of another size or id, a missing page.
    assert lib.et_page_out(42, a.ctypes.data, a.nbytes) == ET_OK
    good = path.read_bytes()
    path.write_bytes(good[:-4])
    assert lib.et_page_in(42, back.ctypes.data, back.nbytes) == ET_ERR_FORMAT
    path.write_bytes(good)
    assert lib.et_page_in(42, back.ctypes.data, back.nbytes - 4) == ET_ERR_FORMAT
    _page_file(tmp_path, 43).write_bytes(good)  # block 42's file under block 43's name
    assert lib.et_page_in(43, back.ctypes.data, back.nbytes) == ET_ERR_FORMAT
    assert lib.et_page_in(44, back.ctypes.data, back.nbytes) == ET_ERR_NOT_FOUND
    assert lib.et_storage_init(b"x" * 201) == ET_ERR_ARG


def test_storage_requires_init_and_reports_io_errors(lib_path, tmp_path):
    copy = tmp_path / "libet_fresh.so"  # a second copy loads as a separate library with fresh state
    shutil.copy(lib_path, copy)
    fresh = _load(copy)
    a = np.zeros(4, np.float32)
    assert fresh.et_page_out(1, a.ctypes.data, a.nbytes) == ET_ERR_NOT_INIT
    assert fresh.et_page_in(1, a.ctypes.data, a.nbytes) == ET_ERR_NOT_INIT
    assert fresh.et_storage_init(str(tmp_path / "no_such_dir").encode()) == ET_OK
    assert fresh.et_page_out(1, a.ctypes.data, a.nbytes) == ET_ERR_IO


# -- host build vs Cortex-M4F under QEMU --------------------------------------------------------------

def _run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def test_host_and_qemu_cortex_m4f_give_bit_identical_results(tmp_path):
    """runtime/c/selftest/selftest.c runs every kernel on fixed data and pages each result out. Built for
    the host (stdio pages) and for the Cortex-M4F under QEMU (semihosting pages), the two page folders
    must be byte-identical; then a flipped byte in a page file must stop the MCU build with ET_ERR_CRC."""
    gcc = _gcc()
    arm, qemu = shutil.which("arm-none-eabi-gcc"), shutil.which("qemu-system-arm")
    if arm is None or qemu is None:
        pytest.skip("arm-none-eabi-gcc / qemu-system-arm missing (apt-get install gcc-arm-none-eabi "
                    "libnewlib-arm-none-eabi qemu-system-arm)")
    selftest, port = C_DIR / "selftest" / "selftest.c", C_DIR / "port" / BOARD.port
    host_dir, mcu_dir = tmp_path / "host", tmp_path / "mcu"
    host_dir.mkdir()
    mcu_dir.mkdir()

    # The host build as the generated Makefile makes it: with -mfma on x86-64 (fmaf inline), and without.
    fma_dir = tmp_path / "host_fma"
    fma_dir.mkdir()
    host_builds = [(host_dir, [])] + ([(fma_dir, ["-mfma"])] if platform.machine() in ("x86_64", "AMD64") else [])
    for page_dir, extra in host_builds:
        host_exe = tmp_path / f"selftest{''.join(extra)}"
        res = _run([gcc, *WARN, "-O2", "-ffp-contract=off", *extra, f"-I{C_DIR}", f'-DPAGE_DIR="{page_dir}"',
                    str(selftest), *map(str, HOST_SOURCES), "-o", str(host_exe), "-lm"])
        assert res.returncode == 0, res.stderr
        res = _run([str(host_exe)], timeout=60)
        assert res.returncode == 0, f"host selftest {extra} failed with {res.returncode}: {res.stdout}{res.stderr}"

    mcu_sources = [str(p) for p in SOURCES if p.name != "storage_stdio.c"]
    link = [str(port / "startup.c"), "--specs=nano.specs", "--specs=rdimon.specs", "-nostartfiles",
            "-T", str(port / "link.ld"), "-lm"]
    run_qemu = [qemu, "-M", BOARD.qemu_machine, "-nographic", "-monitor", "none",
                "-semihosting-config", "enable=on,target=native", "-kernel"]
    for variant, page_dir, elf in ((0, mcu_dir, tmp_path / "fw.elf"), (1, tmp_path / "corrupt", tmp_path / "fw_read.elf")):
        res = _run([arm, *WARN, *M4F, f"-I{C_DIR}", f'-DPAGE_DIR="{page_dir}"', f"-DSELFTEST_READ_PAGE1={variant}",
                    str(selftest), *mcu_sources, *link, "-o", str(elf)])
        assert res.returncode == 0, res.stderr
    res = _run([*run_qemu, str(tmp_path / "fw.elf")], timeout=120)
    assert res.returncode == 0, f"QEMU selftest failed with {res.returncode}: {res.stdout}{res.stderr}"

    host_files = sorted(p.name for p in host_dir.iterdir())
    assert len(host_files) > 30 and host_files == sorted(p.name for p in mcu_dir.iterdir())
    for page_dir, extra in host_builds:
        differ = [n for n in host_files if (page_dir / n).read_bytes() != (mcu_dir / n).read_bytes()]
        assert not differ, f"host {extra} and Cortex-M4F results differ in {differ}"

    # The MCU reads an intact page (exit 0) and stops on a corrupted one with ET_ERR_CRC (exit 4 = -rc).
    shutil.copytree(mcu_dir, tmp_path / "corrupt")
    res = _run([*run_qemu, str(tmp_path / "fw_read.elf")], timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    page = tmp_path / "corrupt" / "et_page_00000001.bin"
    raw = bytearray(page.read_bytes())
    raw[100] ^= 0x04
    page.write_bytes(bytes(raw))
    res = _run([*run_qemu, str(tmp_path / "fw_read.elf")], timeout=60)
    assert res.returncode == -ET_ERR_CRC, f"expected exit {-ET_ERR_CRC} (ET_ERR_CRC), got {res.returncode}"
