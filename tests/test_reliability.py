"""Nothing half-done, nothing silent: atomic compile outputs, checked folders, steps that must end, finite
values, one error shape. Every fault is real: truncated and edited files, flipped bits, SIGKILLs of real
compiles, a full disk, NaN weights, two processes at once.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from edgetrain.compiler.pipeline import CompileOptions, compile_model
from edgetrain.compiler.workbench.cli import main
from edgetrain.runtime.python import IntegrityError, Runtime, WeightsError, load_plan
from edgetrain.runtime.python.checks import PeakMismatchError, check_peak, checked_step
from edgetrain.runtime.python.integrity import file_table, json_checksum, verify_folder
from tests.kill_at import kill_at

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "edgetrain.compiler.workbench.cli"]
SMALL = dict(model="small_cnn", target="rpi4", budget="85%", batch_size=2, time_limit=10)


def _cli(capsys, *args) -> tuple[int, dict | str, str]:
    try:
        rc = main([str(a) for a in args])
    except SystemExit as e:
        rc = e.code
    out = capsys.readouterr()
    if "--json" in args:
        lines = out.out.strip().splitlines()
        assert len(lines) == 1, out.out
        return rc, json.loads(lines[0]), out.err
    return rc, out.out, out.err


def expect_refusal(capsys, kind: str, *args) -> str:
    """--json: exit 2, one JSON error object of `kind`, no traceback; returns the message."""
    rc, obj, err = _cli(capsys, *args, "--json")
    assert rc == 2, (rc, obj, err)
    assert "Traceback" not in err
    assert obj["ok"] is False and obj["error"]["kind"] == kind, obj
    return obj["error"]["message"]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def resign(folder: Path) -> None:
    """Record the folder's files as they are now (what a buggy compiler would have written)."""
    path = folder / "schedule.json"
    body = json.loads(path.read_text())
    body["outputs"]["files"] = file_table(folder)
    body["outputs"]["tensors"] = {k: {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
                                  for k, t in sorted(load_file(folder / "weights.safetensors").items())}
    body["checksum"] = json_checksum(body)
    path.write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rel") / "small"
    compile_model(CompileOptions(out=str(out), **SMALL))
    return out


@pytest.fixture
def plan(compiled, tmp_path) -> Path:
    dst = tmp_path / "plan"
    shutil.copytree(compiled, dst)
    return dst


# -- 1. atomic outputs, recorded and verified ---------------------------------------------------------------

def test_schedule_records_every_generated_file_and_the_weights(plan):
    body = json.loads((plan / "schedule.json").read_text())
    files = body["outputs"]["files"]
    assert set(files) == {"plan.py", "weights.safetensors"}
    assert verify_folder(plan) == body["outputs"]
    assert set(body["outputs"]["tensors"]) == set(load_file(plan / "weights.safetensors"))


@pytest.mark.parametrize("fault", ["truncate", "prepend", "edit-line", "bitflip-weights", "delete-weights",
                                   "extra-code"])
def test_changed_folder_is_refused_before_plan_py_runs(plan, capsys, tmp_path, fault):
    marker = tmp_path / "plan-py-ran"
    text = (plan / "plan.py").read_text()
    if fault == "truncate":  # what a compile killed while writing left: 32,768 bytes, cut mid-plan
        (plan / "plan.py").write_text(text[:32768] if len(text) > 32768 else text[: len(text) // 2])
        name = "plan.py"
    elif fault == "prepend":
        (plan / "plan.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n" + text)
        name = "plan.py"
    elif fault == "edit-line":  # one call's literal changed, still valid Python: a different convolution
        lines = text.splitlines(keepends=True)
        at = next(i for i, line in enumerate(lines) if "aten.convolution.default" in line and "[1, 1]" in line)
        lines[at] = lines[at].replace("[1, 1]", "[2, 2]", 1)
        (plan / "plan.py").write_text("".join(lines))
        name = "plan.py"
    elif fault == "bitflip-weights":
        raw = bytearray((plan / "weights.safetensors").read_bytes())
        raw[len(raw) - 5] ^= 0x10
        (plan / "weights.safetensors").write_bytes(bytes(raw))
        name = "weights.safetensors"
    elif fault == "delete-weights":
        (plan / "weights.safetensors").unlink()
        name = "weights.safetensors"
    else:
        (plan / "helper.py").write_text(f"open({str(marker)!r}, 'w')\n")
        name = "helper.py"
    for cmd in (["run", plan, "--steps", "1"], ["inspect", plan]):
        msg = expect_refusal(capsys, "IntegrityError", *cmd)
        assert name in msg
    with pytest.raises(IntegrityError, match=name):  # the device API refuses it too, before importing
        load_plan(plan)
    assert not marker.exists()


def _compile_cmd(out: Path, model: str = "small_cnn", budget: str = "85%") -> list[str]:
    return [*CLI, "compile", model, "--target", "rpi4", "--budget", budget, "--batch-size", "2",
            "--time-limit", "10", "--out", str(out), "--json"]


def _staged_files(out: Path) -> list[str]:
    """The files of the compile's staging folder beside `out` (asserting there is one)."""
    (staging,) = [p for p in out.parent.iterdir() if p.is_dir() and p.name.startswith(f".{out.name}.edgetrain-tmp-")]
    return sorted(q.relative_to(staging).as_posix() for q in staging.rglob("*") if q.is_file())


# A real compile in its own process, announcing its stages on stderr (the pipeline's progress lines). At the
# stage the test names it holds, reading stdin, until the test's SIGKILL lands: killed at that stage however
# loaded the machine is, never after the compile has finished.
KILLABLE_COMPILE = r"""
import sys
from edgetrain.compiler.pipeline import CompileOptions, compile_model

def announce(msg):
    print(msg, file=sys.stderr, flush=True)
    if msg.startswith(sys.argv[2]):
        sys.stdin.readline()

compile_model(CompileOptions(out=sys.argv[1], model="mlp", target="rpi4", budget="100%", batch_size=2,
                             time_limit=10), progress=announce)
"""


@pytest.mark.parametrize("when, stage, staged", [
    ("early", "tracing", []),  # the staging folder made, nothing traced yet
    ("middle", "solving", []),  # traced, the schedule being solved
    ("while-writing", "recording the outputs", ["plan.py", "weights.safetensors"]),  # all but schedule.json
])
def test_killed_compile_leaves_the_previous_output_untouched(plan, capsys, when, stage, staged):
    before = _snapshot(plan)
    seen = kill_at([sys.executable, "-c", KILLABLE_COMPILE, str(plan), stage], lambda line: line.startswith(stage),
                   cwd=ROOT, then=lambda: _staged_files(plan))
    assert seen == staged
    assert _staged_files(plan) == staged  # the killed compile's leftovers, beside the untouched folder
    assert _snapshot(plan) == before
    rc, r, _ = _cli(capsys, "run", plan, "--steps", "1", "--json")
    assert rc == 0 and r["ok"], r
    # The next compile removes what the killed one left beside the folder, and swaps its own in.
    assert compile_model(CompileOptions(out=str(plan), **dict(SMALL, budget="90%")))["out"] == str(plan)
    assert not [q for q in plan.parent.iterdir() if ".edgetrain-tmp-" in q.name]
    verify_folder(plan)


def test_two_concurrent_compiles_into_one_folder_do_not_mix(tmp_path):
    out = tmp_path / "o"
    ps = [subprocess.Popen(_compile_cmd(out, model=m, budget="100%"), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True) for m in ("small_cnn", "mlp")]
    results = [p.communicate(timeout=300) for p in ps]
    assert all(p.returncode == 0 for p in ps), results
    outputs = verify_folder(out)  # one complete compile, all of its files
    model = json.loads((out / "schedule.json").read_text())["model"]["spec"]
    assert model in ("small_cnn", "mlp")
    assert set(outputs["tensors"]) == set(load_file(out / "weights.safetensors"))


def test_compile_on_a_full_disk_keeps_the_previous_output(tmp_path, capsys):
    if os.geteuid() != 0:
        pytest.skip("a real full disk needs a tmpfs mount (root)")
    mnt = tmp_path / "small-disk"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)]).returncode != 0:
        pytest.skip("tmpfs cannot be mounted here")
    try:
        out = mnt / "o"
        compile_model(CompileOptions(out=str(out), **SMALL))
        before = _snapshot(out)
        msg = expect_refusal(capsys, "StorageFull", "compile", "mlp", "--target", "rpi4", "--budget", "100%",
                             "--batch-size", "2", "--out", out)  # mlp's weights (2.4 MB) do not fit beside
        assert "space" in msg
        assert _snapshot(out) == before
        assert [p.name for p in mnt.iterdir()] == ["o"]  # nothing half-written left behind
    finally:
        subprocess.run(["umount", str(mnt)])


def test_out_holding_foreign_files_is_refused(tmp_path, capsys):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    msg = expect_refusal(capsys, "OutputDirError", "compile", "small_cnn", "--target", "rpi4", "--budget", "100%",
                         "--out", tmp_path / "mine")
    assert "did not write" in msg and (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


# -- 2. weights bound to the schedule -----------------------------------------------------------------------

def test_weights_of_another_model_are_refused_at_load(plan, tmp_path):
    other = tmp_path / "other"
    compile_model(CompileOptions(out=str(other), model="small_cnn", target="rpi4", budget="100%", batch_size=2,
                                 model_kwargs={"num_classes": 7}))
    expected = json.loads((plan / "schedule.json").read_text())["outputs"]["tensors"]
    with pytest.raises(WeightsError, match=r"'param/[^']*'.* is float32\[7"):
        Runtime(other / "weights.safetensors", tmp_path / "pages", lr=0.1, momentum=0.9, weight_decay=0.0,
                expected_tensors=expected)
    tensors = load_file(plan / "weights.safetensors")
    tensors.pop(next(iter(tensors)))
    save_file(tensors, tmp_path / "fewer.safetensors")
    with pytest.raises(WeightsError, match="lacks 1 tensor"):
        Runtime(tmp_path / "fewer.safetensors", tmp_path / "pages", lr=0.1, momentum=0.9, weight_decay=0.0,
                expected_tensors=expected)
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 100)
    with pytest.raises(WeightsError, match="corrupt"):
        Runtime(tmp_path / "junk.safetensors", tmp_path / "pages", lr=0.1, momentum=0.9, weight_decay=0.0)


def test_swapped_head_through_the_cli_is_refused(plan, tmp_path, capsys):
    other = tmp_path / "other"
    compile_model(CompileOptions(out=str(other), model="small_cnn", target="rpi4", budget="100%", batch_size=2,
                                 model_kwargs={"num_classes": 7}))
    shutil.copyfile(other / "weights.safetensors", plan / "weights.safetensors")
    assert "weights.safetensors" in expect_refusal(capsys, "IntegrityError", "run", plan)
    body = json.loads((plan / "schedule.json").read_text())  # re-signed files, but the table is the schedule's
    body["outputs"]["files"] = file_table(plan)
    body["checksum"] = json_checksum(body)
    (plan / "schedule.json").write_text(json.dumps(body))
    msg = expect_refusal(capsys, "WeightsError", "run", plan)
    assert "float32[7" in msg and "recompile" in msg


# -- 3. every step ends; measured peak = predicted peak --------------------------------------------------------

def _cut_plan(plan: Path) -> None:
    """plan.py ending in the middle of the backward pass, on a whole line (valid Python)."""
    lines = (plan / "plan.py").read_text().splitlines(keepends=True)
    bwd = [i for i, line in enumerate(lines) if line.startswith("    # -- stage") and "(backward)" in line]
    (plan / "plan.py").write_text("".join(lines[: bwd[len(bwd) // 2]]))


@pytest.mark.parametrize("steps", [1, 3])
def test_a_plan_that_never_ends_its_step_fails(plan, capsys, steps):
    _cut_plan(plan)
    resign(plan)  # as if the compiler itself had written it
    msg = expect_refusal(capsys, "PlanError", "run", plan, "--steps", steps)
    assert "step 0 never reached its end" in msg


def test_measured_peak_differing_from_the_prediction_fails_loudly(plan, capsys):
    text = (plan / "plan.py").read_text()
    predicted = json.loads((plan / "schedule.json").read_text())["predicted"]["peak_bytes"]
    old = f'"predicted_peak_bytes": {predicted},'
    assert old in text
    (plan / "plan.py").write_text(text.replace(old, f'"predicted_peak_bytes": {predicted - 4},'))
    resign(plan)
    msg = expect_refusal(capsys, "PeakMismatchError", "run", plan)
    assert f"measured peak {predicted} B" in msg and f"predicted peak {predicted - 4} B" in msg


def test_check_peak_accepts_equal_and_refuses_other(plan, tmp_path):
    mod = load_plan(plan)
    from edgetrain.runtime.python import runtime_for

    rt = runtime_for(mod, storage_dir=tmp_path / "pages", device="cpu")
    shape = mod.PLAN["input_shape"]
    checked_step(mod, rt, torch.randn(*shape), torch.randint(0, 10, (shape[0],)))
    check_peak(rt, mod.PLAN["predicted_peak_bytes"], 0)
    with pytest.raises(PeakMismatchError):
        check_peak(rt, mod.PLAN["predicted_peak_bytes"] + 1, 0)


# -- 4. non-finite values ------------------------------------------------------------------------------------

def test_nan_weights_are_refused_naming_the_tensor(plan, capsys):
    tensors = load_file(plan / "weights.safetensors")
    key = next(k for k in tensors if k.startswith("param/"))
    tensors[key] = tensors[key].clone()
    tensors[key].view(-1)[0] = float("nan")
    save_file(tensors, plan / "weights.safetensors")
    resign(plan)
    msg = expect_refusal(capsys, "NonFiniteError", "run", plan, "--steps", "2")
    assert f"'{key.partition('/')[2]}'" in msg and "before any training step" in msg
    rc, out, err = _cli(capsys, "run", plan, "--steps", "2")  # human output: the message, not markup soup
    assert rc == 2 and "NaN" in err and "Traceback" not in err


def test_nan_data_and_a_diverging_run_stop_at_their_step(plan, tmp_path, capsys):
    x = np.random.default_rng(0).standard_normal((8, 1, 28, 28)).astype(np.float32)
    x[5, 0, 3, 3] = np.nan  # in the third batch of 2
    np.savez(tmp_path / "nan.npz", x=x, y=np.zeros(8, np.int64))
    msg = expect_refusal(capsys, "NonFiniteError", "run", plan, "--data", tmp_path / "nan.npz", "--steps", "4",
                         "--holdout", "0")  # every example trains
    assert "inputs" in msg and "step" in msg
    tensors = load_file(plan / "weights.safetensors")  # finite weights whose logits overflow float32
    last = [k for k in tensors if k.startswith("param/") and tensors[k].dim() == 2][-1]
    tensors[last] = tensors[last] * 1e37
    save_file(tensors, plan / "weights.safetensors")
    resign(plan)
    msg = expect_refusal(capsys, "NonFiniteError", "run", plan, "--steps", "4")
    assert msg.startswith(("step 0:", "step 1:")) and ("loss is" in msg or "non-finite" in msg)


def test_json_has_no_bare_nan_and_human_output_escapes_markup(capsys):
    from edgetrain.compiler.workbench.errors_out import dumps
    from edgetrain.compiler.workbench.report import losses

    text = dumps({"ok": True, "losses": [float("nan"), float("inf")]})
    assert json.loads(text)["losses"] == ["nan", "inf"] and "NaN" not in text
    assert losses([float("nan"), float("nan")]) == "\\[nan, nan]"  # rich prints it as [nan, nan]


# -- 5. one error shape --------------------------------------------------------------------------------------

def test_debug_shows_the_traceback(plan, capsys):
    (plan / "weights.safetensors").unlink()
    rc = main(["run", str(plan), "--json", "--debug"])
    out = capsys.readouterr()
    assert rc == 2 and "Traceback" in out.err
    assert json.loads(out.out)["error"]["kind"] == "IntegrityError"


def test_sys_exit_in_a_model_file_is_reported(tmp_path, capsys):
    (tmp_path / "bad.py").write_text("import sys\nsys.exit(0)\n")
    msg = expect_refusal(capsys, "UnexpectedExit", "compile", f"{tmp_path / 'bad.py'}:make", "--target", "rpi4",
                         "--budget", "100%", "--input-shape", "1,8,8", "--out", tmp_path / "o")
    assert "sys.exit" in msg
    assert not (tmp_path / "o").exists()


def test_usage_errors_have_the_same_shape(capsys):
    rc, obj, _ = _cli(capsys, "run", "x", "--steps", "0", "--json")
    assert rc == 2 and obj["error"]["kind"] == "UsageError" and "--steps" in obj["error"]["message"]


# -- 6. isolation ------------------------------------------------------------------------------------------

def test_two_concurrent_runs_of_one_folder_each_have_their_pages(plan):
    body = json.loads((plan / "schedule.json").read_text())
    assert body["predicted"]["page_outs"] > 0  # the runs really page
    cmd = [*CLI, "run", str(plan), "--steps", "4", "--json"]
    ps = [subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
          for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in ps]
    assert all(p.returncode == 0 for p in ps), outs
    a, b = (json.loads(o) for o, _ in outs)
    assert a["ok"] and b["ok"] and a["losses"] == b["losses"]
    assert not list(plan.glob("pages*"))  # each run removed its own page store


def test_a_killed_run_leaves_pages_the_next_run_removes(plan, capsys):
    p = subprocess.Popen([*CLI, "run", str(plan), "--steps", "100000", "--json"], cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.time()
    while not any(any(d.iterdir()) for d in plan.glob("pages-*")) and time.time() - t0 < 120:
        time.sleep(0.01)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert list(plan.glob("pages-*"))
    rc, r, _ = _cli(capsys, "run", plan, "--json")
    assert rc == 0 and r["ok"]
    assert not list(plan.glob("pages-*"))


# -- small ones ------------------------------------------------------------------------------------------

def _children(pid: int) -> list[tuple[int, str]]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            comm = stat[stat.index("(") + 1: stat.rindex(")")]
            if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
                out.append((int(d.name), comm))
    return out


def test_a_killed_c_run_takes_its_firmware_process_with_it(tmp_path):
    if shutil.which("gcc") is None or shutil.which("make") is None:
        pytest.skip("needs gcc and make")
    out = tmp_path / "fw"
    compile_model(CompileOptions(model="mcu_cnn", target="nrf52840", budget="100%", batch_size=1, emit="c",
                                 out=str(out), time_limit=10))
    p = subprocess.Popen([*CLI, "run", str(out), "--steps", "3000", "--json"], cwd=ROOT, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    t0, fw = time.time(), []
    while not fw and p.poll() is None and time.time() - t0 < 300:
        fw = [pid for pid, comm in _children(p.pid) if comm == "fw"]
        time.sleep(0.005)
    assert fw, "the firmware never started"
    p.send_signal(signal.SIGKILL)
    p.wait()
    t0 = time.time()
    while Path(f"/proc/{fw[0]}").exists() and time.time() - t0 < 10:
        try:  # a zombie is gone for good; reap it if it became ours
            if "Z" in (Path(f"/proc/{fw[0]}") / "stat").read_text().split(")")[1].split()[0]:
                break
        except OSError:
            break
        time.sleep(0.05)
    state = (Path(f"/proc/{fw[0]}") / "stat").read_text().split(")")[1].split()[0] if Path(
        f"/proc/{fw[0]}").exists() else "gone"
    assert state in ("gone", "Z"), f"the firmware process {fw[0]} outlived the killed run ({state})"


def test_missing_c_page_names_its_file(tmp_path):
    from edgetrain.codegen.c.runner import _missing_page, page_file

    manifest = {"pages": [{"id": 1, "paged_in": True}, {"id": 2, "paged_in": True}, {"id": 3, "paged_in": False}]}
    (tmp_path / "pages").mkdir()
    Path(page_file(str(tmp_path), 1)).write_bytes(b"x")
    assert _missing_page(str(tmp_path), manifest) == str(tmp_path / "pages" / "et_page_00000002.bin")


@pytest.mark.parametrize("limit", ["-5", "0", "nan", "inf"])
def test_time_limit_must_be_positive_and_finite(capsys, tmp_path, limit):
    rc, obj, _ = _cli(capsys, "compile", "small_cnn", "--target", "rpi4", "--budget", "100%", "--out", tmp_path / "o",
                      f"--time-limit={limit}", "--json")
    assert rc == 2 and obj["error"]["kind"] == "UsageError" and "positive" in obj["error"]["message"]


def test_option_like_budget_gets_a_clear_message(capsys, tmp_path):
    rc, obj, _ = _cli(capsys, "compile", "small_cnn", "--target", "rpi4", "--budget", "-1MB", "--out", tmp_path / "o",
                      "--json")
    msg = obj["error"]["message"]
    assert rc == 2 and "--budget -1MB" in msg and "--budget=-1MB" in msg
    rc, obj, _ = _cli(capsys, "compile", "small_cnn", "--target", "rpi4", "--budget=-1MB", "--out", tmp_path / "o",
                      "--json")
    assert rc == 2 and obj["error"]["kind"] == "BudgetError"


FACTORIES = """\
import torch.nn as nn


def needs(width):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, width))


def make():
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 10))
"""


@pytest.mark.parametrize("factory, extra, words", [
    ("needs", [], ["width", "default"]),
    ("needs", ["--mode", "local", "--budget", "4MB"], ["width", "default"]),
])
def test_a_factory_that_cannot_be_called_is_the_users_error(capsys, tmp_path, factory, extra, words):
    (tmp_path / "f.py").write_text(FACTORIES)
    args = ["compile", f"{tmp_path / 'f.py'}:{factory}", "--target", "rpi4", "--budget", "100%", "--input-shape",
            "1,8,8", "--out", tmp_path / "o", *extra]
    msg = expect_refusal(capsys, "ModelSpecError", *args)
    assert all(w in msg for w in words), msg


def test_run_on_a_full_then_read_only_disk(plan, tmp_path, capsys):
    if os.geteuid() != 0:
        pytest.skip("a real full disk needs a tmpfs mount (root)")
    size = sum(p.stat().st_size for p in plan.rglob("*") if p.is_file())
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size + 64 * 1024}", "tmpfs", str(mnt)]).returncode:
        pytest.skip("tmpfs cannot be mounted here")
    try:
        shutil.copytree(plan, mnt / "p")
        msg = expect_refusal(capsys, "StorageFull", "run", mnt / "p", "--steps", "2")  # no room for the pages
        assert "space" in msg
        assert not list((mnt / "p").glob("pages-*"))  # the failed run removed its page store
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        rc, r, _ = _cli(capsys, "run", mnt / "p", "--steps", "2", "--json")  # pages go to the temporary folder
        assert rc == 0 and r["ok"], r
        msg = expect_refusal(capsys, "OutputDirError", "compile", "small_cnn", "--target", "rpi4", "--budget", "100%",
                             "--out", mnt / "p")
        assert "Read-only" in msg
    finally:
        subprocess.run(["umount", str(mnt)])


def test_an_edited_c_makefile_is_refused_before_make_runs(tmp_path, capsys):
    out = tmp_path / "fw"
    compile_model(CompileOptions(model=f"{ROOT / 'tests' / 'c_models.py'}:tiny_cnn", target="nrf52840",
                                 budget="100%", batch_size=1, emit="c", out=str(out), time_limit=10))
    marker = tmp_path / "make-ran"
    with open(out / "Makefile", "a") as f:
        f.write(f"\n$(shell touch {marker})\n")
    msg = expect_refusal(capsys, "IntegrityError", "run", out)
    assert "Makefile" in msg and not marker.exists() and not (out / "build").exists()


def test_two_concurrent_c_runs_of_one_folder_take_turns(tmp_path):
    if shutil.which("gcc") is None or shutil.which("make") is None:
        pytest.skip("needs gcc and make")
    out = tmp_path / "fw"
    compile_model(CompileOptions(model="mcu_cnn", target="nrf52840", budget="85%", batch_size=1, emit="c",
                                 out=str(out), time_limit=10))
    cmd = [*CLI, "run", str(out), "--steps", "300", "--json"]
    ps = [subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
          for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in ps]
    assert all(p.returncode == 0 for p in ps), outs
    a, b = (json.loads(o) for o, _ in outs)
    assert a["ok"] and b["ok"] and a["losses"] == b["losses"] and a["paged_bytes"] > 0
    assert {a["waited_for_pid"], b["waited_for_pid"]} & {p.pid for p in ps}  # one waited for the other
    assert not (out / "run-host" / "pages").exists()  # no page files left behind


def test_recompiling_refuses_to_throw_away_the_users_files(plan, capsys):
    (plan / "trained.safetensors").write_bytes(b"weights the user trained")
    (plan / "work").mkdir()
    before = _snapshot(plan)
    msg = expect_refusal(capsys, "OutputDirError", "compile", "small_cnn", "--target", "rpi4", "--budget", "100%",
                         "--batch-size", "2", "--out", plan)
    assert "trained.safetensors" in msg and "work" in msg and _snapshot(plan) == before
    (plan / "trained.safetensors").unlink()
    (plan / "work").rmdir()
    for leftover in ("build", "run-host", "pages-1-x"):  # what runs leave is replaced freely
        (plan / leftover).mkdir()
    assert _cli(capsys, "compile", "small_cnn", "--target", "rpi4", "--budget", "100%", "--batch-size", "2",
                "--out", plan, "--json")[0] == 0
    assert not (plan / "build").exists()
