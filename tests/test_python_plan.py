"""plan.py reads as Python and says exactly what the schedule says.

Each compiled plan's `train_step` is run against a recorder standing in for the runtime: every statement must be
its schedule step, in order, and every call must read back (`plan_api.node_of`) as the schedule's node to the
last attribute, as the runtime prepares it. The text itself: short lines, one identifier per tensor, the same
text for the same schedule. Training through the new plans is checked against autograd by the exactness tests.
"""
from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from edgetrain.codegen.py_layout import WIDTH, Chain, Group, flat, statement
from edgetrain.codegen.python_calls import Names, op_expr
from edgetrain.codegen.python_plan import dying_operands, render_plan_text
from edgetrain.compiler.pipeline import CompileOptions, compile_model
from edgetrain.runtime.python import Runtime, inplace
from edgetrain.runtime.python.executor import PlanError
from edgetrain.runtime.python.plan_api import AuxRef, Ref, aten, buffer, empty, fused, node_of, out, param

CASES = {
    "small_cnn-85%": dict(model="small_cnn", target="rpi4", budget="85%", batch_size=2),  # pages, twins, fused ops
    "gpt_tiny-dropout": dict(model="gpt_tiny", target="jetson-agx-orin", budget="60%", batch_size=4,
                             model_kwargs={"dropout": 0.1}),  # recomputes, views, items, dropout seeds, -inf
}


@pytest.fixture(scope="module", params=sorted(CASES))
def compiled(request, tmp_path_factory) -> Path:
    out_dir = tmp_path_factory.mktemp("plan") / request.param
    compile_model(CompileOptions(out=str(out_dir), time_limit=8.0, **CASES[request.param]))
    return out_dir


class Recorder:
    """Stands for the runtime: records each statement of a plan's step, returns handles as the runtime does."""
    device = torch.device("cpu")

    def __init__(self) -> None:
        self.steps: list[tuple] = []
        self._refs: dict[str, Ref] = {}

    def _ref(self, name, kind=Ref):
        return self._refs.setdefault(name, kind(name))

    def load_input(self):
        self.steps.append(("compute", "input"))
        return self._ref("input")

    def load_labels(self):
        self.steps.append(("compute", "labels"))
        return self._ref("labels")

    def call(self, name, op, *args, **kw):
        self.steps.append(("compute", name, node_of(op, args, kw)))
        return (self._ref(name), self._ref(f"{name}.aux", AuxRef)) if "aux" in kw else self._ref(name)

    def recompute(self, name, op, *args, **kw):
        self.steps.append(("recompute", name, node_of(op, args, kw)))
        return self._ref(name)

    def free(self, r):
        self.steps.append(("free", r.name))

    def page_out(self, r):
        self.steps.append(("page_out", r.name))

    def page_in(self, r):
        self.steps.append(("page_in", r.name))

    def end_step(self):
        return None


def _import(path: Path):
    spec = importlib.util.spec_from_file_location(f"plan_{path.parent.name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _expected(steps: list[dict], i: int, node: dict) -> tuple:
    """The node as the runtime prepares it: operands by name or {"t", "view"}, `dying` where the plan frees next
    (and the schedule does not count the output in an operand's bytes, `into`)."""
    attrs = dict(node["attrs"])
    if node["op"] in inplace.INPLACE and "into" not in attrs:
        dying = dying_operands(steps, i, node)
        if dying:
            attrs["dying"] = dying
    inputs = [r["t"] if not r.get("view") else r for r in node["inputs"]]
    return node["op"], inputs, attrs, node.get("aux_of")


def test_every_statement_is_its_schedule_step_and_reads_back_as_its_node(compiled):
    body = json.loads((compiled / "schedule.json").read_text())
    nodes = {n["name"]: n for n in body["graph"]["nodes"]}
    rec = Recorder()
    _import(compiled / "plan.py").train_step(rec)
    steps = body["steps"]
    assert [s[:2] for s in rec.steps] == [(s["action"], s["tensor"]) for s in steps]
    kinds = set()
    for i, (st, got) in enumerate(zip(steps, rec.steps)):
        node = nodes.get(st["tensor"])
        if st["action"] in ("compute", "recompute") and node["kind"] not in ("input", "labels"):
            assert got[2] == _expected(steps, i, node), st
            kinds |= set(node["attrs"])
    want = {"then", "updates", "aux", "keep", "loss_item"}
    want |= {"seed_key", "kwargs"} if "gpt" in compiled.name else {"scratch"}  # a CPU target counts kernel scratch
    assert want <= kinds


def test_plan_text_is_short_lines_of_python_with_one_identifier_per_tensor(compiled):
    text = (compiled / "plan.py").read_text()
    long = [line for line in text.splitlines() if len(line) > WIDTH]
    assert not long, long[:3]
    tree = ast.parse(text)
    step = next(f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "train_step")
    # every call statement names its node as its first argument, and its variable is that node's only one
    holders: dict[str, str] = {}
    for stmt in ast.walk(step):
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call) and stmt.value.args \
                and isinstance(stmt.value.args[0], ast.Constant):
            target = stmt.targets[0]
            var = (target.elts[0] if isinstance(target, ast.Tuple) else target).id
            name = stmt.value.args[0].value
            assert holders.setdefault(var, name) == name, (var, name)
    assert len(set(holders.values())) == len(holders) > 10
    assert "rt.compute(" not in text and "'$t'" not in text and '"$t"' not in text
    body = json.loads((compiled / "schedule.json").read_text())
    assert render_plan_text(body) == text  # deterministic: the same schedule, the same text


def test_long_calls_break_into_short_lines_of_the_same_expression():
    name = "_scaled_dot_product_flash_attention_for_cpu_backward"
    chain = Chain("", f"{name}[2]", tuple(f".view(aten.view.default, ({k}, 16, 32))" for k in range(4)))
    updates = Group("updates={", (Chain("p_w: ", "out", (".view(aten.t.default)",) * 2),), "}")
    inner = Group("fused(", ("aten.mm.default", chain, updates), ")")
    call = Group("rt.call(", ('"x"', "aten.mm.default", *(f"{name}_{k}" for k in range(6)),
                              Group("then=[", (inner, inner), "]"), "keep=0"), ")")
    for head in ("x = ", "_native_batch_norm_legit_functional_12, _native_batch_norm_legit_functional_12_aux = "):
        lines = statement(head, call)
        assert max(map(len, lines)) <= WIDTH and len(lines) > 3, lines
        text = "\n".join(lines)
        assert ast.dump(ast.parse(text.strip())) == ast.dump(ast.parse(head + flat(call)))


def test_identifiers_are_valid_unique_and_deterministic():
    names = Names()
    got = [names.tensor(n) for n in ("relu", "a.b", "a_b", "class", "rt", "0x", "mp.out1")]
    assert got == ["relu", "a_b", "a_b_1", "class_1", "rt_1", "_0x", "mp_out1"]
    assert names.param("0.weight") == "p_0_weight" and names.buffer("bn.running_mean") == "b_bn_running_mean"
    assert names.tensor("a.b") == "a_b"  # the same name, the same identifier
    assert all(g.isidentifier() for g in got)
    assert op_expr("aten.relu.default") == "aten.relu.default"
    assert op_expr("aten.x.from") == "getattr(aten.x, 'from')"


def test_a_call_reads_back_as_its_node():
    x, y, w = Ref("x"), Ref("y"), param("fc.weight")
    args = (param("fc.bias"), x[0].view(aten.view.default, [2, 3]), w.view(aten.t.default))
    assert node_of(aten.addmm.default, args, {"keep": "none", "updates": {w: out.view(aten.t.default)}}) == ("aten.addmm.default", [{"t": "x", "view": [["item", 0], ["aten.view.default", [[2, 3]]]]}],
            {"args": [{"$p": "fc.bias"}, {"$t": 0}, {"$p": "fc.weight", "view": [["aten.t.default", []]]}],
             "keep": "none", "updates": [{"item": None, "view": [["aten.t.default", []]], "param": "fc.weight"}]},
            None)
    bn_aux = AuxRef("bn.aux")
    op, inputs, attrs, aux_of = node_of(
        aten.masked_fill.Scalar, (y, x, float("-inf")),
        {"then": [fused(aten.sum.dim_IntList, x, [0], True, updates={buffer("b"): out[0]}, scratch=8)],
         "overwrite": y, "seed_key": "k"})
    assert inputs == ["y", "x"] and attrs["args"] == [{"$t": 0}, {"$t": 1}, {"$float": "-inf"}]
    assert attrs["then"] == [{"op": "aten.sum.dim_IntList", "args": [{"$t": 1}, [0], True], "keep": "none",
                              "updates": [{"item": 0, "buffer": "b"}], "scratch": 8}]  # an operand read again
    assert attrs["dying"] == [0] and attrs["seed_key"] == "k"
    _, inputs, attrs, aux_of = node_of(aten.native_batch_norm_backward.default,
                                       (x, x, bn_aux[0], empty([0], torch.float32), torch.contiguous_format),
                                       {"dtype": torch.float32, "device": torch.device("cpu")})
    assert inputs == ["x", "x"] and aux_of == "bn"  # each occurrence its own operand, as the graph has them
    assert attrs["args"][2:] == [{"$aux": 0}, {"$empty": [0], "dtype": "float32"}, {"$mf": "contiguous_format"}]
    assert attrs["kwargs"] == {"dtype": {"$dtype": "float32"}, "device": {"$device": "cpu"}}


@pytest.fixture
def rt(tmp_path):
    from safetensors.torch import save_file

    save_file({"param/w": torch.randn(3, 4), "param/b": torch.randn(3)}, str(tmp_path / "w.safetensors"))
    return Runtime(tmp_path / "w.safetensors", tmp_path / "pages", device="cpu", lr=0.1)


def test_calls_run_on_handles_and_are_prepared_anew_when_their_arguments_change(rt):
    x = torch.randn(2, 4)
    w, b = param("w"), param("b")
    seen = []

    def step(dims):
        rt.begin_step(x, torch.zeros(2, dtype=torch.long))
        inp = rt.load_input()
        fc = rt.call("fc", aten.addmm.default, b, inp, w.view(aten.t.default))
        s = rt.call("s", aten.sum.dim_IntList, fc, dims, True)
        seen.append(rt.tensor(s).clone())
        assert isinstance(fc, Ref) and fc.name == "fc" and rt.tensor("fc") is rt.tensor(fc)
        for r in (inp, fc, s):
            rt.free(r)
        rt.end_step()

    step([0])
    step([0])
    assert len({id(n) for n in rt._prepared.values()}) == 2  # prepared once, reused
    step([1])  # the same node, another literal: prepared anew, never run with the old one
    ref = torch.ops.aten.addmm.default(rt.params["b"], x, rt.params["w"].t())
    assert torch.equal(seen[-1], ref.sum(1, keepdim=True)) and seen[0].shape == (1, 3)


def test_a_call_the_runtime_cannot_read_names_itself(rt):
    rt.begin_step(torch.randn(2, 4), torch.zeros(2, dtype=torch.long))
    rt.load_input()
    with pytest.raises(PlanError, match=r"compute 'r'.*not a torch op overload"):
        rt.call("r", torch.relu, Ref("input"))
    with pytest.raises(PlanError, match=r"tensor 'nope' is not resident"):
        rt.call("r", aten.relu.default, Ref("nope"))
    with pytest.raises(PlanError, match="overwrite= names operands"):
        rt.call("r", aten.relu.default, Ref("input"), overwrite=Ref("other"))
    with pytest.raises(PlanError, match="not a literal"):
        rt.call("r", aten.relu.default, torch.zeros(1))
