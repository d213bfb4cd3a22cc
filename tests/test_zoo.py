"""The model zoo: every model trains one step on its own input shape, deterministically."""

import pytest
import torch
from torch import nn

from edgetrain.compiler.frontend import zoo
from edgetrain.compiler.frontend.zoo import ZOO, ZooEntry, build

MCU = ["mcu_cnn", "mcu_resnet", "mcu_mobilenetv2", "mcu_mobilenetv3", "mcu_wide_mlp", "mcu_mbv2_40", "mcu_mbv2_w035"]  # models for --emit c
EXPECTED = ["mlp", "small_cnn", "vgg11", "vgg16", "vgg19", "resnet10", "resnet18", "resnet50", "mobilenetv2", *MCU]
TRANSFORMERS = ["bert_base", "gpt_small", "bert_tiny", "gpt_tiny"]  # tests/test_transformer_frontend.py


def test_registry_names():
    assert list(ZOO) == EXPECTED + TRANSFORMERS
    for name in EXPECTED:
        entry = ZOO[name]
        assert isinstance(entry, ZooEntry) and entry.name == name
        assert len(entry.input_shape) == 3 and entry.num_classes == 10 and entry.description


@pytest.mark.parametrize("name", EXPECTED)
def test_forward_backward(name):
    entry = ZOO[name]
    torch.manual_seed(0)
    model = build(name)
    model.train()
    x = torch.randn(2, *entry.input_shape)
    out = model(x)
    assert out.shape == (2, entry.num_classes)
    nn.functional.cross_entropy(out, torch.tensor([0, 1])).backward()
    trained = [p for p in model.parameters() if p.requires_grad]
    assert trained and all(p.grad is not None and torch.isfinite(p.grad).all() for p in trained)
    frozen = [p for p in model.parameters() if not p.requires_grad]  # fine-tuning models: early layers frozen
    assert all(p.grad is None for p in frozen)
    assert bool(frozen) == name.startswith(("mcu_mobilenet", "mcu_wide", "mcu_mbv2"))


@pytest.mark.parametrize("name", [m for m in MCU if m != "mcu_mbv2_w035"])  # that one: tests/test_tiling.py
def test_mcu_models_have_a_c_kernel_for_every_op(name):
    from edgetrain.compiler.pipeline import CompileOptions, build_graph
    from edgetrain.targets import load_target

    g = build_graph(CompileOptions(model=name, target="nrf52840", budget="auto", out="", batch_size=1, emit="c"),
                    load_target("nrf52840"))[2]
    assert g.frozen_in_flash  # the only workspace: frozen weights beyond the flash, paged in by their readers
    assert all(n.workspace_bytes == sum(g.params[p].bytes for p in n.streamed) for n in g.nodes)
    assert bool(g.streamed_params) == (name == "mcu_wide_mlp")


@pytest.mark.parametrize("name", ["mlp", "small_cnn", "resnet18"])
def test_init_is_deterministic(name):
    torch.manual_seed(123)
    a = build(name).state_dict()
    torch.manual_seed(123)
    b = build(name).state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_num_classes_kwarg():
    assert build("small_cnn", num_classes=3)(torch.randn(2, 1, 28, 28)).shape == (2, 3)


def test_reference_parameter_counts():
    # Well-known sizes of the CIFAR variants: a wrong stage or shortcut shows up here.
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(build("resnet18")) == 11_173_962
    assert count(build("vgg16")) == 14_724_042
    assert count(build("mlp")) == 784 * 512 + 512 + 3 * (512 * 512 + 512) + 512 * 10 + 10


def test_resnet18_keeps_torchvision_habits():
    model = build("resnet18")
    block = model.layer2[0]
    assert isinstance(block.relu, nn.ReLU) and block.relu.inplace
    assert isinstance(block.downsample, nn.Sequential)  # 1x1 conv + BN shortcut
    assert isinstance(model.layer1[0].downsample, nn.Identity)


def test_mobilenetv2_width_mult():
    narrow = build("mobilenetv2", width_mult=0.5)
    assert narrow(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    full = build("mobilenetv2")
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(narrow) < count(full)
    assert full.classifier.in_features == 1280
    depthwise = [m for m in full.modules() if isinstance(m, nn.Conv2d) and m.groups > 1]
    assert depthwise and all(m.groups == m.in_channels == m.out_channels for m in depthwise)
    with pytest.raises(ValueError):
        build("mobilenetv2", width_mult=0)


def test_unknown_model_lists_names():
    with pytest.raises(KeyError) as err:
        build("resnet1000")
    assert isinstance(err.value, zoo.UnknownModelError)
    for name in EXPECTED:
        assert name in str(err.value)
