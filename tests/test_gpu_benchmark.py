"""benchmarks/cuda_runtime.py, the GPU runtime check, keeps working where no GPU is lent: plans compiled here travel
with one copy of each model's weights and train from that folder, each in a process of its own (the CPU path of
the same script)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks", "cuda_runtime.py")


def test_gpu_benchmark_plans_travel_small_and_train_exactly_from_their_folder(tmp_path):
    plans = tmp_path / "plans"
    r = subprocess.run([sys.executable, BENCH, "compile", str(plans), "--models", "small_cnn", "--budgets",
                        "100%,85%", "--target", "jetson-nano,rpi4", "--time-limit", "5"],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    names = sorted(n for n in os.listdir(plans) if n != "weights")
    assert names == ["small_cnn-100pct-jetson-nano", "small_cnn-100pct-rpi4", "small_cnn-85pct-jetson-nano",
                     "small_cnn-85pct-rpi4"]
    assert os.listdir(plans / "weights") == ["small_cnn.safetensors"]
    assert not any((plans / n / "weights.safetensors").exists() for n in names)  # one copy travels
    out = tmp_path / "rows.json"
    r = subprocess.run([sys.executable, BENCH, "run", str(plans), "--device", "cpu", "--steps", "2", "--timed", "1",
                        "--json", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    rows = json.loads(out.read_text())
    assert [row["plan"] for row in rows] == names
    for row in rows:
        assert row["ok"] and row["max_abs_err"] == 0.0, row.get("error")
        assert row["measured_peak_bytes"] == row["predicted_peak_bytes"] <= row["budget_bytes"]
        assert row["runtime_s"] > 0 and row["pytorch_s"] > 0
        assert row["allocator"] == "runtime"  # the CPU has no caching allocator to compare
