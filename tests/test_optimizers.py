"""Optimizers are units (runtime/python/optimizers): each one's update is its torch.optim class's, bit for bit; its
state is what torch keeps; and one entry in the table is all a new optimizer needs to reach `--optimizer`, the
memory model, the runtime, the exactness reference and the C refusal."""
from __future__ import annotations

import json

import pytest
import torch

from edgetrain.compiler.errors import UnsupportedModelError
from edgetrain.compiler.graph.ir import OptimizerConfig
from edgetrain.compiler.pipeline import CompileOptions, build_graph, compile_model
from edgetrain.compiler.workbench.reference import make_optimizer
from edgetrain.compiler.workbench.run import run_plan
from edgetrain.runtime.python.optim import Optimizer
from edgetrain.runtime.python.optimizers import OPTIMIZERS, OptimizerUnit, c_refusal, state_names
from edgetrain.runtime.python.optimizers.sgd import sgd_step
from edgetrain.targets import load_target

SETTINGS = [("sgd", {"momentum": 0.0, "weight_decay": 0.0}), ("sgd", {}), ("sgd", {"nesterov": True}),
            ("adam", {}), ("adam", {"weight_decay": 0.01}), ("adamw", {}), ("adagrad", {}),
            ("adagrad", {"weight_decay": 0.01, "lr": 0.1})]


def _params(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(7, 5, generator=g), "b": torch.randn(5, generator=g)}


def _train_both(config: dict, steps: int = 4):
    """The runtime's Optimizer and the reference's torch.optim optimizer, each `steps` updates from the same weights
    and gradients. Returns (runtime params, torch params, runtime Optimizer, torch optimizer)."""
    mine, ref = _params(), {k: v.clone().requires_grad_(True) for k, v in _params().items()}
    opt = Optimizer(config, mine, list(mine))
    torch_opt = make_optimizer(list(ref.values()), config)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        grads = {k: torch.randn(v.shape, generator=g) for k, v in mine.items()}
        for k, p in mine.items():
            opt.update(k, p, grads[k].clone(), grad_is_scratch=True)
        for k, p in ref.items():
            p.grad = grads[k].clone()
        torch_opt.step()
    return mine, ref, opt, torch_opt


@pytest.mark.parametrize("name, given", SETTINGS, ids=[f"{n}-{'-'.join(g) or 'defaults'}" for n, g in SETTINGS])
def test_each_update_is_torch_optims_bit_for_bit_with_the_same_state(name, given):
    config = OptimizerConfig.of(name, **given).to_json()
    mine, ref, opt, torch_opt = _train_both(config)
    for k in mine:
        assert torch.equal(mine[k], ref[k].detach()), (name, given, k)
    # The memory model's state bytes are what torch.optim holds for the same parameters.
    torch_bytes = sum(t.numel() * t.element_size() for st in torch_opt.state.values() for t in st.values()
                      if isinstance(t, torch.Tensor))
    assert sum(opt.state_bytes().values()) == torch_bytes, (opt.state_bytes(), name)


def test_settings_are_checked_before_the_compile(tmp_path, capsys):
    """A setting the optimizer does not take, or one torch.optim would refuse, is one clear error up front."""
    from edgetrain.compiler.workbench.cli import main

    with pytest.raises(ValueError, match="momentum"):  # what the unit's check stands for
        torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1, momentum=0.0, nesterov=True)
    for extra, said in ((["--optimizer", "adam", "--momentum", "0.5"], "--momentum is not a setting of adam"),
                        (["--nesterov", "--momentum", "0"], "momentum above 0"),
                        (["--optimizer", "adagrad", "--betas", "0.9,0.99"], "--optimizer adam or --optimizer adamw")):
        rc = main(["compile", "mlp", "--target", "rpi4", "--budget", "100%", "--out", str(tmp_path / "x"), "--json",
                   *extra])
        error = json.loads(capsys.readouterr().out)["error"]
        assert rc == 2 and said in error["message"], error
    assert not (tmp_path / "x" / "schedule.json").exists()


def test_only_optimizers_with_a_c_kernel_reach_c_firmware():
    assert c_refusal(OptimizerConfig.of("sgd").to_json()) is None
    for name in OPTIMIZERS:
        if OPTIMIZERS[name].c_kernel is None:
            assert "SGD" in c_refusal(OptimizerConfig.of(name).to_json())
    assert "nesterov" in c_refusal(OptimizerConfig.of("sgd", nesterov=True).to_json())


def _sgd_without_momentum() -> OptimizerUnit:
    """A toy optimizer as a user would add one: plain SGD, no momentum and no state."""
    def update(s, param, state):
        return lambda grad, scratch: sgd_step(param, grad, None, s["lr"], 0.0, s["weight_decay"], False, scratch)

    return OptimizerUnit(name="plainsgd", torch_class="SGD", defaults={"lr": 0.05, "weight_decay": 0.0},
                         state=lambda s: (), flops=lambda s: 2 + 2 * bool(s["weight_decay"]), update=update)


def test_a_registered_optimizer_flows_through(monkeypatch, tmp_path, capsys):
    """One table entry: `--optimizer` takes it, its (empty) state is what the memory model counts, the runtime's
    update matches its torch class, a compiled plan trains exactly with it, and C firmware refuses it."""
    from edgetrain.compiler.workbench.cli import _parser

    monkeypatch.setitem(OPTIMIZERS, "plainsgd", _sgd_without_momentum())
    sub = next(a for a in _parser()._actions if a.dest == "cmd").choices["compile"]
    assert "plainsgd" in next(a for a in sub._actions if "--optimizer" in a.option_strings).choices
    config = OptimizerConfig.of("plainsgd", weight_decay=1e-3)
    assert config.lr == 0.05 and config.momentum == 0.0 and state_names(config.to_json()) == ()
    mine, ref, opt, _ = _train_both(config.to_json())
    assert opt.state_bytes() == {} and all(torch.equal(mine[k], ref[k].detach()) for k in mine)

    target = load_target("rpi4")
    with_momentum = build_graph(CompileOptions(model="mlp", target="rpi4", budget="100%", out="-", batch_size=4,
                                               optimizer=OptimizerConfig.of("sgd")), target)[2]
    plain = build_graph(CompileOptions(model="mlp", target="rpi4", budget="100%", out="-", batch_size=4,
                                       optimizer=config), target)[2]
    assert plain.optimizer_bytes == 0 and with_momentum.optimizer_bytes == with_momentum.param_bytes

    out = tmp_path / "plan"
    compile_model(CompileOptions(model="mlp", target="rpi4", budget="100%", out=str(out), batch_size=4,
                                 time_limit=10, optimizer=config))
    assert json.loads((out / "schedule.json").read_text())["graph"]["optimizer"]["name"] == "plainsgd"
    result = run_plan(str(out), steps=2, check=True)
    assert result["ok"] and result["max_abs_err"] == 0, result
    with pytest.raises(UnsupportedModelError, match="not plainsgd"):
        compile_model(CompileOptions(model="tests.c_models:tiny_cnn", target="nrf52840", budget="100%",
                                     out=str(tmp_path / "c"), batch_size=1, time_limit=10, emit="c",
                                     optimizer=config))


def test_adagrad_plan_trains_exactly(tmp_path):
    """Adagrad, the table's worked example, end to end: a plan that recomputes or pages, checked against
    torch.optim.Adagrad."""
    out = tmp_path / "plan"
    c = compile_model(CompileOptions(model="small_cnn", target="rpi4", budget="85%", out=str(out), batch_size=4,
                                     time_limit=10, optimizer=OptimizerConfig.of("adagrad")))
    assert c["recomputes"] + c["page_ins"] > 0
    result = run_plan(str(out), steps=3, check=True)
    assert result["ok"] and result["max_abs_err"] == 0, result
