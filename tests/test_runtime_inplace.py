"""In-place elementwise ops where the plan frees the operand next: same bits, same ledger, the operand's bytes
reused, and a plan that reads an overwritten operand refused."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from edgetrain.codegen.python_plan import dying_operands
from edgetrain.runtime.python import PlanError, Runtime
from edgetrain.runtime.python.aten_call import resolve
from edgetrain.runtime.python.inplace import COMMUTATIVE, INPLACE

RELU, ADD = "aten.relu.default", "aten.add.Tensor"
ARGS = {"aten.hardtanh.default": [0.0, 6.0], "aten.leaky_relu.default": [0.01]}


def T(k: int) -> dict:
    return {"$t": k}


@pytest.mark.parametrize("op", sorted(INPLACE))
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_in_place_twin_gives_the_same_bits(op, layout):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 5, 7, 3, generator=g) * 4
    y = torch.randn(2, 5, 7, 3, generator=g)
    if layout == "channels_last":
        x, y = x.to(memory_format=torch.channels_last), y.to(memory_format=torch.channels_last)
    operands = [x, y] if op in COMMUTATIVE else [x, *ARGS.get(op, [])]
    want = resolve(op)(*operands)
    if op in COMMUTATIVE:  # the runtime may write into either operand: b + a must be a + b bit for bit
        swapped = resolve(INPLACE[op])(y.clone(), x)
        assert torch.equal(swapped, want) and swapped.stride() == want.stride()
    into = operands[0].clone()
    got = resolve(INPLACE[op])(into, *operands[1:])
    assert got.data_ptr() == into.data_ptr()
    assert torch.equal(got, want) and got.stride() == want.stride()


@pytest.fixture
def rt(tmp_path):
    save_file({"param/w": torch.ones(3)}, str(tmp_path / "w.safetensors"))
    r = Runtime(tmp_path / "w.safetensors", tmp_path / "pages", device="cpu", lr=0.1)
    x = torch.randn(4, 3)
    r.begin_step(x, torch.zeros(4, dtype=torch.long))
    return r


def test_relu_writes_into_its_dying_operand_and_the_ledger_counts_as_scheduled(rt):
    x = rt.tensor(rt.load_input())
    want = torch.relu(x)
    state = rt.ledger.live_bytes
    rt.compute("a", ADD, ["input", "input"], attrs={"args": [T(0), T(1)]})
    a = rt.tensor("a")
    out = rt.compute("r", RELU, ["a"], attrs={"args": [T(0)], "dying": [0]})
    assert out.data_ptr() == a.data_ptr() and rt.in_place_ops == 1
    assert torch.equal(out, torch.relu(x + x)) and not torch.equal(out, want)
    # counted as two tensors until the free, as the schedule counts them
    assert rt.ledger.live_bytes == state + 2 * 48 and rt.ledger.peak_bytes >= state + 2 * 48
    with pytest.raises(PlanError, match=r"'a' was overwritten in place by 'r' at op #3"):
        rt.compute("s", RELU, ["a"], attrs={"args": [T(0)]})
    with pytest.raises(PlanError, match=r"'a' was overwritten in place"):
        rt.page_out("a")
    rt.free("a")
    assert rt.ledger.live_bytes == state + 48
    rt.free("r")
    rt.free("input")
    rt.end_step()
    assert rt.leftovers == []


def test_add_writes_into_whichever_operand_dies(rt):
    x = rt.tensor(rt.load_input())
    rt.compute("a", RELU, ["input"], attrs={"args": [T(0)]})
    rt.compute("b", "aten.neg.default", ["input"], attrs={"args": [T(0)]})
    b = rt.tensor("b")
    out = rt.compute("s", ADD, ["a", "b"], attrs={"args": [T(0), T(1)], "dying": [1]})
    assert out.data_ptr() == b.data_ptr()
    assert torch.equal(out, torch.relu(x) + -x)
    assert torch.equal(rt.tensor("a"), torch.relu(x))  # the live operand untouched


@pytest.mark.parametrize("case", ["view", "alpha", "broadcast", "shared", "twice", "not dying", "writing"])
def test_out_of_place_wherever_in_place_could_be_seen(rt, case):
    x = rt.tensor(rt.load_input())
    rt.compute("a", "aten.neg.default", ["input"], attrs={"args": [T(0)]})
    a = rt.tensor("a")
    inputs, attrs, op = ["a"], {"args": [T(0)], "dying": [0]}, RELU
    if case == "view":
        inputs = [{"t": "a", "view": [["aten.t.default", []]]}]
    elif case == "alpha":
        op, inputs, attrs = ADD, ["a", "input"], {"args": [T(0), T(1)], "kwargs": {"alpha": 2}, "dying": [0]}
    elif case == "broadcast":
        rt.compute("row", "aten.sum.dim_IntList", ["input"], attrs={"args": [T(0), [0], True]})
        op, inputs, attrs = ADD, ["row", "a"], {"args": [T(0), T(1)], "dying": [0]}
    elif case == "shared":
        rt._live["a_alias"] = a.view(-1)  # another tensor on the same bytes
    elif case == "twice":
        op, inputs, attrs = ADD, ["a", "a"], {"args": [T(0), T(1)], "dying": [0]}
    elif case == "not dying":
        attrs = {"args": [T(0)]}
    elif case == "writing":
        rt.store.writing = lambda name: name == "a"  # a page-out still reading the operand
    before = a.clone()
    out = rt.compute("o", op, inputs, attrs=attrs)
    assert rt.in_place_ops == 0 and out.data_ptr() != a.data_ptr()
    assert torch.equal(a, before)
    rt.free("a")


def test_dying_operands_are_those_freed_before_anything_else_runs():
    node = {"inputs": [{"t": "a"}, {"t": "b"}, {"t": "c", "view": [["aten.t.default", []]]}]}
    steps = [{"action": "compute", "tensor": "n"}, {"action": "free", "tensor": "b"},
             {"action": "free", "tensor": "c"}, {"action": "compute", "tensor": "m"},
             {"action": "free", "tensor": "a"}]
    assert dying_operands(steps, 0, node) == [1]  # c is read through a view; a is freed after another op
    assert dying_operands(steps, 0, {"inputs": [{"t": "b"}, {"t": "b"}]}) == []  # read twice
    assert dying_operands(steps, 3, node) == [0]
    assert dying_operands(steps, 4, node) == []


BN = "aten._native_batch_norm_legit_functional.default"


def bn_attrs(mean="rm", var="rv"):
    return {"args": [T(0), {"$p": "w"}, {"$p": "b"}, {"$b": "rm"}, {"$b": "rv"}, True, 0.1, 1e-5], "aux": [1, 2],
            "keep": 0, "updates": [{"buffer": mean, "item": 3}, {"buffer": var, "item": 4}]}


def test_batch_norm_updates_its_running_statistics_in_place_as_eager_does(tmp_path):
    g = torch.Generator().manual_seed(7)
    w, b, rm, rv = torch.rand(3, generator=g), torch.randn(3, generator=g), torch.randn(3, generator=g), torch.rand(3)
    save_file({"param/w": w, "param/b": b, "buffer/rm": rm, "buffer/rv": rv}, str(tmp_path / "w.safetensors"))
    r = Runtime(tmp_path / "w.safetensors", tmp_path / "pages", device="cpu", lr=0.1)
    x = torch.randn(4, 3, 5, 5, generator=g)
    r.begin_step(x, torch.zeros(4, dtype=torch.long))
    r.load_input()
    rm_ref, rv_ref = rm.clone(), rv.clone()
    want = torch.nn.functional.batch_norm(x, rm_ref, rv_ref, w, b, training=True, momentum=0.1, eps=1e-5)
    live = r.ledger.live_bytes
    out = r.compute("bn", BN, ["input"], params=["w", "b"], buffers=["rm", "rv"], attrs=bn_attrs())
    assert torch.equal(out, want)
    assert torch.equal(r.buffers["rm"], rm_ref) and torch.equal(r.buffers["rv"], rv_ref)
    assert r.ledger.live_bytes == live + out.numel() * 4 + 2 * 3 * 4  # the output and its two statistics (aux)
    r.free("bn")
    r.recompute("bn", BN, ["input"], params=["w", "b"], buffers=["rm", "rv"], attrs=bn_attrs())
    assert torch.equal(r.tensor("bn"), want)
    assert torch.equal(r.buffers["rm"], rm_ref) and torch.equal(r.buffers["rv"], rv_ref)  # updated once only


def test_batch_norm_in_place_only_where_each_update_writes_the_buffer_it_reads():
    from edgetrain.runtime.python.inplace import updates_buffers_in_place
    assert updates_buffers_in_place(BN, bn_attrs())
    assert not updates_buffers_in_place(BN, bn_attrs(mean="rv", var="rm"))  # crossed
    crossed_view = bn_attrs()
    crossed_view["updates"][0]["view"] = [["aten.t.default", []]]
    assert not updates_buffers_in_place(BN, crossed_view)
    assert not updates_buffers_in_place(BN, {**bn_attrs(), "updates": bn_attrs()["updates"][:1]})
    assert not updates_buffers_in_place("aten.native_batch_norm.default", bn_attrs())


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_adds_the_weight_decay_into_a_dying_gradient_with_the_same_bits(nesterov):
    from edgetrain.runtime.python.optim import Optimizer
    g = torch.Generator().manual_seed(2)
    p0, grads = torch.randn(5, 4, generator=g), [torch.randn(5, 4, generator=g) for _ in range(3)]
    cfg = {"name": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4, "nesterov": nesterov}
    params = {"copy": {"w": p0.clone()}, "in place": {"w": p0.clone()}}
    opts = {k: Optimizer(cfg, v, ["w"]) for k, v in params.items()}
    for grad in grads:
        opts["copy"].update("w", params["copy"]["w"], grad)
        scratch = grad.clone()
        opts["in place"].update("w", params["in place"]["w"], scratch, grad_is_scratch=True)
        assert not torch.equal(scratch, grad)  # the decay went into the dying gradient
    assert torch.equal(params["copy"]["w"], params["in place"]["w"])
    assert torch.equal(opts["copy"].state["w"]["momentum"], opts["in place"].state["w"]["momentum"])


def test_a_gradient_the_node_holds_is_not_written_into(tmp_path):
    save_file({"param/w": torch.ones(4, 3)}, str(tmp_path / "w.safetensors"))
    r = Runtime(tmp_path / "w.safetensors", tmp_path / "pages", device="cpu", lr=0.1, weight_decay=0.5)
    r.begin_step(torch.randn(4, 3, generator=torch.Generator().manual_seed(4)), torch.zeros(4, dtype=torch.long))
    x = r.tensor(r.load_input())
    held = r.compute("g", "aten.mul.Tensor", ["input", "input"],
                     attrs={"args": [T(0), T(1)], "updates": [{"param": "w", "item": None}]})
    assert torch.equal(held, x * x)  # held by the node: the update read it, never wrote into it
    w = torch.ones(4, 3)
    assert torch.equal(r.params["w"], w.add((x * x).add(w, alpha=0.5), alpha=-0.1))  # SGD's own arithmetic

