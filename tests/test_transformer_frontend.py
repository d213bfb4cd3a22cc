"""Transformers through the frontend, the zoo, the data, the CLI and the C backend's refusal."""
from __future__ import annotations

import json
import time

import pytest
import torch
from torch import nn

from edgetrain.compiler.workbench import cli
from edgetrain.compiler.pipeline import CompileOptions, build_graph, compile_model
from edgetrain.compiler.workbench.data import random_batches
from edgetrain.compiler.errors import UnsupportedModelError
from edgetrain.compiler.graph.liveness import analyze
from edgetrain.compiler.frontend.modelspec import resolve
from edgetrain.compiler.scheduling.poet import build as build_poet
from edgetrain.compiler.frontend.zoo import ZOO, build
from edgetrain.runtime.python.storage import FileStore
from edgetrain.targets import load_target

TF = ["bert_base", "gpt_small", "bert_tiny", "gpt_tiny"]


def _graph(model, batch=2, target="rpi4", **kw):
    return build_graph(CompileOptions(model=model, target=target, budget="100%", out="", batch_size=batch, **kw),
                       load_target(target))[2]


# -- the zoo ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["bert_tiny", "gpt_tiny"])
def test_tiny_transformers_train_a_step(name):
    torch.manual_seed(0)
    model = build(name).train()
    ids = torch.randint(0, model.input_high, (3, *model.input_shape))
    out = model(ids)
    want = (3, 4) if name == "bert_tiny" else (3, 16, 100)
    assert out.shape == want
    nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), torch.zeros(out.shape[:-1], dtype=torch.long).reshape(-1)).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_zoo_entries_say_their_input():
    for name in TF:
        e = ZOO[name]
        assert e.input_dtype == "int64" and e.input_high and len(e.input_shape) == 1
    r = resolve("gpt_tiny", layers=1, hidden=16, heads=4, seq=12, vocab=37)
    assert (r.input_shape, r.input_dtype, r.input_high, r.num_classes) == ((12,), "int64", 37, 37)
    r = resolve("bert_tiny", num_classes=7)
    assert (r.input_shape, r.input_high, r.num_classes) == ((16,), 100, 7)


def test_sizes_are_keyword_arguments():
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    base = build("bert_base")
    assert len(base.blocks) == 12 and base.tok.weight.shape == (30522, 768) and base.pos.weight.shape == (128, 768)
    assert base.blocks[0].ff.up.out_features == 3072 and base.blocks[0].attn.heads == 12
    assert 109e6 < count(base) < 110e6  # BERT-base: ~110M parameters
    small = build("gpt_small")
    assert len(small.blocks) == 6 and small.head.out_features == 8192 and small.blocks[0].attn.causal
    g = build("gpt_small", layers=3, hidden=64, heads=4, seq=32, vocab=500)
    assert len(g.blocks) == 3 and g.head.weight.shape == (500, 64) and g.input_shape == (32,)
    with pytest.raises(ValueError):
        build("bert_tiny", heads=3)


# -- the frontend ----------------------------------------------------------------------------------------

SDPA = "aten._scaled_dot_product_flash_attention_for_cpu.default"


def test_graph_of_a_decoder():
    g = _graph("gpt_tiny")
    ops = [n.op for n in g.nodes]
    assert g.nodes[0].dtype == "int64" and g.input_dtype == "int64" and g.input_high == 100
    assert ops.count(SDPA) == 2 and ops.count(SDPA.replace(".default", "_backward.default")) == 2
    assert all(n.attrs["args"][4] is True for n in g.nodes if n.op == SDPA)  # is_causal
    # view + transpose stay views of the projection: folded into the attention's operands
    sdpa = next(n for n in g.nodes if n.op == SDPA)
    assert all(r.view and r.view[-1][0] == "aten.transpose.int" for r in sdpa.inputs[:3])
    assert sdpa.aux_bytes > 0  # the logsumexp rides with the forward node to its backward
    labels = g.node("labels")
    assert labels.shape == (2, 16)  # a label per position: the next-token loss over every position
    bwd = next(n for n in g.nodes if n.op == SDPA.replace(".default", "_backward.default"))
    assert g.node(bwd.aux_of).op == SDPA and bwd.items is not None and len(bwd.items) == 3  # dq, dk, dv together
    readers = [r for n in g.nodes for r in n.inputs if r.name == bwd.name]
    assert {r.view[0] for r in readers} == {("item", 0), ("item", 1), ("item", 2)}
    assert not any(n.op == "aten.embedding_dense_backward.default" and n.bytes for n in g.nodes)  # ids: no gradient


def test_graph_of_an_encoder():
    g = _graph("bert_tiny")
    assert g.node("labels").shape == (2,) and [n.op for n in g.nodes].count("aten.tanh.default") == 1
    # the [CLS] token is a select view, position embeddings an expand view: no node of their own
    assert any(v[0] == "aten.select.int" for n in g.nodes for r in n.inputs for v in r.view)
    assert not any(n.op in ("aten.select.int", "aten.expand.default") for n in g.nodes)


def test_hand_written_attention_runs_torch_s_own_ops():
    g = _graph("tests.transformer_models:hand_attention", batch=4)
    ops = {n.op for n in g.nodes}
    assert {"aten.bmm.default", "aten._softmax.default", "aten.clone.default"} <= ops  # .contiguous() copies
    assert "aten._softmax_backward_data.default" in ops


@pytest.mark.parametrize("factory", ["dropout_attention", "split_qkv", "torch_mha", "tied_head"])
def test_constructs_the_hand_written_frontend_refused_now_compile(factory):
    g = _graph(f"tests.transformer_models:{factory}")
    assert g.loss_stage > 0 and any(n.updates for n in g.nodes)


# -- the C backend refuses them --------------------------------------------------------------------------

def test_emit_c_refuses_transformer_ops(tmp_path, capsys):
    with pytest.raises(UnsupportedModelError) as e:
        compile_model(CompileOptions(model="bert_tiny", target="nrf52840", budget="100%", out=str(tmp_path / "o"),
                                     batch_size=1, emit="c"))
    msg = str(e.value)
    assert "op `aten.embedding.default` has no kernel" in msg and "node `embedding`" in msg
    assert "The C runtime supports" in msg and "--emit python" in msg
    assert not (tmp_path / "o" / "plan.c").exists()
    rc = cli.main(["compile", "gpt_tiny", "--target", "nrf52840", "--budget", "100%", "--emit", "c",
                   "--batch-size", "1", "--out", str(tmp_path / "cli"), "--json"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 2 and out["ok"] is False and "embedding" in out["error"]["message"] and "C runtime" in out["error"]["message"]


# -- data and the CLI ------------------------------------------------------------------------------------

def test_random_token_batches():
    (x, y), = random_batches((16,), 100, 3, 1, seed=4, input_high=100, label_shape=(16,))
    assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (3, 16)
    assert 0 <= int(x.min()) and int(x.max()) < 100 and int(y.max()) < 100
    (x2, _), = random_batches((16,), 100, 3, 1, seed=4, input_high=100, label_shape=(16,))
    assert torch.equal(x, x2)


def test_cli_compiles_and_runs_a_decoder(tmp_path, capsys):
    out = tmp_path / "gpt"
    rc = cli.main(["compile", "gpt_tiny", "--target", "rpi4", "--budget", "75%", "--batch-size", "2",
                   "--time-limit", "5", "--out", str(out), "--json"])
    c = json.loads(capsys.readouterr().out)
    assert rc == 0 and c["ok"] and c["model"] == "gpt_tiny"
    body = json.loads((out / "schedule.json").read_text())
    assert body["model"]["input_dtype"] == "int64" and body["model"]["input_high"] == 100
    rc = cli.main(["run", str(out), "--steps", "1", "--data", "random", "--check", "--json"])
    r = json.loads(capsys.readouterr().out)
    assert rc == 0 and r["ok"] and r["max_abs_err"] == 0.0
    rc = cli.main(["run", str(out), "--data", "fashion-mnist", "--json"])
    r = json.loads(capsys.readouterr().out)
    assert rc == 2 and "token ids" in r["error"]["message"] and "--data random" in r["error"]["message"]


def test_page_store_keeps_a_permuted_layout(tmp_path):
    store = FileStore(tmp_path)
    t = torch.randn(2, 5, 3, 4).transpose(1, 2)  # attention's output: (B, H, T, d) over (B, T, H, d) memory
    store.page_out("y", t)
    back = store.page_in("y")
    assert torch.equal(back, t) and back.stride() == t.stride()
    back.transpose(1, 2).view(2, 5, 12)  # the plan's view of it stays a view


# -- a benchmark-sized graph ------------------------------------------------------------------------------

def _poet_size(model, batch):
    t0 = time.perf_counter()
    g = _graph(model, batch=batch)
    lv = analyze(g)
    m = build_poet(g, lv, load_target("rpi4"), lv.fixed_bytes + (g.state_bytes // 2))
    return g, m.milp, time.perf_counter() - t0


def test_gpt_small_builds_a_poet_model():
    g, milp, _ = _poet_size("gpt_small", 8)
    s = g.summary()
    assert s["kinds"]["loss"] == 1 and s["kinds"]["backward"] > 0
    assert milp.n_vars > 0 and milp.n_rows > 0


def test_bert_base_at_batch_8_builds_a_poet_model():
    """The 110M-parameter model's joint graph, costed and modelled, within the POET size of the
    hand-written frontend's graph (35,782 variables) times 1.25."""
    g, milp, seconds = _poet_size("bert_base", 8)
    assert g.summary()["kinds"]["loss"] == 1
    assert milp.n_vars <= 1.25 * 35_782
    assert seconds < 240


@pytest.mark.parametrize("name", ["bert_tiny", "gpt_tiny"])
def test_every_forward_matmul_and_attention_has_the_models_line(name):
    """The source lines come from a forward on fake tensors: they must stay aligned with the graph's ops past
    attention (fake tensors ask torch for devices that the graph never shows)."""
    g = _graph(name)
    ops = [n for n in g.nodes if n.kind == "forward" and any(k in n.op for k in ("addmm", "attention"))]
    assert len(ops) > 8
    missing = [n.name for n in ops if "zoo_transformers.py:" not in n.source]
    assert not missing, missing
