"""Early exits: the selection rule, the exit model, safetensors and ONNX export with an onnxruntime parity check."""
import sys
import warnings

import pytest
import torch
from hypothesis import given, settings, strategies as st

from edgetrain.compiler.frontend import zoo
from edgetrain.compiler.workbench.local_export import (DEFAULT_OPSET, ExportError, OnnxUnavailableError, check_onnx, count_params, exit_model, export_onnx, export_safetensors, load_safetensors, select_exit)
from edgetrain.compiler.local.heads import head_spec, split_layers
from edgetrain.compiler.local.spec import make_head

# -- select_exit -----------------------------------------------------------------------------------


def test_tie_within_tolerance_goes_to_fewer_params():
    # exit 2 is best, exit 1 is 0.3 points behind with far fewer parameters: exit 1
    assert select_exit([80.0, 90.0, 90.3, 89.0], [10, 200, 3000, 40000]) == 1
    # exactly at the tolerance still counts as a tie (float noise in 90.3 - 0.5 must not matter)
    assert select_exit([89.8, 90.3], [10, 20]) == 0
    # equal accuracy and equal params: the earlier exit
    assert select_exit([70.0, 90.0, 90.0], [5, 100, 100]) == 1


def test_outside_tolerance_the_best_accuracy_wins():
    assert select_exit([80.0, 90.0, 91.0], [10, 200, 3000]) == 2
    assert select_exit([80.0, 90.0, 90.3], [10, 200, 3000], tolerance_points=0.0) == 2
    assert select_exit([80.0, 90.0, 90.3], [10, 200, 3000], tolerance_points=20.0) == 0
    assert select_exit([55.5], [123]) == 0


@pytest.mark.parametrize("acc, params, match", [
    ([], [], "empty"),
    ([1.0, 2.0], [1], "2 accuracies but 1"),
    ([float("nan")], [1], "non-finite"),
    ([1.0], [-1], "negative"),
])
def test_select_exit_rejects_bad_input(acc, params, match):
    with pytest.raises(ValueError, match=match):
        select_exit(acc, params)
    with pytest.raises(ValueError, match="tolerance"):
        select_exit([1.0], [1], tolerance_points=-0.1)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 100), st.integers(0, 10**7)), min_size=1, max_size=20),
       st.floats(0, 5))
def test_select_exit_property(cands, tol):
    acc = [a for a, _ in cands]
    params = [p for _, p in cands]
    k = select_exit(acc, params, tol)
    best = max(acc)
    assert acc[k] >= best - tol - 1e-6                 # the pick is within tolerance of the best
    within = [j for j, a in enumerate(acc) if a >= best - tol + 1e-6]
    assert all(params[j] >= params[k] for j in within)  # nobody within tolerance is smaller
    assert all(j > k for j in within if params[j] == params[k] and j != k)  # ties: the earlier exit


# -- exit model and parameters ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def exits():
    """VGG-11's first two layers with their heads; BN given non-trivial running stats so that eval-mode
    export is actually exercised (fresh stats are 0/1, where train and eval BN nearly agree)."""
    torch.manual_seed(0)
    layers = split_layers(zoo.build("vgg11"))[:2]
    heads = [make_head(head_spec(tl.out_shape)) for tl in layers]
    gen = torch.Generator().manual_seed(1)
    for tl in layers:
        for m in tl.module.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
                m.num_batches_tracked.fill_(7)
    return layers, heads


def test_exit_model_shares_modules_and_counts_params(exits):
    layers, heads = exits
    m = exit_model(layers, heads, 1)
    assert list(dict(m.named_children())) == ["layer0", "layer1", "head"]
    assert m.layer1 is layers[1].module and m.head is heads[1]
    assert count_params(m) == layers[0].params + layers[1].params + count_params(heads[1])
    assert count_params(m) == sum(p.numel() for p in m.parameters())
    assert m(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    m0 = exit_model([tl.module for tl in layers], heads, 0)   # plain modules work as well
    assert count_params(m0) == layers[0].params + count_params(heads[0])
    shared = torch.nn.Sequential(m0.layer0, m0.layer0)         # a shared module counts once
    assert count_params(shared) == layers[0].params
    with pytest.raises(ValueError, match="out of range"):
        exit_model(layers, heads, 2)
    with pytest.raises(ValueError, match="heads"):
        exit_model(layers, heads[:1], 0)


# -- safetensors -----------------------------------------------------------------------------------


def test_safetensors_round_trip_is_bit_identical(exits, tmp_path):
    layers, heads = exits
    m = exit_model(layers, heads, 1)
    path = export_safetensors(m, tmp_path / "exit1.safetensors", {"exit": "1", "val_acc": "91.2"})
    assert path.read_bytes()[8:9] == b"{"  # a JSON header, not a pickle
    torch.manual_seed(123)
    fresh_layers = split_layers(zoo.build("vgg11"))[:2]
    fresh = exit_model(fresh_layers, [make_head(head_spec(tl.out_shape)) for tl in fresh_layers], 1)
    assert not torch.equal(fresh.state_dict()["layer0.1.running_mean"], m.state_dict()["layer0.1.running_mean"])
    meta = load_safetensors(fresh, path)
    assert meta == {"exit": "1", "val_acc": "91.2"}
    want, got = m.state_dict(), fresh.state_dict()
    assert list(want) == list(got) and "layer1.1.num_batches_tracked" in got
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k


def test_safetensors_mismatch_is_a_clear_error(exits, tmp_path):
    layers, heads = exits
    path = export_safetensors(exit_model(layers, heads, 1), tmp_path / "exit1.safetensors")
    other = exit_model(layers, heads, 0)             # no layer1, and head 0 has other shapes
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(ExportError) as err:
        load_safetensors(other, path)
    msg = str(err.value)
    assert "not in the model: layer1.0.weight" in msg and "head.0.weight: model (16, 64, 3, 3)" in msg
    assert all(torch.equal(v, other.state_dict()[k]) for k, v in before.items())  # left unchanged
    renamed = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with pytest.raises(ExportError, match="missing in the file: 0.bias, 0.weight"):
        load_safetensors(renamed, path)
    with pytest.raises(ExportError, match="str to str"):
        export_safetensors(renamed, tmp_path / "x.safetensors", {"exit": 1})


# -- ONNX ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def onnx_exit(exits, tmp_path_factory):
    layers, heads = exits
    m = exit_model(layers, heads, 1).train()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = export_onnx(m, torch.randn(1, 3, 32, 32), tmp_path_factory.mktemp("onnx") / "exit1.onnx",
                           metadata={"exit": "1"})
    return m, path, [str(w.message) for w in caught]


def test_onnx_export_matches_torch(onnx_exit):
    m, path, _ = onnx_exit
    assert m.training  # restored after the eval-mode export
    x = torch.randn(33, 3, 32, 32, generator=torch.Generator().manual_seed(5))  # not the traced batch
    res = check_onnx(m, path, x)
    assert res["n"] == 33 and res["opset"] == DEFAULT_OPSET
    assert res["same_predictions"] == 1.0
    assert res["max_abs_diff"] < 1e-4
    assert m.training
    # and check_onnx can fail: a model with other weights disagrees with the file
    layers = split_layers(zoo.build("vgg11"))[:2]
    other = exit_model(layers, [make_head(head_spec(tl.out_shape)) for tl in layers], 1)
    assert check_onnx(other, path, x)["max_abs_diff"] > 1e-2


def test_onnx_export_is_quiet_and_in_eval_mode(onnx_exit):
    # torch warns "Exporting a model while it is in training mode" when eval() was forgotten; the exporter's
    # own deprecation noise is filtered, so any warning left here is one the user should see.
    _, _, caught = onnx_exit
    assert caught == []


def test_onnx_file_has_dynamic_batch_and_records_the_opset(onnx_exit):
    import onnx

    _, path, _ = onnx_exit
    proto = onnx.load(str(path))
    dim0 = proto.graph.input[0].type.tensor_type.shape.dim[0]
    assert dim0.dim_param and not dim0.HasField("dim_value")
    assert [d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim[1:]] == [3, 32, 32]
    assert {o.domain: o.version for o in proto.opset_import}[""] == DEFAULT_OPSET
    props = {p.key: p.value for p in proto.metadata_props}
    assert props["edgetrain.opset"] == str(DEFAULT_OPSET) and props["exit"] == "1"
    assert proto.graph.input[0].name == "input" and proto.graph.output[0].name == "logits"


def test_missing_onnxruntime_says_what_to_install(onnx_exit, monkeypatch):
    m, path, _ = onnx_exit
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # makes `import onnxruntime` fail
    with pytest.raises(OnnxUnavailableError, match="pip install onnx onnxruntime onnxscript"):
        check_onnx(m, path, torch.randn(2, 3, 32, 32))
    monkeypatch.setitem(sys.modules, "onnxscript", None)
    with pytest.raises(ImportError, match="'onnxscript'"):
        export_onnx(m, torch.randn(2, 3, 32, 32), path.with_name("never.onnx"))
    assert not path.with_name("never.onnx").exists()
