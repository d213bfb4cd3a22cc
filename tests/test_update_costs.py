"""An optimizer step is part of the cost of the node that completes the parameter's gradient."""
from math import prod

import pytest

from edgetrain.compiler.graph.ir import OptimizerConfig
from edgetrain.compiler.pipeline import CompileOptions, build_graph
from edgetrain.runtime.python.optim import update_flops_per_element
from edgetrain.targets import load_target


def _graph(optimizer: OptimizerConfig, train: str | None = None):
    target = load_target("rpi4")
    opts = CompileOptions(model="small_cnn", target="rpi4", budget="100%", out="", batch_size=2,
                          optimizer=optimizer, train=train)
    return build_graph(opts, target)[2]


@pytest.mark.parametrize("config, per_element", [
    ({"name": "sgd", "momentum": 0.0, "weight_decay": 0.0}, 2),
    ({"name": "sgd", "momentum": 0.9, "weight_decay": 5e-4}, 6),
    ({"name": "sgd", "momentum": 0.9, "weight_decay": 5e-4, "nesterov": True}, 8),
    ({"name": "adam", "weight_decay": 0.0}, 13),
    ({"name": "adam", "weight_decay": 0.01}, 15),
    ({"name": "adamw", "weight_decay": 0.01}, 14),
])
def test_flops_per_element_follow_the_update_arithmetic(config, per_element):
    assert update_flops_per_element(config) == per_element


def test_each_updating_node_carries_its_optimizer_steps():
    plain = _graph(OptimizerConfig(name="sgd", momentum=0.0, weight_decay=0.0))
    adamw = _graph(OptimizerConfig(name="adamw", weight_decay=0.01))
    assert [n.name for n in plain.nodes] == [n.name for n in adamw.nodes]
    updating = 0
    for a, b in zip(plain.nodes, adamw.nodes):
        elements = sum(prod(plain.params[p].shape) for p in a.updates)
        assert b.flops - a.flops == (14 - 2) * elements, a.name
        updating += bool(a.updates)
    assert updating > 0
    assert sorted(p for n in plain.nodes for p in n.updates) == sorted(plain.trainable_params)
    # Energy follows FLOPs: AdamW's step costs more on the target.
    assert sum(n.energy_j for n in adamw.nodes) > sum(n.energy_j for n in plain.nodes)

