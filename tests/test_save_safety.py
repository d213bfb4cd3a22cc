"""`run --save` never harms what it should keep: the compiled plan's own files, the last good checkpoint, another
run's checkpoints; and what cannot be written is found before any training (a real read-only mount, real
processes, a real divergence)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from edgetrain.compiler.pipeline import CompileOptions, compile_model
from edgetrain.compiler.workbench.cli import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> Path:
    """The image classifier of tests/user_models.py (batch norm), compiled at store-all."""
    out = tmp_path_factory.mktemp("save") / "plan"
    compile_model(CompileOptions(model="tests/user_models.py:image_classifier", target="rpi4", budget="100%",
                                 out=str(out), batch_size=4, time_limit=5, input_shape=(3, 32, 32)))
    return out


def _cli(capsys, *args) -> tuple[int, dict]:
    rc = main([str(a) for a in args] + ["--json"])
    return rc, json.loads(capsys.readouterr().out)


def _refused(capsys, *args) -> dict:
    rc, r = _cli(capsys, *args)
    assert rc == 2 and not r["ok"], r
    return r["error"]


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_save_refuses_the_plans_own_files_and_other_names(plan, capsys):
    before = _files(plan)
    for target in (plan / "weights.safetensors", plan / "schedule.json", plan / "plan.py", plan / ".." / "plan" /
                   "weights.safetensors", plan.parent / "trained.pt"):
        err = _refused(capsys, "run", plan, "--steps", 1, "--save", target)
        assert "--save" in err["message"], err
    assert _files(plan) == before  # the plan is as compiled
    rc, r = _cli(capsys, "run", plan, "--steps", 1)
    assert rc == 0 and r["ok"], r


def test_a_read_only_save_folder_is_refused_before_training(plan, tmp_path, capsys):
    if os.geteuid() != 0:
        pytest.skip("a read-only mount needs root")
    mnt = tmp_path / "ro"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(mnt)]).returncode:
        pytest.skip("tmpfs cannot be mounted here")
    try:
        t0 = time.perf_counter()
        err = _refused(capsys, "run", plan, "--steps", 50, "--save", mnt / "trained.safetensors")
        assert err["kind"] == "ReadOnlyStorage" and "nothing was trained" in err["message"], err
        assert time.perf_counter() - t0 < 20  # 50 steps were never run
        assert list(mnt.iterdir()) == []
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_a_diverged_run_never_replaces_the_last_finite_checkpoint(plan, tmp_path, capsys):
    """Inputs of 3e19 overflow batch norm's running variance to inf while the loss and the weights stay
    finite: the save of that step is refused, naming the tensor, and the previous one stays."""
    g = np.random.default_rng(0)
    x = g.random((40, 3, 32, 32), dtype=np.float32)
    x[36:] *= 3e19  # four examples: some steps before one of them is drawn
    np.savez(tmp_path / "huge.npz", x=x, y=g.integers(0, 10, 40))
    save = tmp_path / "out" / "trained.safetensors"
    err = _refused(capsys, "run", plan, "--data", tmp_path / "huge.npz", "--steps", 10,
                   "--holdout", 0, "--save", save, "--save-every", 1)
    assert err["kind"] == "NonFiniteError" and "running_var" in err["message"] and "not written" in err["message"]
    with safe_open(str(save), framework="pt") as f:
        kept_step = int(f.metadata()["edgetrain.step"])
        assert all(bool(torch.isfinite(f.get_tensor(k)).all()) for k in f.keys())
    assert kept_step >= 1
    assert not Path(str(save) + ".lock").exists()  # released when the run ended, failed or not


def _run(plan: Path, save: Path, steps: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "edgetrain.compiler.workbench.cli", "run", str(plan), "--steps",
                             str(steps), "--save", str(save), "--json"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_two_runs_saving_to_one_file_the_second_is_refused(plan, tmp_path):
    save = tmp_path / "shared.safetensors"
    first = _run(plan, save, 100000)
    try:
        deadline = time.time() + 120
        while not Path(str(save) + ".lock").exists():  # the first run holds the save
            assert first.poll() is None and time.time() < deadline, first.communicate()
            time.sleep(0.2)
        second = _run(plan, save, 1)
        out, _ = second.communicate(timeout=120)
        r = json.loads(out)
        assert second.returncode == 2 and "another run" in r["error"]["message"], r
        assert str(first.pid) in r["error"]["message"]
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert not save.exists()  # the refused run wrote nothing; the first was killed before its save
    third = _run(plan, save, 1)  # a killed holder's lock is gone with its process
    out, err = third.communicate(timeout=120)
    assert third.returncode == 0 and json.loads(out)["ok"], err
    assert save.exists() and not Path(str(save) + ".lock").exists()


def test_a_batch_size_no_target_can_hold_is_refused_before_tracing(capsys, tmp_path):
    err = _refused(capsys, "compile", "small_cnn", "--target", "jetson-nano", "--budget", "100%", "--batch-size",
                   1000000000, "--out", tmp_path / "o")
    assert err["kind"] == "BudgetError" and "--batch-size" in err["message"] and "at most" in err["message"], err
