"""Bad input gets a clear error naming the problem and the fix, never a stack trace; plus one happy path.

Every error case runs the real CLI entry point twice: with --json (one JSON object on stdout, ok=false) and
without (a one-line `edgetrain <cmd>: error: ...` on stderr). Exit code 2 in both.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import edgetrain.compiler.passes as compile_mod  # the passes a compile runs: trace_model traces, run_scheduler solves
from edgetrain.compiler.schedule_file import format as schedule_format
from edgetrain.compiler.workbench.cli import main
from edgetrain.compiler.pipeline import CompileOptions, compile_model
from edgetrain.compiler.frontend.zoo import ZOO
from edgetrain.targets import list_targets

ROOT = Path(__file__).resolve().parents[1]


# -- helpers -----------------------------------------------------------------------------------------------

def _cli(capsys, *args) -> tuple[int, str, str]:
    try:
        rc = main([str(a) for a in args])
    except SystemExit as e:  # argparse's usage errors
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def expect_error(capsys, *args) -> str:
    """Run the command with and without --json; check both error forms; return the message."""
    rc, out, err = _cli(capsys, *args, "--json")
    assert rc == 2, (rc, out, err)
    assert "Traceback" not in out + err
    assert "error:" in err
    lines = out.strip().splitlines()
    assert len(lines) == 1, f"--json must print exactly one JSON object, got: {out!r}"
    obj = json.loads(lines[0])
    assert obj["ok"] is False and set(obj["error"]) == {"kind", "message"} and obj["error"]["message"]
    msg = obj["error"]["message"]
    assert msg in err

    rc2, out2, err2 = _cli(capsys, *args)
    assert rc2 == 2, (rc2, out2, err2)
    assert "Traceback" not in out2 + err2
    assert out2 == ""
    assert "error:" in err2 and msg in err2
    return msg


def _write_model(tmp_path: Path, name: str, body: str) -> tuple[Path, str]:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return path, f"{path}:make"


def _line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


def _compile_args(model, out, budget="100%", *extra):
    return ("compile", model, "--target", "rpi4", f"--budget={budget}", "--batch-size", "2", "--out", out, *extra)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> Path:
    """A small compiled plan, copied by the tests that damage it."""
    out = tmp_path_factory.mktemp("compiled") / "small_cnn"
    compile_model(CompileOptions(model="small_cnn", target="rpi4", budget="100%", out=str(out), batch_size=2))
    return out


@pytest.fixture
def plan_copy(compiled, tmp_path) -> Path:
    dst = tmp_path / "plan"
    shutil.copytree(compiled, dst)
    return dst


# -- (a) unsupported ops -------------------------------------------------------------------------------------

SIGMOID = """\
    import torch
    import torch.nn as nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(12, 4)

        def forward(self, x):
            x = x.flatten(1)
            return torch.sigmoid(self.fc(x))


    def make():
        return Net()


    make.input_shape = (3, 2, 2)
"""

SILU = """\
    import torch.nn as nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.act = nn.SiLU()
            self.fc = nn.Linear(4 * 4 * 4, 2)

        def forward(self, x):
            x = self.act(self.conv(x))
            return self.fc(x.flatten(1))


    def make():
        return Net()


    make.input_shape = (3, 4, 4)
"""


@pytest.mark.parametrize("name, body, op, fx_node, needle", [
    ("tanh_model", SIGMOID.replace("sigmoid", "tanh"), "aten.tanh.default", "tanh", "torch.tanh(self.fc(x))"),
    ("elu_model", SILU.replace("SiLU", "ELU"), "aten.elu.default", "elu", "self.act(self.conv(x))"),
])
def test_unsupported_op_names_op_node_source_and_what_is_supported(capsys, tmp_path, name, body, op, fx_node, needle):
    """The C runtime's kernel set is fixed: an op outside it is refused with its source line (the Python
    runtime runs every aten op, so the same model compiles for it)."""
    path, spec = _write_model(tmp_path, name, body)
    msg = expect_error(capsys, *_compile_args(spec, tmp_path / "out"), "--emit", "c")
    assert "cannot run in the C runtime" in msg
    assert f"op `{op}` has no kernel" in msg and f"node `{fx_node}` ({path.name}:{_line_of(path, needle)}" in msg
    assert "backward" in msg  # its backward op is listed too, in the same message
    assert "supports:" in msg
    for supported in ("2-D convolution", "linear layers", "ReLU", "max-pool", "cat along channels"):
        assert supported in msg


@pytest.mark.parametrize("case", ["corrupt", "usage"])
def test_real_process_prints_no_traceback(compiled, tmp_path, case):
    """The module entry point itself, in a fresh interpreter: exit 2, a one-line error, one JSON object.
    (Both cases fail before torch is imported, so they cost a fraction of a second.)"""
    if case == "corrupt":
        shutil.copytree(compiled, tmp_path / "p")
        (tmp_path / "p" / "schedule.json").write_text('{"format": "edgetrain.sched')
        args, start, words = ["inspect", str(tmp_path / "p")], "edgetrain inspect: error: ", ["corrupt", "recompile"]
    else:
        args = ["compile", "small_cnn", "--target", "rpi4", "--budget", "1MB", "--out", str(tmp_path / "o"),
                "--batch-size", "0"]
        start, words = "usage: edgetrain compile", ["--batch-size", "at least 1"]
    p = subprocess.run([sys.executable, "-m", "edgetrain.compiler.workbench.cli", *args, "--json"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stdout + p.stderr
    assert p.stderr.startswith(start) and "error: " in p.stderr
    obj = json.loads(p.stdout)
    assert obj["ok"] is False and all(w in obj["error"]["message"] for w in words)
    assert not (tmp_path / "o").exists()


# -- (b) data-dependent control flow ----------------------------------------------------------------------

CONTROL_FLOW = """\
    import torch.nn as nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(12, 4)

        def forward(self, x):
            x = x.flatten(1)
            if x.sum() > 0:
                x = x * 1
            return self.fc(x)


    def make():
        return Net()


    make.input_shape = (3, 2, 2)
"""


def test_data_dependent_control_flow_names_file_and_line(capsys, tmp_path):
    path, spec = _write_model(tmp_path, "branchy", CONTROL_FLOW)
    msg = expect_error(capsys, *_compile_args(spec, tmp_path / "out"))
    assert "control flow" in msg
    assert f"{path.name}:{_line_of(path, 'if x.sum() > 0:')}" in msg


def test_factory_that_needs_arguments_says_which(capsys, tmp_path):
    path, spec = _write_model(tmp_path, "needs_args", """\
    import torch.nn as nn


    def make(width):
        return nn.Linear(width, 2)
""")
    msg = expect_error(capsys, *_compile_args(spec, tmp_path / "out"))
    assert "needs argument(s) width" in msg and "Traceback" not in msg


# -- (c) a budget below the minimum ---------------------------------------------------------------------------

def test_budget_below_minimum_states_the_smallest_feasible_budget(capsys, tmp_path):
    out = tmp_path / "out"
    msg = expect_error(capsys, *_compile_args("small_cnn", out, "1KB"))
    m = re.search(r"smallest feasible budget[^:]*: (\d+) B", msg)
    assert m, msg
    smallest = int(m.group(1))
    assert f"at least {smallest}B" in msg  # the fix, in a form --budget accepts
    rc, stdout, err = _cli(capsys, *_compile_args("small_cnn", out, "100%"), "--json")
    assert rc == 0, err
    assert json.loads(stdout)["min_feasible_bytes"] == smallest
    # "Smallest" is exact: one byte less is refused with the same figure, the figure itself compiles.
    assert f": {smallest} B" in expect_error(capsys, *_compile_args("small_cnn", out, str(smallest - 1)))
    rc, stdout, err = _cli(capsys, *_compile_args("small_cnn", out, f"{smallest}B"), "--json")
    assert rc == 0, err
    r = json.loads(stdout)
    assert r["ok"] is True and r["budget_bytes"] == smallest and r["peak_bytes"] <= smallest


# -- (d, e, f) damaged schedule files --------------------------------------------------------------------

@pytest.mark.parametrize("cmd", ["run", "inspect"])
@pytest.mark.parametrize("keep", [0.0, 0.5, 0.999])
def test_corrupt_schedule_says_corrupt_and_to_recompile(capsys, plan_copy, cmd, keep):
    path = plan_copy / "schedule.json"
    text = path.read_text()
    path.write_text(text[: int(len(text) * keep)])
    msg = expect_error(capsys, cmd, plan_copy)
    assert "corrupt" in msg and "recompile" in msg


def test_other_format_version_says_version(capsys, plan_copy):
    path = plan_copy / "schedule.json"
    body = json.loads(path.read_text())
    body["version"] = schedule_format.FORMAT_VERSION + 1
    path.write_text(json.dumps(body))  # checksum deliberately not recomputed: the version check comes first
    msg = expect_error(capsys, "run", plan_copy)
    assert f"version {schedule_format.FORMAT_VERSION + 1}" in msg
    assert f"reads version {schedule_format.FORMAT_VERSION}" in msg and "recompile" in msg


def _edit_one_step(body: dict) -> None:
    names = [n["name"] for n in body["graph"]["nodes"]]
    step = next(s for s in body["steps"] if s["action"] == "free")
    step["tensor"] = next(n for n in names if n != step["tensor"] and n not in ("input", "labels"))


def test_hand_edited_schedule_is_a_checksum_mismatch(capsys, plan_copy):
    path = plan_copy / "schedule.json"
    body = json.loads(path.read_text())
    _edit_one_step(body)
    path.write_text(json.dumps(body, indent=1, sort_keys=True))
    msg = expect_error(capsys, "run", plan_copy)
    assert "checksum mismatch" in msg and "recompile" in msg


def test_hand_edit_with_a_recomputed_checksum_is_still_refused_before_running(capsys, plan_copy):
    path = plan_copy / "schedule.json"
    body = json.loads(path.read_text())
    _edit_one_step(body)
    body["checksum"] = schedule_format._checksum(body)
    path.write_text(json.dumps(body))
    msg = expect_error(capsys, "run", plan_copy)
    assert "step" in msg  # the validator's replay names the broken step
    assert not (plan_copy / "pages").exists()  # nothing ran


def test_plan_from_another_schedule_is_refused(capsys, plan_copy):
    path = plan_copy / "schedule.json"
    body = json.loads(path.read_text())
    body["seed"] += 1  # a different, valid schedule: plan.py no longer matches it
    schedule_format.save({k: v for k, v in body.items() if k not in ("format", "version", "checksum")}, plan_copy)
    msg = expect_error(capsys, "run", plan_copy)
    assert "plan.py" in msg and "another schedule" in msg and "recompile" in msg


def test_missing_schedule_says_to_compile_first(capsys, tmp_path):
    msg = expect_error(capsys, "run", tmp_path / "nothing-here")
    assert "no schedule" in msg and "edgetrain compile" in msg


# -- (g) unknown target, (k) unknown model ---------------------------------------------------------------

def test_unknown_target_lists_known_targets(capsys, tmp_path):
    msg = expect_error(capsys, "compile", "small_cnn", "--target", "rpi5", "--budget", "1MB", "--out", tmp_path / "o")
    assert "rpi5" in msg
    known = list_targets()
    assert {"rpi4", "host", "nrf52840"} <= set(known)
    for name in known:
        assert name in msg


def test_unknown_model_lists_zoo_names(capsys, tmp_path):
    msg = expect_error(capsys, *_compile_args("resnet99", tmp_path / "o"))
    assert "resnet99" in msg
    for name in ZOO:
        assert name in msg


@pytest.mark.parametrize("spec, words", [
    ("{tmp}/missing.py:make", ["does not exist"]),
    ("{tmp}/broken.py:make", ["importing", "SyntaxError"]),
    ("{tmp}/broken_ok.py:nothing", ["no attribute", "nothing"]),
    ("no_such_package.models:make", ["cannot import"]),
])
def test_unloadable_model_specs(capsys, tmp_path, spec, words):
    (tmp_path / "broken.py").write_text("def make(:\n")
    (tmp_path / "broken_ok.py").write_text("x = 1\n")
    msg = expect_error(capsys, *_compile_args(spec.format(tmp=tmp_path), tmp_path / "o"))
    for w in words:
        assert w in msg


# -- (h) unwritable output directory ---------------------------------------------------------------------

def test_unwritable_output_directory_fails_before_any_work(capsys, tmp_path, monkeypatch):
    def must_not_run(*a, **k):
        raise AssertionError("traced or solved before checking the output directory")

    monkeypatch.setattr(compile_mod, "trace_model", must_not_run)
    monkeypatch.setattr(compile_mod, "run_scheduler", must_not_run)
    (tmp_path / "afile").write_text("a file, not a folder")
    out = tmp_path / "afile" / "out"
    msg = expect_error(capsys, *_compile_args("small_cnn", out))
    assert "cannot write to output directory" in msg and str(out) in msg
    assert "--out" in msg


# -- (i) malformed budgets and deadlines, and other usage errors -----------------------------------------

@pytest.mark.parametrize("budget", ["abc", "12XB", "-5MB", "0", "2 MB B", "1001%", "%", "x%", "1e6"])
def test_malformed_budget(capsys, tmp_path, monkeypatch, budget):
    monkeypatch.setattr(compile_mod, "trace_model", lambda *a, **k: pytest.fail("traced a model for a bad budget"))
    msg = expect_error(capsys, *_compile_args("small_cnn", tmp_path / "o", budget))
    assert f"budget {budget!r}" in msg
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("deadline", ["soon", "0.5", "-1s", "0ms"])
def test_malformed_deadline(capsys, tmp_path, deadline):
    msg = expect_error(capsys, *_compile_args("small_cnn", tmp_path / "o", "100%", f"--deadline={deadline}"))
    assert f"deadline {deadline!r}" in msg


@pytest.mark.parametrize("args, words", [
    (("compile", "small_cnn", "--target", "rpi4", "--budget", "1MB", "--out", "OUT", "--batch-size", "0"),
     ["--batch-size", "at least 1"]),
    (("compile", "small_cnn", "--target", "rpi4", "--budget", "1MB", "--out", "OUT", "--batch-size", "two"),
     ["--batch-size", "whole number"]),
    (("compile", "small_cnn", "--target", "rpi4", "--budget", "1MB", "--out", "OUT", "--input-shape", "3,x"),
     ["--input-shape", "C,H,W"]),
    (("compile", "small_cnn", "--budget", "1MB", "--out", "OUT"), ["--target"]),
    (("compile", "small_cnn", "--target", "rpi4", "--budget", "1MB", "--out", "OUT", "--scheduler", "magic"),
     ["--scheduler", "magic"]),
    (("run", "OUT", "--steps", "0"), ["--steps", "at least 1"]),
    (("inspect",), ["dir"]),
    (("compile", "small_cnn", "--target", "rpi4", "--budget", "1MB", "--out", "OUT", "--lns", "0.9"),
     ["--lns", "[0, 0.8)"]),
    (("compile", "small_cnn", "--target", "rpi4", "--budget", "1MB", "--out", "OUT", "--cuts", "0.15"),
     ["--cuts", "--lns"]),
    (("compile", "small_cnn", "--target", "rpi4", "--budget", "1MB", "--out", "OUT", "--lns", "0.5", "--cuts",
      "0.3"), ["below 0.8"]),
])
def test_usage_errors(capsys, tmp_path, args, words):
    args = [str(tmp_path / "o") if a == "OUT" else a for a in args]
    msg = expect_error(capsys, *args)
    for w in words:
        assert w in msg


def test_input_shape_the_model_cannot_take(capsys, tmp_path):
    msg = expect_error(capsys, *_compile_args("small_cnn", tmp_path / "o", "100%", "--input-shape", "3,32,32"))
    assert "(2, 3, 32, 32)" in msg and "--input-shape" in msg and "1 channels" in msg


@pytest.mark.parametrize("device", ["toaster", "cuda"])
def test_bad_run_device(capsys, compiled, device):
    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("CUDA is available")
    msg = expect_error(capsys, "run", compiled, "--device", device)
    assert device in msg and "cpu" in msg


# -- (j) one module called twice -------------------------------------------------------------------------

SHARED = """\
    import torch.nn as nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(12, 12)
            self.head = nn.Linear(12, 3)

        def forward(self, x):
            x = x.flatten(1)
            x = self.fc(x)
            x = self.fc(x)
            return self.head(x)


    def make():
        return Net()


    make.input_shape = (3, 2, 2)
"""


def test_module_called_twice(capsys, tmp_path):
    """The C backend keeps one gradient per layer; the Python backend sums the gradients of a shared module
    as autograd does (tests/test_user_models.py trains a tied LM head exactly)."""
    path, spec = _write_model(tmp_path, "shared", SHARED)
    msg = expect_error(capsys, *_compile_args(spec, tmp_path / "o"), "--emit", "c")
    assert "fc.weight" in msg and "more than once" in msg
    assert "own module" in msg  # the fix
    calls = [i for i, line in enumerate(path.read_text().splitlines(), 1) if "x = self.fc(x)" in line]
    assert any(f"{path.name}:{line}" in msg for line in calls)


# -- the happy path --------------------------------------------------------------------------------------

def test_compile_run_inspect_happy_path(capsys, tmp_path):
    out = tmp_path / "plan"
    args = ("compile", "small_cnn", "--target", "rpi4", "--budget", "80%", "--batch-size", "4", "--out", out)
    rc, stdout, err = _cli(capsys, *args, "--json")
    assert rc == 0, err
    c = json.loads(stdout)
    assert c["ok"] is True and c["model"] == "small_cnn" and c["target"] == "rpi4"
    assert c["peak_bytes"] <= c["budget_bytes"] < c["store_all_peak_bytes"]
    assert {"schedule.json", "plan.py", "weights.safetensors"} <= set(os.listdir(out))

    rc, stdout, err = _cli(capsys, "run", out, "--steps", "2", "--check", "--json")
    assert rc == 0, err
    r = json.loads(stdout)
    assert r["ok"] is True and r["checked"] is True and r["steps"] == 2 and len(r["losses"]) == 2
    assert r["measured_peak_bytes"] == r["predicted_peak_bytes"] <= r["budget_bytes"] == c["budget_bytes"]
    assert r["predicted_peak_bytes"] == c["peak_bytes"]
    assert r["max_rel_err"] <= 1e-5
    assert r["losses"] == pytest.approx(r["reference_losses"], rel=1e-5)

    rc, stdout, err = _cli(capsys, "inspect", out, "--json")
    assert rc == 0, err
    i = json.loads(stdout)
    for key in ("model", "target", "scheduler", "stages", "active_stages", "budget_bytes", "min_feasible_bytes",
                "peak_bytes", "store_all_peak_bytes", "energy_j", "store_all_energy_j", "time_s",
                "store_all_time_s", "recomputes", "page_ins", "page_outs", "solver"):
        assert key in i, key
    assert i["peak_bytes"] == c["peak_bytes"] and i["stages"] == c["nodes"]
    assert i["recomputes"] + i["page_ins"] == c["recomputes"] + c["page_ins"] > 0  # 50% needs a trick

    # The human forms of the three commands print without error.
    rc, stdout, err = _cli(capsys, *args)
    assert rc == 0, err
    assert "small_cnn on rpi4" in stdout and "wrote" in stdout
    rc, stdout, err = _cli(capsys, "run", out, "--steps", "1", "--check")
    assert rc == 0, err
    assert "OK" in stdout and "measured peak" in stdout
    rc, stdout, err = _cli(capsys, "inspect", out)
    assert rc == 0, err
    assert "schedule vs store-all" in stdout
    assert "Traceback" not in stdout + err
