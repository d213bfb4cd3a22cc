"""The model zoo: every model trains one step on its own input shape, deterministically."""

import pytest
import torch
from torch import nn

from edgetrain.compiler.frontend import zoo
from edgetrain.compiler.frontend.zoo import ZOO, ZooEntry, build

EXPECTED = ["mlp", "small_cnn", "vgg11", "vgg16", "vgg19", "resnet10", "resnet18", "resnet50", "mobilenetv2",
            "mcu_cnn", "mcu_resnet"]
TRANSFORMERS = ["bert_base", "gpt_small", "bert_tiny", "gpt_tiny"]  # tests/test_transformer_frontend.py

# The closed op set the frontend supports (zoo.py docstring). Containers are structure.
ALLOWED_MODULES = (
    nn.Conv2d, nn.Linear, nn.ReLU, nn.ReLU6, nn.BatchNorm2d, nn.MaxPool2d, nn.AvgPool2d,
    nn.AdaptiveAvgPool2d, nn.Flatten, nn.Dropout, nn.Identity,
)


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
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("name", EXPECTED)
def test_uses_only_supported_modules(name):
    for module in build(name).modules():
        if list(module.children()):
            continue  # containers and blocks: their leaves are checked
        assert isinstance(module, ALLOWED_MODULES), f"{name}: {type(module).__name__}"


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
