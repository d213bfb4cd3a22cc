"""Facts about the user's model come from the model: its class count is read from its traced output, recorded
in the schedule, and every label that reaches training (random, a file, an image folder, a named dataset, a
`Trainer.step` call) is held against it before any training; local learning sizes its heads from it.

The models are written as users write them (tests/user_models.py, no `num_classes` anywhere), compiled at 50%
of plain backprop's activation memory and trained on .npz files of their own.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from edgetrain.compiler.errors import UnsupportedModelError
from edgetrain.compiler.pipeline import CompileOptions, build_graph, compile_model
from edgetrain.compiler.workbench.cli import main
from edgetrain.runtime.python import Trainer
from edgetrain.targets import load_target

USER = "tests/user_models.py"
# model -> (the classes its output scores, the labels of one example, the input of one example, its dtype)
MODELS = {
    "image_classifier": (10, (), (3, 32, 32), "float32"),
    "transformer_classifier": (5, (), (10,), "int64"),
    "token_classifier": (5, (), (12,), "int64"),  # a GRU over token ids
    "pixel_classifier": (4, (16, 16), (3, 16, 16), "float32"),
}
# Halfway between the smallest feasible budget and plain backprop's peak (the GRU's smallest is 75% of it).
HALF = {"token_classifier": "88%"}


def _cli(capsys, *args) -> tuple[int, dict]:
    rc = main([str(a) for a in args] + ["--json"])
    return rc, json.loads(capsys.readouterr().out)


def _refused(capsys, kind: str, *args) -> str:
    rc, r = _cli(capsys, *args)
    assert rc == 2 and r["error"]["kind"] == kind, r
    return r["error"]["message"]


def _data(path, model: str, n: int = 40, high: int | None = None, seed: int = 0):
    """x and y of `n` examples for `model`, labels drawn below `high` (default: its classes)."""
    classes, label_shape, shape, dtype = MODELS[model]
    g = np.random.default_rng(seed)
    x = g.integers(0, 80, (n, *shape)) if dtype == "int64" else g.random((n, *shape), dtype=np.float32)
    np.savez(path, x=x, y=g.integers(0, high or classes, (n, *label_shape)))
    return path


def _compile(capsys, model: str, out, budget: str = "50%", *extra) -> dict:
    shape = ["--input-shape", "3,32,32"] if model == "image_classifier" else []
    rc, r = _cli(capsys, "compile", f"{USER}:{model}", "--target", "rpi4", "--budget", budget, "--batch-size", 4,
                 "--time-limit", 10, "--out", out, *shape, *extra)
    assert rc == 0, r
    return r


@pytest.mark.parametrize("model", list(MODELS))
def test_users_model_compiles_at_half_and_trains_on_its_own_data(tmp_path, capsys, model):
    classes, label_shape, _, _ = MODELS[model]
    r = _compile(capsys, model, tmp_path / "plan", HALF.get(model, "50%"))
    assert r["peak_bytes"] <= r["budget_bytes"] and r["recomputes"] + r["page_ins"] > 0
    body = json.loads((tmp_path / "plan" / "schedule.json").read_text())
    assert body["model"]["num_classes"] == body["graph"]["num_classes"] == classes
    labels = next(n for n in body["graph"]["nodes"] if n["kind"] == "labels")
    assert labels["shape"] == [4, *label_shape]
    rc, run = _cli(capsys, "run", tmp_path / "plan", "--data", _data(tmp_path / "d.npz", model), "--epochs", 2)
    assert rc == 0 and run["ok"], run
    assert run["steps"] == 2 * (36 // 4) and all(np.isfinite(run["losses"]))  # 10% held out
    assert run["measured_peak_bytes"] == run["predicted_peak_bytes"]
    rc, rnd = _cli(capsys, "run", tmp_path / "plan", "--steps", 2, "--check")  # random labels from its classes
    assert rc == 0 and rnd["ok"] and rnd["max_abs_err"] <= 1e-6, rnd
    # one label past the classes: refused before training, with the count and the label
    bad = _data(tmp_path / "bad.npz", model)
    arrays = dict(np.load(bad))
    arrays["y"].reshape(-1)[7] = classes
    np.savez(bad, **arrays)
    msg = _refused(capsys, "DataError", "run", tmp_path / "plan", "--data", bad, "--epochs", 1)
    assert f"label {classes} " in msg and f"0..{classes - 1}" in msg and f"{classes} classes" in msg, msg


def test_a_named_dataset_with_more_classes_than_the_model_is_refused(tmp_path, capsys):
    compile_model(CompileOptions(model="small_cnn", target="rpi4", budget="100%", out=str(tmp_path / "p"),
                                 batch_size=4, time_limit=5, model_kwargs={"num_classes": 5}))
    assert json.loads((tmp_path / "p" / "schedule.json").read_text())["model"]["num_classes"] == 5
    msg = _refused(capsys, "DataError", "run", tmp_path / "p", "--data", "digits", "--epochs", 1)
    assert "digits" in msg and "label " in msg and "0..4" in msg and "5 classes" in msg, msg


def test_an_image_folder_with_more_classes_than_the_model_is_refused(tmp_path, capsys):
    _compile(capsys, "pixel_classifier", tmp_path / "p", "100%")  # scores 4 classes
    for k in range(5):
        (tmp_path / "imgs" / f"c{k}").mkdir(parents=True)
        Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(tmp_path / "imgs" / f"c{k}" / "a.png")
    msg = _refused(capsys, "DataError", "run", tmp_path / "p", "--data", tmp_path / "imgs", "--epochs", 1)
    assert "5 class folders" in msg and "4 classes" in msg, msg


def test_trainer_step_refuses_labels_outside_the_classes(tmp_path, capsys):
    _compile(capsys, "transformer_classifier", tmp_path / "p", "100%")
    x = torch.randint(0, 80, (4, 10))
    with Trainer(tmp_path / "p") as t:
        assert t.plan.PLAN["num_classes"] == 5
        assert np.isfinite(t.step(x, torch.tensor([0, 1, 2, 4])))
        with pytest.raises(ValueError, match=r"label 72 is outside 0\.\.4"):
            t.step(x, torch.tensor([0, 72, 1, 2]))
        with pytest.raises(ValueError, match="label -1"):
            t.step(x, torch.tensor([0, -1, 1, 2]))
        with pytest.raises(ValueError, match=r"labels of shape \[4, 1\]"):
            t.step(x, torch.zeros(4, 1, dtype=torch.int64))
        with pytest.raises(ValueError, match="integer class ids"):
            t.step(x, torch.zeros(4))
        assert t.steps_done == 1  # nothing ran for the refused batches


def test_a_num_classes_attribute_overrides_the_output_but_never_exceeds_it():
    target = load_target("rpi4")
    opts = CompileOptions(model=f"{USER}:encoder", target="rpi4", budget="100%", out="", batch_size=2)
    assert build_graph(opts, target)[2].num_classes == 4  # its attribute, equal to its output's
    with pytest.raises(UnsupportedModelError, match="num_classes = 9, but its output scores 4"):
        build_graph(CompileOptions(model=f"{USER}:too_many_classes", target="rpi4", budget="100%", out="",
                                   batch_size=2), target)
    fewer = build_graph(CompileOptions(model=f"{USER}:fewer_classes", target="rpi4", budget="100%", out="",
                                       batch_size=2), target)[2]
    assert fewer.num_classes == 3


def test_a_sequence_classifier_over_token_ids_takes_class_labels_not_vocabulary_ids():
    """(B, C) logits over token ids: classes on dim 1; (B, T, V) logits: the last dim, one label per position."""
    target = load_target("rpi4")
    seq = build_graph(CompileOptions(model=f"{USER}:token_classifier", target="rpi4", budget="100%", out="",
                                     batch_size=2), target)[2]
    lm = build_graph(CompileOptions(model=f"{USER}:tied_lm", target="rpi4", budget="100%", out="", batch_size=2),
                     target)[2]
    labels = {g.model: next(n for n in g.nodes if n.kind == "labels").shape for g in (seq, lm)}
    assert (seq.num_classes, labels[seq.model]) == (5, (2,))
    assert (lm.num_classes, labels[lm.model]) == (32, (2, 8))


LOCAL_FACTORY = """\
import torch.nn as nn


def make():
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, 10))
"""


def test_local_learning_as_the_readme_writes_it(tmp_path, capsys):
    """`compile --mode local` without --lr or --weight-decay, on a factory that takes no num_classes, then
    `train` exactly as the README shows; `run` of that folder says to use `train`."""
    (tmp_path / "mynet.py").write_text(LOCAL_FACTORY)
    plan = tmp_path / "local"
    rc, r = _cli(capsys, "compile", f"{tmp_path / 'mynet.py'}:make", "--mode", "local", "--target", "jetson-agx-orin",
                 "--budget", "1MB", "--input-shape", "1,8,8", "--out", plan)
    assert rc == 0, r
    body = json.loads((plan / "schedule.json").read_text())
    assert body["model"]["num_classes"] == 10 and {h["classes"] for h in body["local"]["heads"]} == {10}
    training = body["local"]["training"]
    assert (training["lr"], training["momentum"], training["weight_decay"]) == (0.01, 0.9, 5e-4)
    rc, t = _cli(capsys, "train", plan, "--data", "digits", "--epochs", 1, "--train-size", 300, "--no-export")
    assert rc == 0 and t["test_accuracy"] > 10.0, t
    msg = _refused(capsys, "EdgetrainError", "run", plan)
    assert "local-learning plan" in msg and "edgetrain train" in msg, msg
    msg = _refused(capsys, "EdgetrainError", "compile", f"{tmp_path / 'mynet.py'}:make", "--mode", "local",
                   "--target", "jetson-agx-orin", "--budget", "1MB", "--input-shape", "1,8,8", "--optimizer", "adam",
                   "--out", tmp_path / "adam")
    assert "SGD" in msg, msg
