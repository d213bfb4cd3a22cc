"""`--train`: which parameters train. Parsing (fnmatch patterns, biases, last:N, all, errors), and an end-to-end
compile and checked run of a selection: exact against autograd, frozen parameters untouched, and a smaller
smallest feasible budget than training every parameter."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn
from safetensors.torch import load_file

from edgetrain.compiler.errors import TrainSelectionError
from edgetrain.compiler.frontend.train_select import apply_selection, parse_train_spec, select_trainable
from edgetrain.compiler.workbench import cli


class Net(nn.Module):
    """Parameters named like a torchvision classifier: features.N.weight/bias, classifier.weight/bias."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 3, bias=False))
        self.classifier = nn.Linear(4, 3)


NAMES = ["features.0.weight", "features.0.bias", "features.1.weight", "features.1.bias", "features.3.weight",
         "classifier.weight", "classifier.bias"]


def test_parameter_names_are_the_models():
    assert [n for n, _ in Net().named_parameters()] == NAMES


@pytest.mark.parametrize("spec, chosen", [
    ("classifier.*", {"classifier.weight", "classifier.bias"}),
    ("features.1.*,classifier.bias", {"features.1.weight", "features.1.bias", "classifier.bias"}),
    ("*.weight", {n for n in NAMES if n.endswith("weight")}),
    ("features.?.bias", {"features.0.bias", "features.1.bias"}),
    ("biases", {"features.0.bias", "features.1.bias", "classifier.bias"}),
    ("last:1", {"classifier.weight", "classifier.bias"}),
    ("last:2", {"features.3.weight", "classifier.weight", "classifier.bias"}),  # modules in registration order
    ("last:4", set(NAMES)),
    ("all", set(NAMES)),
    (" biases , classifier.weight ", {"features.0.bias", "features.1.bias", "classifier.bias", "classifier.weight"}),
])
def test_selection(spec, chosen):
    assert select_trainable(Net(), spec) == chosen


def test_patterns_are_case_sensitive_and_dots_literal():
    m = nn.Sequential(*[nn.Linear(2, 2) for _ in range(12)])
    assert select_trainable(m, "1.*") == {"1.weight", "1.bias"}  # not 10.* or 11.*
    with pytest.raises(TrainSelectionError):
        select_trainable(Net(), "Classifier.*")


def test_apply_freezes_everything_else():
    m = Net()
    apply_selection(m, select_trainable(m, "biases"))
    assert {n for n, p in m.named_parameters() if p.requires_grad} == {"features.0.bias", "features.1.bias",
                                                                       "classifier.bias"}


def test_tied_parameters_are_selected_under_their_first_name():
    m = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=False))
    m[1].weight = m[0].weight  # an LM head sharing the embedding
    assert select_trainable(m, "last:1") == {"0.weight"}


@pytest.mark.parametrize("spec, words", [
    ("head.*", ["'head.*' matches no parameter", "features.0.weight", "classifier.bias"]),
    ("last:0", ["last:N", "at least 1"]),
    ("last:two", ["last:N", "whole number"]),
    ("last:5", ["only 4 modules", "last:4"]),
    ("", ["empty item"]),
    ("classifier.*,", ["empty item"]),
])
def test_errors_name_the_problem(spec, words):
    with pytest.raises(TrainSelectionError) as e:
        select_trainable(Net(), spec)
    for w in words:
        assert w in str(e.value)


def test_biases_without_biases_and_a_model_without_parameters():
    with pytest.raises(TrainSelectionError, match="no parameter whose name ends in 'bias'"):
        select_trainable(nn.Linear(3, 3, bias=False), "biases")
    with pytest.raises(TrainSelectionError, match="nothing to train"):
        select_trainable(nn.ReLU(), "all")


def test_parse_keeps_the_items():
    assert parse_train_spec("a.*,biases,last:3") == ["a.*", "biases", "last:3"]


# -- end to end ----------------------------------------------------------------------------------------------

def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """small_cnn at store-all with SGD (momentum, weight decay), training its last two modules only."""
    out = tmp_path_factory.mktemp("sel") / "o"
    rc = cli.main(["compile", "small_cnn", "--target", "rpi4", "--budget", "100%", "--scheduler", "store-all",
                   "--batch-size", "4", "--optimizer", "sgd", "--train", "last:2", "--out", str(out), "--json"])
    return rc, out


def test_compile_records_the_selection_and_what_it_saves(compiled, capsys):
    rc, out = compiled
    body = json.loads((out / "schedule.json").read_text())
    assert rc == 0
    assert set(body["graph"]["trainable"]) == {"11.weight", "11.bias", "16.weight", "16.bias"}
    assert body["model"]["train"] == "last:2"
    assert len(body["graph"]["params"]) == 14  # frozen parameters are still weights of the plan
    rc = cli.main(["compile", "small_cnn", "--target", "rpi4", "--budget", "100%", "--scheduler", "store-all",
                   "--batch-size", "4", "--train", "last:2", "--out", str(out.parent / "again"), "--json"])
    r = _json(capsys)
    assert rc == 0 and r["train"] == "last:2" and r["trainable_tensors"] == 4 and r["param_tensors"] == 14
    assert r["trainable_params"] == 16 * 10 + 10 + 16 * 2 and r["trainable_bytes"] == 4 * r["trainable_params"]
    full = r["all_trainable"]
    assert r["min_feasible_bytes"] < full["min_feasible_bytes"]  # freezing lowers the smallest feasible budget
    assert r["store_all_peak_bytes"] < full["store_all_peak_bytes"]


def test_checked_run_is_exact_and_frozen_parameters_do_not_move(compiled, capsys, tmp_path):
    rc, out = compiled
    assert rc == 0
    saved = tmp_path / "trained.safetensors"
    rc = cli.main(["run", str(out), "--steps", "2", "--check", "--save", str(saved), "--json"])
    r = _json(capsys)
    assert rc == 0 and r["ok"], r
    assert r["max_abs_err"] == 0  # the same kernels as autograd, so bit for bit
    before = load_file(str(out / "weights.safetensors"))
    after = load_file(str(saved))
    trainable = {"11.weight", "11.bias", "16.weight", "16.bias"}
    for name, value in after.items():
        if f"param/{name}" not in before:
            continue  # a buffer: batch-norm statistics move in training mode, frozen or not
        same = torch.equal(value, before[f"param/{name}"])
        assert same == (name not in trainable), name


def test_without_train_nothing_changes(tmp_path, capsys):
    rc = cli.main(["compile", "small_cnn", "--target", "rpi4", "--budget", "100%", "--scheduler", "store-all",
                   "--batch-size", "2", "--out", str(tmp_path / "o"), "--json"])
    r = _json(capsys)
    assert rc == 0 and r["train"] is None and r["all_trainable"] is None
    assert r["trainable_tensors"] == r["param_tensors"] == 14
    assert "train" not in json.loads((tmp_path / "o" / "schedule.json").read_text())["model"]


def test_bad_selection_is_one_json_error(tmp_path, capsys):
    rc = cli.main(["compile", "small_cnn", "--target", "rpi4", "--budget", "100%", "--train", "fc.*",
                   "--out", str(tmp_path / "o"), "--json"])
    r = _json(capsys)
    assert rc == 2 and r["ok"] is False and r["error"]["kind"] == "TrainSelectionError"
    assert "'fc.*' matches no parameter" in r["error"]["message"] and "0.weight" in r["error"]["message"]
    assert not (tmp_path / "o" / "schedule.json").exists()


def test_train_with_local_learning_is_refused(tmp_path, capsys):
    rc = cli.main(["compile", "small_cnn", "--mode", "local", "--target", "rpi4", "--budget", "4MB", "--train",
                   "biases", "--out", str(tmp_path / "o"), "--json"])
    r = _json(capsys)
    assert rc == 2 and "--mode local" in r["error"]["message"]
