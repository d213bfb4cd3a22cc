"""Training a user can watch: a line per epoch (mean loss, held-out loss and accuracy) printed as the epoch
ends, also into a pipe; the same records in a JSON-lines file beside --save, written as it goes, and in
--json; `train` (local learning) likewise, on the user's own data."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from edgetrain.compiler.pipeline import CompileOptions, compile_model
from edgetrain.compiler.workbench.cli import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("watch") / "plan"
    compile_model(CompileOptions(model="tests/user_models.py:transformer_classifier", target="rpi4", budget="100%",
                                 out=str(out), batch_size=4, time_limit=5))
    g = np.random.default_rng(0)
    np.savez(out.parent / "d.npz", x=g.integers(0, 80, (40, 10)), y=g.integers(0, 5, 40))
    np.savez(out.parent / "e.npz", x=g.integers(0, 80, (12, 10)), y=g.integers(0, 5, 12))
    return out


def _cli(capsys, *args) -> tuple[int, dict]:
    rc = main([str(a) for a in args] + ["--json"])
    return rc, json.loads(capsys.readouterr().out)


def test_each_epoch_is_printed_into_a_pipe_and_the_metrics_file_as_it_ends(plan, tmp_path):
    save = tmp_path / "trained.safetensors"
    proc = subprocess.Popen([sys.executable, "-m", "edgetrain.compiler.workbench.cli", "run", str(plan), "--data",
                             str(plan.parent / "d.npz"), "--epochs", "500", "--save", str(save)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        first = proc.stdout.readline()  # a pipe, not a terminal: still one line per epoch, as it ends
        assert proc.poll() is None, "the line came only when the run ended"
        assert first.startswith("epoch 1/500 (step 9): loss ") and "held-out loss" in first and "accuracy" in first
        assert "(4 examples)" in first  # 10% of 40 held out by default
        metrics = tmp_path / "trained.metrics.jsonl"
        deadline = time.time() + 60
        while len(metrics.read_text().splitlines()) < 2:  # written as it goes, not at the end
            assert proc.poll() is None and time.time() < deadline
            time.sleep(0.1)
        rec = json.loads(metrics.read_text().splitlines()[0])
        assert rec["epoch"] == 1 and rec["step"] == 9 and rec["eval_examples"] == 4
        assert 0 <= rec["eval_accuracy"] <= 100 and np.isfinite(rec["loss"]) and np.isfinite(rec["eval_loss"])
    finally:
        proc.kill()
        proc.wait()


def test_json_carries_every_epoch_and_eval_data_replaces_the_holdout(plan, tmp_path, capsys):
    rc, r = _cli(capsys, "run", plan, "--data", plan.parent / "d.npz", "--epochs", 3, "--eval-data",
                 plan.parent / "e.npz", "--save", tmp_path / "t.safetensors")
    assert rc == 0 and r["ok"], r
    assert [e["epoch"] for e in r["epochs"]] == [1, 2, 3] and r["steps"] == 30  # all 40 examples train
    assert all(e["eval_examples"] == 12 and e["eval_loss"] is not None for e in r["epochs"])
    lines = [json.loads(x) for x in (tmp_path / "t.metrics.jsonl").read_text().splitlines()]
    assert lines == r["epochs"]
    rc, r = _cli(capsys, "run", plan, "--data", plan.parent / "d.npz", "--epochs", 1, "--holdout", 0)
    assert rc == 0 and r["steps"] == 10 and r["epochs"][0]["eval_loss"] is None


LOCAL = """\
import torch.nn as nn


def make():
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, 7))
"""


def test_local_training_on_the_users_own_data_with_a_line_per_epoch(tmp_path, capsys):
    (tmp_path / "net.py").write_text(LOCAL)
    rc, r = _cli(capsys, "compile", f"{tmp_path / 'net.py'}:make", "--mode", "local", "--target", "jetson-agx-orin",
                 "--budget", "1MB", "--input-shape", "1,8,8", "--out", tmp_path / "p")
    assert rc == 0, r
    g = np.random.default_rng(0)
    np.savez(tmp_path / "own.npz", x=g.random((300, 1, 8, 8), dtype=np.float32), y=g.integers(0, 7, 300))
    rc = main(["train", str(tmp_path / "p"), "--data", str(tmp_path / "own.npz"), "--epochs", "2", "--no-export"])
    out = capsys.readouterr().out
    assert rc == 0, out
    lines = [x for x in out.splitlines() if x.startswith("block ")]
    assert len(lines) == 2 * len(json.loads((tmp_path / "p" / "schedule.json").read_text())["local"]["partition"]
                                 ["blocks"]) and "held-out accuracy" in lines[0], out
    rc, t = _cli(capsys, "train", tmp_path / "p", "--data", tmp_path / "own.npz", "--epochs", 1, "--no-export",
                 "--work", tmp_path / "w2")
    assert rc == 0 and t["test_samples"] == 30 and len(t["epoch_log"]) >= 1, t  # 10% held out as the test set
    rc, bad = _cli(capsys, "train", tmp_path / "p", "--data", "digits", "--epochs", 1, "--work", tmp_path / "w3")
    assert rc == 2 and "outside 0..6" in bad["error"]["message"] and "7 classes" in bad["error"]["message"], bad
