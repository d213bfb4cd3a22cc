"""In-place execution as a scheduling fact: the graph marks an output written over an operand that dies at its node
(compiler/graph/inplace.py); liveness, the MILP, the validator, the bound, the Python ledger and runtime count and
run it alike.

Unit tests build small graphs by hand; the end-to-end tests compile the README's kind of CNN (conv-BN-ReLU-pool
twice over 3x32x32, batch 8: tests/user_models.py:conv_bn_relu_pool), whose smallest feasible budget was plain
backprop's peak before, and train it at that budget against autograd.
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from safetensors.torch import save_file

from edgetrain.compiler.errors import ValidationError
from edgetrain.compiler.graph.inplace import mark_in_place
from edgetrain.compiler.graph.ir import Node, TensorRef, TensorSpec, TrainingGraph
from edgetrain.compiler.graph.liveness import analyze
from edgetrain.compiler.pipeline import CompileOptions, build_graph, compile_model
from edgetrain.compiler.scheduling.bound import smallest_budget_bound
from edgetrain.compiler.scheduling.budget import min_budget
from edgetrain.compiler.scheduling.heuristics import store_all
from edgetrain.compiler.scheduling.poet import build as build_poet
from edgetrain.compiler.scheduling.steps import Step, build_steps
from edgetrain.compiler.scheduling.validator import validate
from edgetrain.compiler.workbench.run import run_plan
from edgetrain.runtime.python import PlanError, Runtime
from edgetrain.runtime.python.aten_call import resolve
from edgetrain.runtime.python.inplace import COUNTED, IN_PLACE_ARGS
from edgetrain.runtime.python.ledger import Ledger, LedgerError
from edgetrain.targets import load_target

CNN = "tests.user_models:conv_bn_relu_pool"
HOST = load_target("host")
F = (2, 4)  # every tensor of the hand-built graphs: 32 B


def T(k: int) -> dict:
    return {"$t": k}


def _node(name, kind, op, inputs=(), args=None, **kw) -> Node:
    refs = tuple(r if isinstance(r, TensorRef) else TensorRef(r) for r in inputs)
    attrs = {"args": args if args is not None else [T(k) for k in range(len(refs))]}
    return Node(name, kind, op, inputs=refs, attrs=attrs, shape=kw.pop("shape", F), **kw)


def _graph(nodes: list[Node]) -> TrainingGraph:
    return TrainingGraph(model="hand", nodes=nodes, params={}, buffers={}, input_shape=F, num_classes=None,
                         loss="mse")


def chain() -> TrainingGraph:
    """x -> a = neg(x) -> r = relu(a) -> loss; backward: g = ones -> gb = g * 2 -> gr = threshold_backward(gb, r):
    g dies at gb and gb at gr (fixed lives), r (a decision tensor) at gr too."""
    return _graph([
        _node("input", "input", "input"),
        _node("a", "forward", "aten.neg.default", ["input"]),
        _node("r", "forward", "aten.relu.default", ["a"]),
        _node("loss", "loss", "aten.sum.default", ["r"], shape=()),
        _node("g", "backward", "aten.ones_like.default", ["r"]),
        _node("gb", "backward", "aten.mul.Tensor", ["g"], args=[T(0), 2.0]),
        _node("gr", "backward", "aten.threshold_backward.default", ["gb", "r"], args=[T(0), T(1), 0]),
        _node("gs", "backward", "aten.sum.default", ["gr"], shape=()),
    ])


# -- the graph fact -----------------------------------------------------------------------------------------

def test_an_output_takes_a_dying_fixed_life_operand_and_nothing_else():
    g = mark_in_place(chain(), IN_PLACE_ARGS)
    into = {n.name: n.into for n in g.nodes if n.into}
    # relu's operand a is a decision tensor (relu may be recomputed from it): the schedule decides whether it dies
    assert into == {"gb": "g", "gr": "gb"}  # a chain: g's bytes are gb's, then gr's
    assert g.node("gr").attrs["into"] == 0 and "into" not in chain().node("gr").attrs
    # an operand read later, through a view, or twice is never written over
    viewed = chain()
    viewed.nodes[6] = _node("gr", "backward", "aten.threshold_backward.default",
                            [TensorRef("gb", (("aten.t.default", ()),)), "r"], args=[T(0), T(1), 0])
    assert not mark_in_place(_graph(viewed.nodes), IN_PLACE_ARGS).node("gr").into
    later = chain()
    later.nodes.append(_node("gt", "backward", "aten.sum.default", ["gb"], shape=()))
    assert not mark_in_place(_graph(later.nodes), IN_PLACE_ARGS).node("gr").into
    # a kernel without an in-place form (an empty table) marks nothing
    assert not any(n.into for n in mark_in_place(chain(), {}).nodes)


def test_liveness_counts_the_shared_bytes_once_and_refuses_a_mark_it_cannot_honour():
    plain, marked = analyze(chain()), analyze(mark_in_place(chain(), IN_PLACE_ARGS))
    t, u = chain().index("gr"), chain().index("gb")
    assert marked.shared == {u: 32, t: 32} and marked.static[t] == plain.static[t] - 32
    assert [a - b for a, b in zip(plain.static, marked.static)] == [32 * (k in (t, u)) for k in range(len(plain.static))]
    g = mark_in_place(chain(), IN_PLACE_ARGS)
    assert analyze(g).before_node(g, t) == plain.before_node(chain(), t)  # gb is still its own before gr runs
    bad = _graph([*g.nodes])
    bad.nodes[6] = _node("gr", "backward", "aten.threshold_backward.default", ["gb", "r"], args=[T(0), T(1), 0])
    bad.nodes[6].attrs["into"] = 1  # r: a decision tensor
    with pytest.raises(ValueError, match="writes into r, which a schedule decides about"):
        analyze(_graph(bad.nodes))


def test_validator_milp_and_bound_agree_on_the_shared_bytes():
    g = mark_in_place(chain(), IN_PLACE_ARGS)
    lv = analyze(g)
    steps = build_steps(g, lv, store_all(g, lv))
    rep = validate(g, steps, HOST, None)
    t = g.index("gr")
    plain = validate(chain(), build_steps(chain(), analyze(chain()), store_all(chain(), analyze(chain()))), HOST, None)
    assert rep.stage_peaks[t] == plain.stage_peaks[t] - 32
    assert rep.peak_bytes >= min_budget(lv)
    # the MILP's memory rows: store-all is feasible exactly down to the validator's peak
    pm = build_poet(g, lv, HOST, rep.peak_bytes)
    assert pm.milp.is_feasible(pm.vector(store_all(g, lv)))
    pm = build_poet(g, lv, HOST, rep.peak_bytes - 1)
    assert not pm.milp.is_feasible(pm.vector(store_all(g, lv)))
    # the bound names the operand an output is written into, and counts its bytes once (in the inputs)
    bare = _graph([replace(n, workspace_bytes=100) if n.name == "gr" else n for n in g.nodes])
    b = smallest_budget_bound(bare, analyze(bare))
    assert b.node == "gr" and b.into == "gb" and b.output_bytes == 0, b
    assert "outputs 0 B (written into its operand `gb`)" in b.text()


def _steps_with(g, change):
    lv = analyze(g)
    steps = build_steps(g, lv, store_all(g, lv))
    return change(list(steps))


@pytest.mark.parametrize("case, message", [
    ("free later", "gb, which gr wrote its output into, was not freed within its stage"),
    ("page out", "gb was overwritten by gr's output"),
])
def test_validator_refuses_a_schedule_that_uses_an_overwritten_operand(case, message):
    g = mark_in_place(chain(), IN_PLACE_ARGS)
    t = g.index("gr")

    def change(steps):
        k = next(i for i, s in enumerate(steps) if s.action == "free" and s.tensor == "gb")
        free = steps.pop(k)
        if case == "free later":  # held (by name) past its stage: whatever read it next would read gr's values
            steps.append(Step(len(g.nodes) - 1, "free", "gb"))
            return steps
        steps.insert(k, Step(t, "page_out", "gb"))
        steps.insert(k + 1, free)
        return steps

    with pytest.raises(ValidationError, match=message):
        validate(g, _steps_with(g, change), HOST, None)


# -- the Python runtime ---------------------------------------------------------------------------------------

def test_the_ledger_hands_the_operands_bytes_to_the_output():
    led = Ledger()
    led.alloc("a", 64)
    led.hand_over("a", "r")
    assert led.live_bytes == led.peak_bytes == 64 and led.bytes_of("r") == 64 and led.bytes_of("a") == 0
    assert led.release("a") == 0 and led.live_bytes == 64
    with pytest.raises(LedgerError, match="'r' is already allocated"):
        led.alloc("r", 1)
    with pytest.raises(LedgerError, match="hand-over of 'b'"):
        led.hand_over("b", "c")


ARGS = {"aten.hardtanh.default": [0.0, 6.0], "aten.leaky_relu.default": [0.01],
        "aten.threshold_backward.default": [0.0], "aten.hardtanh_backward.default": [0.0, 6.0],
        "aten.leaky_relu_backward.default": [0.01, False]}
KWARGS = {"aten.gelu.default": {"approximate": "tanh"}, "aten.gelu_backward.default": {"approximate": "tanh"},
          "aten.add.Tensor": {"alpha": 3}, "aten.sub.Tensor": {"alpha": 2}}


ACCUMULATING = ("aten.addmm.default", "aten.index_put.default")  # not elementwise: tested apart below


@pytest.mark.parametrize("op", sorted(set(COUNTED) - set(ACCUMULATING)))
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_every_counted_op_writes_into_each_allowed_operand_the_functional_ops_bits(tmp_path, op, layout):
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(2, 5, 7, 3, generator=g) * 4, torch.randn(2, 5, 7, 3, generator=g) + 0.5
    if layout == "channels_last":
        a, b = a.to(memory_format=torch.channels_last), b.to(memory_format=torch.channels_last)
    positions = IN_PLACE_ARGS[op]
    binary = len(positions) == 2
    tensors = [a, b] if binary else [a]
    literals = ARGS.get(op, [])
    kwargs = KWARGS.get(op, {})
    want = resolve(op)(*tensors, *literals, **kwargs)
    for k in positions:
        save_file({"param/w": torch.ones(1)}, str(tmp_path / "w.safetensors"))
        rt = Runtime(tmp_path / "w.safetensors", tmp_path / "pages", device="cpu", lr=0.1)
        rt.begin_step(a.clone(), torch.zeros(1, dtype=torch.long))
        names = ["x", "y"][:len(tensors)]
        for name, t in zip(names, tensors):
            rt._hold(name, t.clone(), t.nbytes)
        before = rt.ledger.live_bytes
        target = rt.tensor(names[k])
        attrs = {"args": [T(j) for j in range(len(tensors))] + literals, "into": k}
        if kwargs:
            attrs["kwargs"] = dict(kwargs)
        out = rt.compute("o", op, names, attrs=attrs)
        assert out.data_ptr() == target.data_ptr() and rt.in_place_ops == 1, (op, k)
        assert torch.equal(out, want) and out.stride() == want.stride(), (op, k)
        assert rt.ledger.live_bytes == rt.ledger.peak_bytes == before  # the output took the operand's bytes
        with pytest.raises(PlanError, match=f"'{names[k]}' was overwritten in place by 'o'"):
            rt.compute("p", "aten.neg.default", [names[k]], attrs={"args": [T(0)]})
        for name in names:
            rt.free(name)
        assert rt.ledger.live_bytes == before - sum(t.nbytes for t in tensors) + out.nbytes
        rt.free("o")
        rt.end_step()
        assert rt.leftovers == []


@pytest.mark.parametrize("op", ACCUMULATING)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_gradient_accumulates_into_its_accumulator_with_the_functional_ops_bits(tmp_path, op, dtype):
    g = torch.Generator().manual_seed(6)
    acc = torch.randn(40, 8, generator=g).to(dtype)
    if op == "aten.addmm.default":  # a chunk of the head's weight gradient: t(G) @ rows
        tensors = [acc, torch.randn(6, 40, generator=g).to(dtype).t(), torch.randn(6, 8, generator=g).to(dtype)]
        args, want = [T(0), T(1), T(2)], resolve(op)(*tensors)
    else:  # a tied embedding's rows scattered into it, a repeated token's twice
        ids = torch.tensor([3, 17, 3, 0, 39])
        tensors, args = [acc, ids, torch.randn(5, 8, generator=g).to(dtype)], [T(0), [T(1)], T(2), True]
        want = resolve(op)(acc, [ids], tensors[2], True)
    save_file({"param/w": torch.ones(1)}, str(tmp_path / "w.safetensors"))
    rt = Runtime(tmp_path / "w.safetensors", tmp_path / "pages", device="cpu", lr=0.1)
    rt.begin_step(torch.zeros(1), torch.zeros(1, dtype=torch.long))
    names = ["acc", "a", "b"]
    for name, t in zip(names, tensors):
        rt._hold(name, t.clone(), t.nbytes)
    before, target = rt.ledger.live_bytes, rt.tensor("acc")
    out = rt.compute("o", op, names, attrs={"args": args, "into": 0})
    assert out.data_ptr() == target.data_ptr() and rt.in_place_ops == 1
    assert torch.equal(out, want) and out.stride() == want.stride()
    assert rt.ledger.live_bytes == rt.ledger.peak_bytes == before


def test_a_counted_node_that_cannot_write_into_its_operand_fails_naming_it(tmp_path):
    save_file({"param/w": torch.ones(1)}, str(tmp_path / "w.safetensors"))
    rt = Runtime(tmp_path / "w.safetensors", tmp_path / "pages", device="cpu", lr=0.1)
    rt.begin_step(torch.randn(4, 3), torch.zeros(4, dtype=torch.long))
    rt.load_input()
    rt.compute("a", "aten.neg.default", ["input"], attrs={"args": [T(0)]})
    rt._live["a_alias"] = rt.tensor("a").view(-1)  # another tensor on the same bytes
    with pytest.raises(PlanError, match="cannot write into 'a': another tensor shares its bytes"):
        rt.compute("r", "aten.relu.default", ["a"], attrs={"args": [T(0)], "into": 0})
    with pytest.raises(PlanError, match="relu.default writes into its argument 0, and operand 0 is not one of them"):
        rt.compute("s", "aten.relu.default", ["input", "a"], attrs={"args": [T(1)], "into": 0})


# -- end to end: the README's kind of CNN -----------------------------------------------------------------------

def _graph_of(target: str, emit: str = "python"):
    _, _, g = build_graph(CompileOptions(model=CNN, target=target, budget="100%", out="", batch_size=8,
                                         emit=emit), load_target(target))
    return g


def test_the_cnns_backward_chain_runs_in_place_and_the_first_weight_gradient_apart():
    g = _graph_of("host")
    into = {n.op: n.into for n in g.nodes if n.into}
    assert set(into) == {"aten.threshold_backward.default"}  # torch has no batch norm backward into its operand
    assert all(g.node(n.into).op == "aten.max_pool2d_with_indices_backward.default" for n in g.nodes if n.into)
    # The first convolution's weight gradient runs as a stage of its own: fused after batch norm's backward, its
    # kernel scratch stood beside that node's dying operands (the whole step's peak).
    last = g.nodes[-1]
    assert last.op == "aten.convolution_backward.default" and last.workspace_bytes > 0
    assert g.nodes[-2].op == "aten.native_batch_norm_backward.default" and "then" not in g.nodes[-2].attrs


@pytest.mark.parametrize("target, most", [("host", 0.70), ("mps2-an386", 0.70)])
def test_the_cnns_smallest_budget_is_well_below_store_all_and_trains_exactly_there(tmp_path, target, most):
    """On the host (62.1% of store-all) the first convolution's weight gradient holds its oneDNN scratch (the kernel
    rule without an input gradient: the output gradient and the padded batch, 1.69x its output gradient) beside that
    gradient and the batch; the microcontroller profile counts no kernel scratch (its C kernels have none), which
    its Python plan is compiled for too."""
    out = tmp_path / "cnn"
    c = compile_model(CompileOptions(model=CNN, target=target, budget="min", out=str(out), batch_size=8,
                                     time_limit=20.0))
    assert c["min_feasible_bytes"] <= most * c["store_all_peak_bytes"], c
    r = run_plan(str(out), steps=2, check=True, device="cpu")
    assert r["ok"] and r["max_abs_err"] == 0 and not r["mismatched"], r.get("error")
    assert r["measured_peak_bytes"] == r["predicted_peak_bytes"] <= r["budget_bytes"]
    assert "into=" in (out / "plan.py").read_text()
