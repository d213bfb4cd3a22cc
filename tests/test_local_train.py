"""Local learning end to end: layer specs, the activation cache, `compile --mode local`, `train`, kill-and-resume."""
from __future__ import annotations

import json
import os
import subprocess
import sys

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
from tests.kill_at import kill_at

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
    assert "--mode local" in json.loads(capsys.readouterr().out.splitlines()[-1])["error"]["message"]
    out, _ = small_plan
    w = str(tmp_path / "w")
    _train(["train", out, "--data", "digits", "--epochs", "1", "--work", w, "--no-export", "--train-size", "200"],
           capsys)
    assert main(["train", out, "--data", "digits", "--epochs", "2", "--work", w, "--no-export", "--train-size",
                 "200", "--json"]) == 2
    err = json.loads(capsys.readouterr().out.splitlines()[-1])["error"]
    assert err["kind"] == "TrainingStateError" and "another plan or settings" in err["message"]


def _run_train(out: str, work: str) -> subprocess.Popen:
    # One thread: OpenMP's spinning threads crawl when tests run in parallel on few cores.
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "-m", "edgetrain.compiler.workbench.cli", "train", out, "--data", "digits", "--epochs", "3",
                             "--train-size", "400", "--work", work, "--no-export", "--json"], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# `edgetrain train` (the same settings as _run_train) in its own process, announcing each batch; at the first
# batch of the stage the test names it holds, reading stdin, until the test's SIGKILL lands.
KILLABLE_TRAIN = r"""
import sys
from edgetrain.compiler.workbench.local_train import train_dir

def announce(what, k, n):
    print(what, file=sys.stderr, flush=True)
    if what.startswith(sys.argv[3]):
        sys.stdin.readline()

train_dir(sys.argv[1], data="digits", epochs=3, work=sys.argv[2], train_size=400, export=False, progress=announce)
"""


def _kill_at(out: str, work: str, stage: str) -> dict:
    """Kill a training run at its first batch of `stage` ("block 0 epoch 2"); returns its progress.json then."""
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")

    def progress():
        with open(os.path.join(work, "progress.json")) as f:
            return json.load(f)

    return kill_at([sys.executable, "-c", KILLABLE_TRAIN, out, work, stage], lambda line: line.startswith(stage),
                   env=env, cwd=ROOT, then=progress)


def test_kill_and_resume_ends_with_the_same_weights(small_plan, tmp_path):
    out, _ = small_plan
    ref = _run_train(out, str(tmp_path / "ref"))
    stdout, stderr = ref.communicate(timeout=300)
    assert ref.returncode == 0, stderr
    work = str(tmp_path / "killed")
    # Kill once inside block 0 (after its first epoch), once inside block 1 before it finishes an epoch.
    seen = _kill_at(out, work, "block 0 epoch 2/")
    assert seen["block"] == 0 and seen["epoch"] == 1
    seen = _kill_at(out, work, "block 1 epoch 1/")
    assert seen["block"] == 1 and seen["epoch"] == 0 and seen["resumed"] >= 1
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


def test_patience_stops_each_block_when_validation_stops_improving(small_plan, tmp_path):
    from edgetrain.compiler.workbench.local_train import train_dir

    out, _ = small_plan
    cap, patience = 6, 1
    r = train_dir(out, "digits", cap, work=str(tmp_path / "w"), train_size=300, eval_each_epoch=True, export=False,
                  patience=patience)
    assert r["patience"] == patience
    tl = r["timeline"]
    for blk in r["blocks"]:
        mine = [t for t in tl if t["block"] == blk["index"]]
        assert [t["epoch"] for t in mine] == list(range(1, blk["epochs"] + 1)) and 1 <= blk["epochs"] <= cap
        scores = [max(t["heads_val_accuracy"].values()) for t in mine]
        since, best = 0, None
        for k, v in enumerate(scores):  # the rule, replayed: it stops at the first epoch without a new best
            since = 0 if best is None or v > best else since + 1
            best = v if since == 0 else best
            if since >= patience:
                assert k == len(scores) - 1
        assert since >= patience or blk["epochs"] == cap
    heads: dict[str, tuple[float, float]] = {}
    for t in tl:  # the exit of each moment: the best validation accuracy of every head trained so far
        heads.update({k: (t["heads_val_accuracy"][k], t["heads_test_accuracy"][k]) for k in t["heads_val_accuracy"]})
        k = max(heads, key=lambda k: (heads[k][0], -int(k)))
        assert t["exit_layer"] == int(k) and t["exit_test_accuracy"] == heads[k][1]


def test_patience_must_be_positive(small_plan, tmp_path):
    from edgetrain.compiler.workbench.local_train import train_dir

    out, _ = small_plan
    with pytest.raises(ValueError, match="patience"):
        train_dir(out, "digits", 2, work=str(tmp_path / "w"), train_size=100, export=False, patience=0)


def _fake_result() -> dict:
    def local(times, accs, blocks):
        return [{"block": b, "epoch": 1, "wall_s": s, "test_accuracy": a, "exit_test_accuracy": a,
                 "best_exit_test_accuracy": a} for s, a, b in zip(times, accs, blocks)]

    return {"model": "vgg11", "data": "fashion-mnist", "train_samples": 1000, "budget": "128MB",
            "budget_bytes": 128_000_000, "patience": 2, "epochs": 20, "methods": {
                "backprop": {"timeline": [{"epoch": k + 1, "wall_s": 10.0 * (k + 1), "test_accuracy": a}
                                          for k, a in enumerate([70.0, 80.0, 85.0, 84.0, 84.5])],
                             "wall_s": 50.0, "epochs": 5, "batches": [9], "peak_bytes": 127e6},
                "classic": {"timeline": local([20, 40, 60, 80], [60.0, 70.0, 75.0, 74.0], [0, 0, 1, 1]),
                            "wall_s": 80.0, "epochs": [2, 2], "batches": [100, 100],
                            "block_peak_bytes": [120e6, 110e6]},
                "neuroflux": {"timeline": local([3, 6, 9, 12, 15], [72.0, 80.0, 85.5, 86.0, 85.0], [0, 0, 1, 1, 1]),
                              "wall_s": 15.0, "epochs": [2, 3], "batches": [126, 225],
                              "block_peak_bytes": [127e6, 126e6]}}}


def test_local_learning_summary_peaks_and_times():
    from edgetrain.compiler.workbench.local_figures import markdown_table, summarize

    s = summarize(_fake_result()["methods"])
    assert s["backprop"]["peak_test_accuracy"] == 85.0 and s["backprop"]["time_to_peak_s"] == 30.0
    assert s["backprop"]["time_to_backprop_peak_s"] == 30.0
    assert s["neuroflux"]["peak_test_accuracy"] == 86.0 and s["neuroflux"]["time_to_peak_s"] == 12.0
    assert s["neuroflux"]["time_to_backprop_peak_s"] == 9.0  # 85.5 >= backprop's 85.0 first at 9 s
    assert s["classic"]["time_to_backprop_peak_s"] is None and s["classic"]["epochs"] == 4
    again = summarize({k: dict(v, **s[k]) for k, v in _fake_result()["methods"].items()})  # the benchmark's rows
    assert again["classic"]["epochs_per_block"] == [2, 2] and again["classic"]["epochs"] == 4
    table = markdown_table(_fake_result())
    assert "not reached" in table and table.count("\n") == 4


def test_local_learning_figure_is_written(tmp_path):
    from edgetrain.compiler.workbench.local_figures import plot_local_learning

    r = plot_local_learning(_fake_result(), str(tmp_path), "ll")
    assert sorted(os.path.basename(f) for f in r["files"]) == ["ll.png", "ll.svg"]
    assert all(os.path.getsize(f) > 1024 for f in r["files"])
    assert r["data"]["curves"]["neuroflux"][2] == (9.0, 85.5)
    assert r["data"]["batches"] == {"backprop": [9], "classic": [100], "neuroflux": [126, 225]}
    # `edgetrain train --timeline --json` output draws too: one NeuroFlux curve
    one = {"timeline": _fake_result()["methods"]["neuroflux"]["timeline"], "wall_s": 15.0,
           "blocks": [{"batch": 126, "counted_bytes": 1, "epochs": 2}, {"batch": 225, "counted_bytes": 1, "epochs": 3}]}
    assert list(plot_local_learning(one, str(tmp_path), "one")["data"]["curves"]) == ["neuroflux"]


@pytest.mark.slow
def test_local_learning_benchmark_runs_and_draws(tmp_path):
    import importlib.util

    from edgetrain.compiler.workbench.local_figures import curve

    spec = importlib.util.spec_from_file_location("ll_bench", os.path.join(ROOT, "benchmarks", "local_learning.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = str(tmp_path / "b")
    r = bench.main(["--model", "small_cnn", "--budget", "8MB", "--data", "digits", "--train-size", "300",
                    "--test-size", "100", "--epochs", "3", "--patience", "1", "--out", out])
    assert set(r["methods"]) == {"backprop", "classic", "neuroflux"}
    for m in r["methods"].values():
        assert m["peak_test_accuracy"] == max(a for _, a in curve(m))
    assert os.path.exists(os.path.join(out, "local_learning_small_cnn.png"))
    with open(os.path.join(out, "local_learning.json")) as f:
        assert json.load(f)["patience"] == 1


def test_a_flipped_byte_in_a_checkpoint_is_refused_on_resume(small_plan, tmp_path):
    out, _ = small_plan
    work = str(tmp_path / "killed")
    seen = _kill_at(out, work, "block 0 epoch 2/")
    state = os.path.join(work, seen["state"])  # held at the next epoch's first batch: still the checkpoint named
    raw = bytearray(open(state, "rb").read())
    raw[-3] ^= 0x01  # one bit of the last tensor's data, as a torn write after a kill would leave
    open(state, "wb").write(bytes(raw))
    p = _run_train(out, work)
    stdout, stderr = p.communicate(timeout=300)
    assert p.returncode == 2 and "Traceback" not in stderr
    err = json.loads(stdout)["error"]
    assert err["kind"] == "TrainingStateError" and "corrupt" in err["message"] and "delete" in err["message"]
