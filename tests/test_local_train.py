"""Local learning end to end: layer specs, the activation cache, `compile --mode local`, `train`, kill-and-resume."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from edgetrain.compiler.schedule_file import format as schedule_format
from edgetrain.compiler.frontend import zoo
from edgetrain.compiler.workbench.cli import main
from edgetrain.compiler.errors import BudgetError
from edgetrain.compiler.pipeline_local import LocalOptions, compile_local
from edgetrain.compiler.local.heads import split_layers
from edgetrain.compiler.local.spec import copy_weights, layer_spec
from edgetrain.runtime.python import load_plan
from edgetrain.runtime.python.activation_cache import ActivationCache, CacheWriter
from edgetrain.runtime.python.local_layers import build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- activation cache ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_cache_round_trip_across_shards(tmp_path, dtype):
    x = torch.randn(10, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    w = CacheWriter(str(tmp_path / "c"), 10, (3, 4, 4), dtype, shard_samples=3)
    w.append(x[:4])  # straddles the first shard boundary
    w.append(x[4:])
    cache = w.close()
    assert sorted(os.listdir(tmp_path / "c")) == ["meta.json", *[f"shard_{i:05d}.bin" for i in range(4)]]
    want = x if dtype == "float32" else x.half().float()
    idx = torch.tensor([9, 0, 4, 3, 7, 2])
    assert torch.equal(cache.gather(idx), want[idx])
    reopened = ActivationCache.open(str(tmp_path / "c"))
    assert torch.equal(reopened.slice(0, 10), want)
    assert reopened.nbytes == 10 * 48 * (4 if dtype == "float32" else 2)


def test_unfinished_or_truncated_cache_is_refused(tmp_path):
    w = CacheWriter(str(tmp_path / "c"), 4, (2,), shard_samples=2)
    w.append(torch.ones(3, 2))
    with pytest.raises(ValueError, match="3 of 4 samples"):
        w.close()
    with pytest.raises(FileNotFoundError, match="incomplete"):
        ActivationCache.open(str(tmp_path / "c"))  # a killed writer leaves no meta.json
    w = CacheWriter(str(tmp_path / "c"), 4, (2,), shard_samples=2)  # starts over
    w.append(torch.ones(4, 2))
    w.close()
    with open(tmp_path / "c" / "shard_00001.bin", "r+b") as f:
        f.truncate(4)
    with pytest.raises(FileNotFoundError, match="shard_00001.bin"):
        ActivationCache.open(str(tmp_path / "c"))


# -- layer specs -----------------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["vgg11", "resnet18"])
def test_layer_spec_rebuilds_the_same_layer(model):
    torch.manual_seed(0)
    for tl in split_layers(zoo.build(model)):
        built = build(layer_spec(tl.module))
        copy_weights(tl.module, built, tl.in_shape)
        x = torch.randn(3, *tl.in_shape, generator=torch.Generator().manual_seed(1))
        ref = tl.module.train()(x)  # training mode: batch statistics, and the running stats move the same way
        out = built.train()(x)
        assert torch.equal(ref, out), tl.name
        for (ka, a), (kb, b) in zip(tl.module.state_dict().items(), built.state_dict().items()):
            assert torch.equal(a, b), (tl.name, ka, kb)


# -- compile --mode local -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_plan(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("local") / "plan")
    r = compile_local(LocalOptions(model="small_cnn", target="jetson-agx-orin", budget="1MB", out=out))
    return out, r


def test_compile_local_writes_a_v2_schedule_whose_blocks_fit(small_plan):
    out, r = small_plan
    body = schedule_format.load(out)
    assert body["version"] == 2 and body["mode"] == "local"
    local = body["local"]
    lines = {l["name"]: l["line"] for l in local["layers"]}
    blocks = local["partition"]["blocks"]
    assert [lb["index"] for b in blocks for lb in b["layers"]] == list(range(len(local["layers"])))
    for b in blocks:
        for lb in b["layers"]:
            line = lines[lb["name"]]
            assert line["r2"] > 0.999
            assert line["slope"] * b["batch"] + line["intercept"] <= body["budget"]["bytes"]
            assert b["batch"] <= lb["feasible_batch"] <= local["partition"]["cap"]
    plan = load_plan(out)
    assert plan.PLAN["schedule_content"] == schedule_format.content_hash(body)
    assert [b["batch"] for b in plan.BLOCKS] == [b["batch"] for b in blocks]
    assert r["min_feasible_bytes"] < body["budget"]["bytes"]


def test_compile_local_budget_errors(tmp_path):
    with pytest.raises(BudgetError, match="needs the budget in bytes"):
        compile_local(LocalOptions(model="small_cnn", target="jetson-agx-orin", budget="50%", out=str(tmp_path)))
    with pytest.raises(BudgetError, match="raise the budget to at least"):
        compile_local(LocalOptions(model="small_cnn", target="jetson-agx-orin", budget="20KB", out=str(tmp_path)))


# -- train ----------------------------------------------------------------------------------------


def _train(args: list[str], capsys) -> dict:
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_train_on_digits_beats_chance_and_exports_an_exit(small_plan, tmp_path, capsys):
    out, _ = small_plan
    r = _train(["train", out, "--data", "digits", "--epochs", "3", "--work", str(tmp_path / "w")], capsys)
    assert r["test_accuracy"] > 60.0  # chance is 10%
    assert r["peak_bytes"] <= r["budget_bytes"]
    body = schedule_format.load(out)
    k, local = r["exit_layer"], body["local"]
    assert r["cache_bytes"] > 0
    assert r["exit_params"] == sum(l["params"] for l in local["layers"][:k + 1]) + local["heads"][k]["params"]
    best = max(x["val_accuracy"] for x in r["per_layer"])
    assert r["val_accuracy"] >= best - local["training"]["exit_tolerance_points"] - 1e-9
    n_blocks = len(body["local"]["partition"]["blocks"])
    assert len(r["blocks"]) == n_blocks and r["resumed"] == 0
    # Caches live only while the next block needs them: after the run, none is left on storage.
    assert not os.path.exists(tmp_path / "w" / "cache") or os.listdir(tmp_path / "w" / "cache") == []
    assert r["onnx_parity"]["same_predictions"] == 1.0 and r["onnx_parity"]["max_abs_diff"] < 1e-4
    tensors = load_file(r["safetensors"])
    assert sum(t.numel() for k, t in tensors.items() if "running" not in k and "num_batches" not in k) \
        == r["exit_params"]
    # A finished run reruns as a no-op resume with the same answer.
    again = _train(["train", out, "--data", "digits", "--epochs", "3", "--work", str(tmp_path / "w"),
                    "--no-export"], capsys)
    assert again["test_accuracy"] == r["test_accuracy"] and again["exit_layer"] == r["exit_layer"]


def test_train_refuses_a_poet_plan_and_a_changed_run(small_plan, tmp_path, capsys):
    poet = str(tmp_path / "poet")
    assert main(["compile", "small_cnn", "--target", "jetson-agx-orin", "--budget", "100%", "--out", poet,
                 "--json"]) == 0
    capsys.readouterr()
    assert main(["train", poet, "--data", "digits", "--json"]) == 2
    assert "--mode local" in json.loads(capsys.readouterr().out.splitlines()[-1])["error"]
    out, _ = small_plan
    w = str(tmp_path / "w")
    _train(["train", out, "--data", "digits", "--epochs", "1", "--work", w, "--no-export", "--train-size", "200"],
           capsys)
    with pytest.raises(RuntimeError, match="another plan or settings"):
        main(["train", out, "--data", "digits", "--epochs", "2", "--work", w, "--no-export", "--train-size", "200",
              "--json"])


def _run_train(out: str, work: str) -> subprocess.Popen:
    # One thread: OpenMP's spinning threads crawl when tests run in parallel on few cores.
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "-m", "edgetrain.compiler.workbench.cli", "train", out, "--data", "digits", "--epochs", "3",
                             "--train-size", "400", "--work", work, "--no-export", "--json"], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _kill_when(proc: subprocess.Popen, progress: str, ready) -> dict:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the run ended before it could be killed: {proc.communicate()}")
        try:
            with open(progress) as f:
                state = json.load(f)
        except (FileNotFoundError, json.JSONDecodeError):
            state = None
        if state is not None and ready(state):
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return state
        time.sleep(0.05)
    proc.kill()
    pytest.fail("the run never reached the kill point")


def test_kill_and_resume_ends_with_the_same_weights(small_plan, tmp_path):
    out, _ = small_plan
    ref = _run_train(out, str(tmp_path / "ref"))
    stdout, stderr = ref.communicate(timeout=300)
    assert ref.returncode == 0, stderr
    work = str(tmp_path / "killed")
    progress = os.path.join(work, "progress.json")
    # Kill once inside block 0 (after its first epoch), once inside block 1 before it finishes an epoch.
    seen = _kill_when(_run_train(out, work), progress, lambda s: s["block"] == 0 and s["epoch"] >= 1)
    assert seen["block"] == 0
    seen = _kill_when(_run_train(out, work), progress, lambda s: s["block"] >= 1)
    assert seen["resumed"] >= 1
    last = _run_train(out, work)
    stdout, stderr = last.communicate(timeout=300)
    assert last.returncode == 0, stderr
    result = json.loads(stdout)
    assert result["resumed"] >= 2
    a = load_file(os.path.join(tmp_path / "ref", "trained.safetensors"))
    b = load_file(os.path.join(work, "trained.safetensors"))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]


def test_timeline_records_every_epoch_and_the_best_exit_so_far(small_plan, tmp_path):
    from edgetrain.compiler.workbench.local_train import train_dir

    out, _ = small_plan
    r = train_dir(out, "digits", 2, work=str(tmp_path / "w"), train_size=300, eval_each_epoch=True, export=False)
    tl = r["timeline"]
    n_blocks = len(r["blocks"])
    assert [(t["block"], t["epoch"]) for t in tl] == [(b, e) for b in range(n_blocks) for e in (1, 2)]
    assert all(a["wall_s"] < b["wall_s"] for a, b in zip(tl, tl[1:]))
    seen = []
    for t in tl:
        seen += t["heads_test_accuracy"].values()
        assert t["best_exit_test_accuracy"] == max(seen)
