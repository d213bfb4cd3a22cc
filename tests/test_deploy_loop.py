"""The deploy loop: train a compiled plan on one's own data, keep the weights, take them back into the
nn.Module, and resume to the bit. Real files: .npz and .safetensors datasets, a folder of PNG images."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.numpy import save_file as save_np
from safetensors.torch import load_file

from edgetrain.compiler.frontend.modelspec import resolve
from edgetrain.compiler.pipeline import CompileOptions, compile_model
from edgetrain.compiler.workbench.cli import main
from edgetrain.runtime.python.device_api import state_path
from tests.test_layout import RUNTIME_FORBIDDEN, _run_blocked

BATCH = 2


def _cli(capsys, *args) -> tuple[int, dict]:
    try:
        rc = main([str(a) for a in args] + ["--json"])
    except SystemExit as e:
        rc = e.code
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1, out
    return rc, json.loads(out[0])


def _refused(capsys, kind: str, *args) -> str:
    rc, r = _cli(capsys, *args)
    assert rc == 2 and r["ok"] is False and r["error"]["kind"] == kind, r
    return r["error"]["message"]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("deploy") / "small"
    compile_model(CompileOptions(model="small_cnn", target="rpi4", budget="85%", batch_size=BATCH, time_limit=10,
                                 out=str(out)))
    return out


@pytest.fixture
def plan(compiled, tmp_path) -> Path:
    shutil.copytree(compiled, tmp_path / "plan")
    return tmp_path / "plan"


@pytest.fixture
def npz(tmp_path) -> Path:
    rng = np.random.default_rng(0)
    path = tmp_path / "mine.npz"
    np.savez(path, x=rng.standard_normal((10, 1, 28, 28)).astype(np.float32), y=rng.integers(0, 10, 10))
    return path


def test_save_loads_strictly_into_the_users_model_with_trained_values(plan, tmp_path, capsys):
    out = tmp_path / "trained.safetensors"
    rc, r = _cli(capsys, "run", plan, "--steps", "3", "--save", out)
    assert rc == 0 and r["ok"] and r["saved"] == [str(out), str(state_path(out))]
    model = resolve("small_cnn").module
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(load_file(out), strict=True)
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, initial[k])]
    assert {k for k, _ in model.named_parameters()} <= set(changed)  # every parameter trained
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # written atomically


@pytest.mark.parametrize("data", ["npz", "safetensors"])
def test_resume_equals_an_uninterrupted_run_to_the_bit(plan, npz, tmp_path, capsys, data):
    source = npz
    if data == "safetensors":
        z = np.load(npz)
        source = tmp_path / "mine.safetensors"
        save_np({"x": z["x"], "y": z["y"]}, str(source))
    whole, part = tmp_path / "whole.safetensors", tmp_path / "part.safetensors"
    # 10 examples, batch 2: 5 steps an epoch; 7 steps cross an epoch, and the resume starts mid-epoch.
    assert _cli(capsys, "run", plan, "--data", source, "--steps", "7", "--save", whole)[0] == 0
    assert _cli(capsys, "run", plan, "--data", source, "--steps", "3", "--save", part)[0] == 0
    rc, r = _cli(capsys, "run", plan, "--data", source, "--steps", "7", "--save", part, "--resume")
    assert rc == 0 and r["first_step"] == 3 and r["steps"] == 4 and r["resumed_from"] == str(part)
    a, b = load_file(whole), load_file(part)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    oa, ob = load_file(state_path(whole)), load_file(state_path(part))
    assert oa.keys() == ob.keys() and all(torch.equal(oa[k], ob[k]) for k in oa)


def test_epochs_over_a_users_npz(plan, npz, capsys):
    rc, r = _cli(capsys, "run", plan, "--data", npz, "--epochs", "2", "--holdout", "0")  # every example trains
    assert rc == 0 and r["ok"] and r["steps"] == 10 and all(np.isfinite(r["losses"]))


def test_an_image_folder_is_trained_on(plan, tmp_path, capsys):
    rng = np.random.default_rng(1)
    for c, name in enumerate(["boot", "coat", "shirt"]):
        (tmp_path / "imgs" / name).mkdir(parents=True)
        for i in range(3):  # sizes and modes differ: every image is resized and made grey
            size = (20 + 4 * i, 30)
            arr = rng.integers(0, 255, (*size[::-1], 3), dtype=np.uint8)
            Image.fromarray(arr).save(tmp_path / "imgs" / name / f"{i}.png")
    out = tmp_path / "t.safetensors"
    rc, r = _cli(capsys, "run", plan, "--data", tmp_path / "imgs", "--epochs", "1", "--save", out)
    assert rc == 0 and r["ok"] and r["steps"] == 4  # 9 images, batch 2
    assert out.exists()


def test_data_that_does_not_fit_the_model_is_refused(plan, tmp_path, capsys):
    np.savez(tmp_path / "shape.npz", x=np.zeros((4, 3, 32, 32), np.float32), y=np.zeros(4, np.int64))
    assert "[3, 32, 32]" in _refused(capsys, "DataError", "run", plan, "--data", tmp_path / "shape.npz")
    np.savez(tmp_path / "classes.npz", x=np.zeros((4, 1, 28, 28), np.float32), y=np.array([0, 1, 2, 12]))
    assert "10 classes" in _refused(capsys, "DataError", "run", plan, "--data", tmp_path / "classes.npz")
    np.savez(tmp_path / "dtype.npz", x=np.zeros((4, 1, 28, 28), np.float32), y=np.zeros(4, np.float32))
    assert "integer" in _refused(capsys, "DataError", "run", plan, "--data", tmp_path / "dtype.npz")
    np.savez(tmp_path / "names.npz", inputs=np.zeros((4, 1, 28, 28), np.float32))
    assert "x (inputs)" in _refused(capsys, "DataError", "run", plan, "--data", tmp_path / "names.npz")
    for c in range(11):
        (tmp_path / "eleven" / f"c{c:02d}").mkdir(parents=True)
    assert "11 class folders" in _refused(capsys, "DataError", "run", plan, "--data", tmp_path / "eleven")
    assert "--epochs needs a dataset" in _refused(capsys, "DataError", "run", plan, "--epochs", "1")
    assert "--save" in _refused(capsys, "EdgetrainError", "run", plan, "--resume")


def test_resume_refuses_a_corrupt_state_or_another_plans(plan, tmp_path, capsys):
    a = tmp_path / "a.safetensors"
    _cli(capsys, "run", plan, "--steps", "1", "--save", a)
    raw = bytearray(state_path(a).read_bytes())
    raw[-7] ^= 0x04  # one bit of the last tensor
    state_path(a).write_bytes(bytes(raw))
    assert "corrupt" in _refused(capsys, "ResumeError", "run", plan, "--steps", "3", "--save", a, "--resume")
    other = tmp_path / "other"
    compile_model(CompileOptions(model="small_cnn", target="rpi4", budget="100%", batch_size=BATCH, out=str(other)))
    b = tmp_path / "b.safetensors"
    _cli(capsys, "run", other, "--steps", "1", "--save", b)
    assert "another compiled plan" in _refused(capsys, "ResumeError", "run", plan, "--steps", "3", "--save", b,
                                               "--resume")


def test_device_program_with_the_runtime_alone(compiled, tmp_path):
    out = _run_blocked(RUNTIME_FORBIDDEN, f"""
        import json
        import torch
        from edgetrain.runtime.python import Trainer

        g = torch.Generator().manual_seed(0)
        batches = [(torch.randn(2, 1, 28, 28, generator=g), torch.randint(0, 10, (2,), generator=g))
                   for _ in range(4)]
        with Trainer({str(compiled)!r}, device="cpu") as t:
            whole = [t.step(x, y) for x, y in batches]
            t.save({str(tmp_path / "w.safetensors")!r})
        with Trainer({str(compiled)!r}, device="cpu") as t:
            first = [t.step(x, y) for x, y in batches[:2]]
            t.save({str(tmp_path / "p.safetensors")!r})
        with Trainer({str(compiled)!r}, device="cpu", resume={str(tmp_path / "p.safetensors")!r}) as t:
            rest = [t.step(x, y) for x, y in batches[2:]]
            t.save({str(tmp_path / "p.safetensors")!r})
        result = dict(whole=whole, resumed=first + rest)
    """)
    assert out["whole"] == out["resumed"]
    a, b = load_file(tmp_path / "w.safetensors"), load_file(tmp_path / "p.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not list(compiled.glob("pages-*"))  # each trainer removed its page store


# `edgetrain run --resume --save-every 4` in its own process, announcing each step; after step KILL_AT (a
# checkpoint at 4 behind it, the next at 8) it holds, reading stdin, until the test's SIGKILL lands.
KILL_AT = 6
KILLABLE_RUN = r"""
import sys
from edgetrain.compiler.workbench.run import run_plan

def announce(k, n):
    print(k, file=sys.stderr, flush=True)
    if k == int(sys.argv[4]):
        sys.stdin.readline()

run_plan(sys.argv[1], data=sys.argv[2], steps=60, save=sys.argv[3], resume=True, save_every=4, progress=announce)
"""


def test_a_killed_run_rerun_with_resume_ends_as_an_uninterrupted_one(plan, npz, tmp_path, capsys):
    import sys

    from tests.kill_at import kill_at
    from tests.test_reliability import ROOT

    whole, part = tmp_path / "whole.safetensors", tmp_path / "part.safetensors"
    cmd = ["run", str(plan), "--data", str(npz), "--steps", "60", "--save-every", "4"]
    assert _cli(capsys, *cmd, "--save", whole)[0] == 0
    # One thread, as in this process: bit-identity holds on the same device and thread count.
    kill_at([sys.executable, "-c", KILLABLE_RUN, str(plan), str(npz), str(part), str(KILL_AT)],
            lambda line: line.strip() == str(KILL_AT), cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"))
    rc, r = _cli(capsys, *cmd, "--save", part, "--resume")
    assert rc == 0, r
    assert r["first_step"] == 4 and r["steps"] == 56  # from the last checkpoint before the kill
    a, b = load_file(whole), load_file(part)
    assert all(torch.equal(a[k], b[k]) for k in a)
    oa, ob = load_file(state_path(whole)), load_file(state_path(part))
    assert all(torch.equal(oa[k], ob[k]) for k in oa)
