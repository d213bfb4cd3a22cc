"""`run --check` on C firmware: a tensor that misses rtol/atol against eager float32 passes only when the firmware is
as close to a float64 run of the same steps as eager float32 is (compiler/workbench/check_rules.py); a kernel bug
(a wrong sign, an off-by-one, an error well beyond rounding) still fails, on real firmware trained on the host."""
from __future__ import annotations

import shutil

import pytest
import torch

from edgetrain.compiler.pipeline import CompileOptions, compile_model
from edgetrain.compiler.workbench import run_c
from edgetrain.compiler.workbench.check_rules import NEAR_BOUND_EPS, ROUNDING_FACTOR, NearBounds, check_tensors
from edgetrain.compiler.workbench.report import print_human

HAVE_HOST = bool(shutil.which("gcc") and shutil.which("make"))


def _rounded(seed: int, scale: float, ref64: torch.Tensor) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (ref64 + scale * torch.randn(ref64.shape, generator=g, dtype=torch.float64)).float()


def _never():
    raise AssertionError("the float64 run is needed only where a tensor misses rtol/atol")


def test_within_rtol_needs_no_float64_run():
    w = torch.randn(8, 4)
    checks = check_tensors({"w": w.clone()}, {"w": w}, _never)
    assert [(c.name, c.rule, c.float64_err) for c in checks] == [("w", "rtol", None)]


def test_rounding_of_float32s_size_passes_by_float64_and_bugs_fail():
    ref64 = torch.randn(64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    eager = _rounded(1, 3e-5, ref64)  # eager float32 3e-5 from float64: as a batch norm over 4 values can be
    ours = _rounded(2, 3e-5, ref64)  # the firmware as far, in another order
    runs = []

    def float64_run():
        runs.append(1)
        return {"w": ref64}

    (c,) = check_tensors({"w": ours}, {"w": eager}, float64_run)
    assert runs == [1] and c.rule == "float64" and c.max_rel_err > 1e-5  # it missed the plain rule
    assert c.float64_err <= ROUNDING_FACTOR * c.eager_float64_err
    assert c.to_json()["rule"] == "float64" and "against float64" in c.describe()
    sign = ours.clone()
    sign[7] = -sign[7]  # a wrong sign on one element
    shifted = torch.roll(ours, 1)  # an off-by-one
    beyond = ours.clone()
    beyond[3] += 1e-3  # 9x eager float32's worst error here (1.1e-4), on one element
    for bug in (sign, shifted, beyond):
        (c,) = check_tensors({"w": bug}, {"w": eager}, lambda: {"w": ref64})
        assert c.rule == "failed" and c.float64_err > ROUNDING_FACTOR * c.eager_float64_err


def test_an_exact_eager_float32_leaves_no_room():
    ref64 = torch.randn(16, dtype=torch.float64)
    eager = ref64.float()
    ours = eager.clone()
    ours[0] += 1e-3
    (c,) = check_tensors({"w": ours}, {"w": eager}, lambda: {"w": ref64})
    assert c.rule == "failed"


def test_near_bounds_counts_relu_inputs_within_rounding_of_a_bound_not_on_it():
    """A ReLU's or ReLU6's input within NEAR_BOUND_EPS float32 epsilons (of the input's largest magnitude) of a
    bound takes its mask from the order of a sum; one exactly on a bound, or far from it, does not count."""
    tol = NEAR_BOUND_EPS * torch.finfo(torch.float32).eps * 4.0
    x = torch.tensor([0.0, tol / 2, -tol / 2, 2 * tol, 4.0 - 3 * tol, 4.0 - tol / 2, 3.0, -1.0])
    with NearBounds() as nb:
        torch.relu(x)  # near 0: tol/2 and -tol/2
        torch.nn.functional.hardtanh(x.clone(), 0.0, 4.0, inplace=True)  # and 4 - tol/2 near its top
        torch.nn.functional.relu(torch.tensor([5.0, -3.0]))  # nothing near
    assert nb.counts == {"relu on (8,)": 2, "hardtanh_ on (8,)": 3}, nb.counts
    assert "5 ReLU inputs" in nb.describe() and "may be rounding" in nb.describe()
    with NearBounds() as quiet:
        torch.relu(torch.tensor([1.0, -1.0, 0.0]))
    assert not quiet.counts and quiet.describe() == ""


def test_a_failed_python_check_says_whether_relu_masks_sit_within_rounding(tmp_path, monkeypatch):
    """The check's failure runs the reference once more watching its ReLUs' inputs (run.py) and reports them."""
    from edgetrain.compiler.workbench import run

    out = tmp_path / "p"
    compile_model(CompileOptions(model="small_cnn", target="rpi4", budget="100%", out=str(out), batch_size=2,
                                 time_limit=10.0))
    real = run._compare
    monkeypatch.setattr(run, "_compare", lambda *a, **kw: (*real(*a, **kw)[:2], ["param fc.weight"]))
    r = run.run_plan(str(out), steps=1, check=True)
    assert not r["ok"] and r["error_kind"] == "CheckMismatch" and r["mismatched"] == ["param fc.weight"]
    assert isinstance(r["near_bound_relu_inputs"], dict)
    assert ("within float32 rounding" in r["error"]) == bool(r["near_bound_relu_inputs"])


@pytest.fixture(scope="module")
def fw(tmp_path_factory):
    out = tmp_path_factory.mktemp("check") / "o"
    compile_model(CompileOptions(model="tests.c_models:tiny_bn_on_few_positions", target="nrf52840", budget="100%",
                                 out=str(out), batch_size=2, emit="c", time_limit=10.0))
    return str(out)


@pytest.mark.skipif(not HAVE_HOST, reason="gcc and make build the host firmware")
def test_real_firmware_passes_and_an_injected_kernel_bug_fails(fw, monkeypatch, capsys):
    r = run_c.run_firmware(fw, qemu=False, steps=2, check=True)
    assert r["ok"] and not r["mismatched"] and r["within_rtol"] >= 10 and r["check_tensors"] == [], r.get("error")
    real = run_c.run_program

    def with_bug(bug):
        def run(*a, **kw):
            ran = real(*a, **kw)
            ran.result["params"] = {k: bug(v) if k == "bn_head.running_mean" else v
                                    for k, v in ran.result["params"].items()}
            return ran
        return run

    def negate_first(v):
        v = v.clone()
        v[0] = -v[0]
        return v

    for bug in (negate_first, lambda v: torch.roll(v, 1)):
        monkeypatch.setattr(run_c, "run_program", with_bug(bug))
        r = run_c.run_firmware(fw, qemu=False, steps=2, check=True)
        assert not r["ok"] and r["error_kind"] == "CheckMismatch" and r["mismatched"] == ["param bn_head.running_mean"]
        (c,) = r["check_tensors"]
        assert c["rule"] == "failed" and c["float64_err"] > ROUNDING_FACTOR * c["eager_float64_err"]
        assert "bn_head.running_mean" in r["error"] and "float64" in r["error"]
        assert isinstance(r["near_bound_relu_inputs"], dict)  # the ReLUs' inputs watched on a failure
    print_human("run", r)  # the text says which tensor went to the float64 run, with its figures
    text = capsys.readouterr().out
    assert "held to a float64 run" in text and "bn_head.running_mean" in text and "FAILED" in text


def test_a_python_plan_not_bitwise_is_held_to_float64_as_firmware_is():
    """A fused or channels-last Python plan's tensor that missed its tolerance: the same float64 rule (run.py:
    _held_to_float64) passes rounding no larger in kind than eager float32's and fails an error beyond it, and a
    tensor the plan does not hold or that is not floating stays failed."""
    from types import SimpleNamespace

    from torch import nn

    from edgetrain.compiler.workbench.run import _held_to_float64

    ref64 = torch.randn(16, 8, dtype=torch.float64)
    eager = nn.Linear(8, 16)
    model64 = nn.Linear(8, 16).double()
    with torch.no_grad():
        eager.weight.copy_(_rounded(0, 1e-4, ref64))
        model64.weight.copy_(ref64)
    eager.register_buffer("steps", torch.tensor(3))
    close = _rounded(1, 2e-4, ref64)  # twice eager's distance from float64: rounding
    far = _rounded(2, 1e-2, ref64)  # a hundred times it: a wrong kernel
    for ours, verdict in ((close, "float64"), (far, "failed")):
        rt = SimpleNamespace(params={"weight": ours, "bias": eager.bias.detach()}, buffers={"steps": torch.tensor(4)})
        held = {c.name: c for c in _held_to_float64(["param weight", "buffer steps", "param missing"], eager, model64,
                                                    rt)}
        assert held["param weight"].rule == verdict, held["param weight"]
        assert held["param weight"].float64_err > 0 and held["param weight"].eager_float64_err > 0
        assert held["buffer steps"].rule == "failed" and held["param missing"].rule == "failed"
