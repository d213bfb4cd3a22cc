"""Python plans with an int8 frozen prefix (compile --emit python --quantize-frozen int8): the q8 ops on the integer
reference's arithmetic, int8/int32 parameters as the render writes them, the ledger equal to the prediction, run
--check (the boundary bit for bit, the head against autograd), the same boundary as the C firmware's, a tiled
prefix, and what is refused."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from edgetrain.codegen.python_q8 import PREFIX_FLOATS
from edgetrain.compiler.graph.quantize import conv_integers
from edgetrain.compiler.pipeline import CompileOptions, compile_model
from edgetrain.compiler.workbench import cli
from edgetrain.compiler.workbench.int8_check import Int8Reference, boundary_mismatches
from edgetrain.compiler.workbench.evaluate import Evaluator
from edgetrain.compiler.workbench.reference import train_reference
from edgetrain.compiler.workbench.run_data import Dataset
from edgetrain.compiler.workbench.run import _compare, schedule_batches
from edgetrain.codegen.py_layout import WIDTH
from edgetrain.runtime.python.device_api import Trainer
from test_python_plan import Recorder, _expected, _import

HAVE_HOST = bool(shutil.which("gcc") and shutil.which("make"))
Q8 = "edgetrain.q8_"


def _compile(out: Path, model: str = "mcu_mbv2_40", **kw) -> dict:
    opts = dict(model=model, target="nrf52840", budget="auto", out=str(out), batch_size=1, emit="python",
                time_limit=20.0, quantize_frozen="int8")
    opts.update(kw)
    return compile_model(CompileOptions(**opts))


def _run(out: Path, capsys, *extra: str) -> tuple[int, dict]:
    rc = cli.main(["run", str(out), "--json", *extra])
    return rc, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _boundary(out: Path, names, batches) -> np.ndarray:
    """The plan's boundary tensors as its last step made them, flat, in `names`' order."""
    with Trainer(out, device=torch.device("cpu")) as t:
        t.rt.observe = frozenset(names)
        for x, y in batches:
            t.step(x, y)
        return np.concatenate([t.rt.observed[n].reshape(-1).numpy() for n in names])


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    out = tmp_path_factory.mktemp("q8py") / "py"
    return out, _compile(out)


def test_the_plan_calls_the_q8_ops_on_int8_parameters_the_render_wrote(plan):
    out, summary = plan
    assert summary["int8_prefix"]["nodes"] == 19
    body = json.loads((out / "schedule.json").read_text())
    text = (out / "plan.py").read_text()
    convs = [n for n in body["graph"]["nodes"] if n["op"] == "edgetrain.q8_conv2d.default"]
    assert len(convs) == 11 and text.count("torch.ops.edgetrain.q8_conv2d.default,") == 11
    for op in ("q8_quantize", "q8_relu6", "q8_add", "q8_dequantize"):
        assert f"torch.ops.edgetrain.{op}.default," in text
    # the integers the runtime loads: int8 weights, int32 biases, the schedule's sizes, conv_integers' values
    weights, floats = load_file(str(out / "weights.safetensors")), load_file(str(out / PREFIX_FLOATS))
    params = body["graph"]["params"]
    for c in convs:
        q = c["attrs"]["q8"]
        want = conv_integers(q, {p: floats[f"param/{p}"].astype(np.float64) for p in (q["weight"], q["bias"]) if p})
        for p, v in want.items():
            got = weights[f"param/{p}"]
            assert got.dtype == v.dtype == np.dtype(params[p]["dtype"]) and np.array_equal(got, v)
    assert weights[f"param/{convs[0]['attrs']['q8']['weight']}"].dtype == np.int8
    assert set(floats) == {f"param/{p}" for c in convs for p in (c["attrs"]["q8"]["weight"], c["attrs"]["q8"]["bias"])
                           if p}
    # a float parameter of the head stays float32 and is not in the float originals' file
    assert weights["param/classifier.weight"].dtype == np.float32 and "param/classifier.weight" not in floats


def test_every_q8_call_reads_back_as_its_schedule_node_in_short_lines(plan):
    out, _ = plan
    body = json.loads((out / "schedule.json").read_text())
    nodes = {n["name"]: n for n in body["graph"]["nodes"]}
    rec = Recorder()
    _import(out / "plan.py").train_step(rec)
    steps = body["steps"]
    assert [s[:2] for s in rec.steps] == [(s["action"], s["tensor"]) for s in steps]
    q8 = [(i, nodes[st["tensor"]]) for i, st in enumerate(steps)
          if st["action"] == "compute" and nodes[st["tensor"]]["op"].startswith(Q8)]
    assert len(q8) == 21  # the quantisation, 19 nodes, the dequantisation
    for i, node in q8:
        assert rec.steps[i][2] == _expected(steps, i, node)
    assert max(len(line) for line in (out / "plan.py").read_text().splitlines()) <= WIDTH


def test_run_check_holds_the_boundary_bit_for_bit_the_head_to_autograd_and_the_ledger_to_the_prediction(plan, capsys):
    out, _ = plan
    rc, r = _run(out, capsys, "--steps", "3", "--check")
    assert rc == 0 and r["ok"], r
    assert r["int8_boundary_mismatches"] == 0 and r["int8_boundary_floats"] == 3200
    assert r["measured_peak_bytes"] == r["predicted_peak_bytes"] <= r["budget_bytes"]
    assert r["max_rel_err"] <= 1e-5 and not r["mismatched"] and r["device"] == "cpu"
    assert len(r["losses"]) == 3 and r["losses"] == pytest.approx(r["reference_losses"], rel=1e-5)


def test_a_reference_one_zero_point_off_and_a_changed_integer_weight_are_caught(plan):
    out, _ = plan
    body = json.loads((out / "schedule.json").read_text())
    ref = Int8Reference(body, str(out / PREFIX_FLOATS))
    names = [n.name for n in ref.boundary]
    batches = schedule_batches(body, "random", 1, 1)
    with Trainer(out, device=torch.device("cpu")) as t:
        t.rt.observe = frozenset(names)
        t.step(*batches[0])
        ours = np.concatenate([t.rt.observed[n].reshape(-1).numpy() for n in names])
        assert boundary_mismatches(ours, ref.flat(batches[0][0])) == 0
        program = json.loads(ref.program)
        next(s for s in program if s["op"] == "q8_conv2d")["q8"]["zp"] += 1
        off = Int8Reference(body, str(out / PREFIX_FLOATS))
        off.program = json.dumps(program)
        assert boundary_mismatches(ours, off.flat(batches[0][0])) > 0
        # the integers the plan holds are held to conv_integers of the float model: one weight one unit off fails
        model, _ = train_reference(body, str(out / "weights.safetensors"), batches, torch.device("cpu"),
                                   feed=ref.feed, floats=str(out / PREFIX_FLOATS))
        assert not _compare(model, t.rt, body, ref.values)[2]
        w = next(p for p, v in ref.values.items() if v.dtype == np.int8)
        t.rt.params[w].view(-1)[0] += 1 if t.rt.params[w].view(-1)[0] < 127 else -1
        assert _compare(model, t.rt, body, ref.values)[2] == [f"param {w}"]


@pytest.mark.skipif(not HAVE_HOST, reason="gcc and make are needed to build the firmware")
def test_the_python_plan_and_the_c_firmware_hand_their_heads_the_same_boundary(plan, tmp_path):
    from edgetrain.codegen.c.runner import run_program, verified_firmware

    out, _ = plan
    fw = tmp_path / "fw"
    _compile(fw, emit="c")
    body, manifest = verified_firmware(str(fw))
    batches = schedule_batches(body, "random", 2, 3)
    firmware = run_program(str(fw), body, manifest, batches, qemu=False).result["int8_boundary"]
    ours = _boundary(out, manifest["int8_boundary"], batches)
    assert ours.size == firmware.size == 3200
    assert boundary_mismatches(ours, firmware) == 0


def test_a_tiled_int8_prefix_runs_patch_by_patch_and_checks(tmp_path, capsys):
    out = tmp_path / "tiled"
    r = _compile(out, budget="90000")
    assert r["tiled"] and r["tiled"][0]["replaces"][0] == "input_q8"
    body = json.loads((out / "schedule.json").read_text())
    tiled = [n for n in body["graph"]["nodes"] if n["op"] == "edgetrain.patch_forward.default"]
    assert len(tiled) == 1 and tiled[0]["attrs"]["args"][2].startswith('{"dtype":"int8"')
    rc, res = _run(out, capsys, "--steps", "2", "--check")
    assert rc == 0 and res["ok"], res
    assert res["int8_boundary_mismatches"] == 0 and res["measured_peak_bytes"] == res["predicted_peak_bytes"]


def test_the_int8_boundary_is_paged_at_its_bytes_and_its_dequantisation_recomputed(tmp_path, capsys):
    out = tmp_path / "paged"
    _compile(out, model=str(Path(__file__).with_name("test_q8_store.py")) + ":frozen_backbone", budget="min",
             batch_size=2)
    body = json.loads((out / "schedule.json").read_text())
    nodes = {n["name"]: n for n in body["graph"]["nodes"]}
    paged = [s["tensor"] for s in body["steps"] if s["action"] == "page_out"]
    again = [s["tensor"] for s in body["steps"] if s["action"] == "recompute"]
    assert [nodes[t]["dtype"] for t in paged] == ["int8"] and [nodes[t]["op"] for t in again] == [
        "edgetrain.q8_dequantize.default"]
    rc, res = _run(out, capsys, "--steps", "2", "--check")
    assert rc == 0 and res["ok"], res
    assert res["paged_bytes"] == 2 * 2 * int(np.prod(nodes[paged[0]]["shape"]))  # out and in, a byte an element
    assert res["int8_boundary_mismatches"] == 0 and res["measured_peak_bytes"] == res["predicted_peak_bytes"]


SMALL_CNN = """import torch.nn as nn


def make():
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, stride=2, padding=1),
                         nn.Flatten(), nn.Linear(8 * 4 * 4, 10))
"""


def test_a_small_frozen_cnn_trains_its_linear_head_on_the_int8_prefix(tmp_path, capsys):
    model = tmp_path / "small.py"
    model.write_text(SMALL_CNN)
    out = tmp_path / "cnn"
    r = _compile(out, model=f"{model}:make", train="4.*", input_shape=(1, 8, 8), batch_size=4, budget="1MB",
                 target="rpi4")
    assert r["int8_prefix"]["nodes"] == 3
    body = json.loads((out / "schedule.json").read_text())
    assert [n["op"] for n in body["graph"]["nodes"] if n["op"].startswith(Q8)] == [
        "edgetrain.q8_quantize.default", "edgetrain.q8_conv2d.default", "edgetrain.q8_relu.default",
        "edgetrain.q8_conv2d.default", "edgetrain.q8_dequantize.default"]
    rc, res = _run(out, capsys, "--steps", "3", "--check")
    assert rc == 0 and res["ok"], res
    assert res["int8_boundary_mismatches"] == 0 and res["int8_boundary_floats"] == 4 * 8 * 4 * 4
    assert res["measured_peak_bytes"] == res["predicted_peak_bytes"] and res["max_rel_err"] <= 1e-5


def test_the_held_out_evaluation_runs_the_model_the_plan_trains(tmp_path):
    # a head with no batch norm: eval mode computes what a training step's forward does, so the evaluation of the
    # weights before a step equals that step's own loss (integers read as float weights would not)
    model = tmp_path / "small.py"
    model.write_text(SMALL_CNN)
    out = tmp_path / "cnn"
    _compile(out, model=f"{model}:make", train="4.*", input_shape=(1, 8, 8), batch_size=4, budget="1MB",
             target="rpi4")
    body = json.loads((out / "schedule.json").read_text())
    (x, y), = schedule_batches(body, "random", 1, 5)
    evaluator = Evaluator(body, torch.device("cpu"), Int8Reference(body, str(out / PREFIX_FLOATS)))
    with Trainer(out, device=torch.device("cpu")) as t:
        before = t.state_dict()
        loss = t.step(x, y)
    r = evaluator.evaluate(before, Dataset("batch", 4, lambda k: (x[k], y[k])))
    assert r["eval_examples"] == 4 and r["eval_loss"] == pytest.approx(loss, rel=1e-6)


def test_another_device_than_the_cpu_is_refused_in_one_error(plan, capsys):
    out, _ = plan
    rc, res = _run(out, capsys, "--device", "cuda", "--steps", "1")
    assert rc != 0 and "runs with numpy on the CPU" in res["error"]["message"] and "--device cpu" in \
        res["error"]["message"]
