"""AAN-LL heads: the sizing rule's invariants, real head shapes/bytes, and the zoo layer split."""
import io

import pytest
import torch

from edgetrain.compiler.frontend import zoo
from edgetrain.compiler.local.heads import (HEAD_FRAC, MAX_FAN_IN, MAX_HEAD_CH, MIN_HEAD_CH, head_spec, print_sizing_table, sizing_table, split_layers)
from edgetrain.compiler.local.spec import make_head

EXPECTED_LAYERS = {
    "vgg11": ["features.0", "features.4", "features.8", "features.11", "features.15", "features.18",
              "features.22", "features.25"],
    "vgg16": [f"features.{i}" for i in (0, 3, 7, 10, 14, 17, 20, 24, 27, 30, 34, 37, 40)],
    "resnet18": ["stem"] + [f"layer{s}.{i}" for s in (1, 2, 3, 4) for i in (0, 1)],
}


@pytest.mark.parametrize("name", sorted(EXPECTED_LAYERS))
def test_split_layers_composes_to_the_trunk(name):
    torch.manual_seed(0)
    model = zoo.build(name).eval()
    layers = split_layers(model)
    assert [layer.name for layer in layers] == EXPECTED_LAYERS[name]
    # the layers share the model's parameters, and hold all of them except the final classifier
    model_ids = {id(p) for p in model.parameters()}
    layer_params = [p for layer in layers for p in layer.module.parameters()]
    assert {id(p) for p in layer_params} <= model_ids
    classifier = model.classifier if name.startswith("vgg") else model.fc
    assert sum(p.numel() for p in layer_params) + sum(p.numel() for p in classifier.parameters()) == \
        sum(p.numel() for p in model.parameters())
    # chaining the layers reproduces the trunk's output; shapes chain
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        y = x
        for prev, layer in zip([None] + layers, layers):
            assert tuple(y.shape[1:]) == layer.in_shape
            if prev is not None:
                assert prev.out_shape == layer.in_shape
            y = layer.module(y)
            assert tuple(y.shape[1:]) == layer.out_shape
        if name.startswith("vgg"):
            ref = model.features(x)
        else:
            ref = model.layer4(model.layer3(model.layer2(model.layer1(model.relu(model.bn1(model.conv1(x)))))))
    torch.testing.assert_close(y, ref)


def test_split_sequential_and_unsupported():
    layers = split_layers(zoo.build("small_cnn"), in_shape=(1, 28, 28))
    assert [layer.out_shape for layer in layers] == [(8, 28, 28), (8, 14, 14), (16, 14, 14), (16, 7, 7)]
    from edgetrain.compiler.errors import UnsupportedModelError
    with pytest.raises(UnsupportedModelError):
        split_layers(zoo.build("mlp"), in_shape=(1, 28, 28))


@pytest.mark.parametrize("shape", [(64, 32, 32), (64, 16, 16), (128, 8, 8), (256, 4, 4), (512, 2, 2),
                                   (512, 1, 1), (16, 7, 7), (8, 28, 28), (2048, 1, 1), (3, 5, 5)])
def test_head_spec_rule_and_real_head(shape):
    spec = head_spec(shape, classes=10)
    c, h, w = shape
    assert MIN_HEAD_CH <= spec.head_channels <= min(MAX_HEAD_CH, max(MIN_HEAD_CH, c // 4))
    assert spec.pool in (1, 2, 4) and spec.pool <= min(h, w)
    assert spec.head_channels * spec.pool ** 2 <= MAX_FAN_IN
    if spec.head_channels > MIN_HEAD_CH:
        assert spec.act_bytes_per_sample <= HEAD_FRAC * spec.layer_out_bytes_per_sample
    head = make_head(spec)
    assert sum(p.numel() for p in head.parameters()) == spec.params
    # the formula's activation bytes are the real sizes of the head's intermediate tensors
    x = torch.randn(3, *shape)
    conv_out = head[0](x)
    pooled = head[2](head[1](conv_out))
    logits = head[4](head[3](pooled))
    assert logits.shape == (3, 10)
    real = sum(t.numel() * t.element_size() for t in (conv_out, pooled, logits)) // 3
    assert real == spec.act_bytes_per_sample


@pytest.mark.parametrize("name", ["vgg11", "vgg16", "resnet18"])
def test_zoo_heads_are_small(name):
    rows = sizing_table(name)
    assert len(rows) == len(EXPECTED_LAYERS[name])
    for r in rows:
        assert r["ratio"] <= HEAD_FRAC
    out = io.StringIO()
    print_sizing_table(name, file=out)
    assert out.getvalue().count("\n") == len(rows) + 2
