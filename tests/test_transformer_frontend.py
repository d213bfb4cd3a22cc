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

def test_graph_of_a_decoder():
    g = _graph("gpt_tiny")
    ops = [n.op for n in g.nodes]
    assert g.nodes[0].dtype == "int64" and g.input_dtype == "int64" and g.input_high == 100
    assert ops.count("sdpa") == 2 and ops.count("sdpa_bwd") == 2 and ops.count("layer_norm") == 5
    assert all(n.attrs["is_causal"] for n in g.nodes if n.op == "sdpa")
    assert "copy" not in ops  # view + transpose and transpose + reshape stay views
    sdpa = next(n for n in g.nodes if n.op == "sdpa")
    assert [v[0] for v in sdpa.inputs[0].view] == ["reshape", "permute"]
    labels, loss = g.node("labels"), g.node("loss")
    assert labels.shape == (2, 16) and loss.inputs[0].view[-1] == ("reshape", (32, 100))  # per-token loss
    bwd = g.node(f"bwd.{sdpa.name}")  # one tensor holding dq, dk, dv
    assert bwd.shape == (3 * 2 * 16 * 32,) and bwd.aux_of == sdpa.name
    readers = [r for n in g.nodes for r in n.inputs if r.name == bwd.name]
    assert sorted(r.view[0] for r in readers) == [("item", 0), ("item", 1), ("item", 2)]
    assert g.node("bwd.tok").shape is None  # token ids get no gradient; only the embedding's weight does


def test_graph_of_an_encoder():
    g = _graph("bert_tiny")
    cls = next(n for n in g.nodes if n.op == "slice")
    assert cls.attrs["index"] == [["all"], ["int", 0]] and cls.shape == (2, 32)
    assert g.node("labels").shape == (2,) and [n.op for n in g.nodes].count("tanh") == 1
    assert any(n.op == "expand" for n in g.nodes)  # position embeddings broadcast over the batch


def test_hand_written_attention_copies_where_torch_copies():
    g = _graph("tests.transformer_models:hand_attention", batch=4)
    copies = [n for n in g.nodes if n.op == "copy"]
    assert len(copies) == 1 and copies[0].inputs[0].view == ()  # the views are the copy's own attrs
    assert [v[0] for v in copies[0].attrs["view"]] == ["permute"]
    assert {"matmul", "scale", "softmax"} <= {n.op for n in g.nodes}
    bwd = g.node("bwd.matmul")
    assert bwd.workspace_bytes == bwd.bytes > 0  # its results before they take the operands' layouts


@pytest.mark.parametrize("factory, words, needle", [
    ("dropout_attention", ["scaled_dot_product_attention with attn_mask, dropout_p > 0", "is_causal=True"],
     "dropout_p=0.1"),
    ("split_qkv", ["method `Tensor.split`"], ".split(8, dim=2)"),
    ("torch_mha", ["module `MultiheadAttention`"], "self.mha(x, x, x"),
])
def test_unsupported_transformer_constructs_are_named_with_their_line(tmp_path, factory, words, needle):
    with pytest.raises(UnsupportedModelError) as e:
        _graph(f"tests.transformer_models:{factory}")
    msg = str(e.value)
    for w in words:
        assert w in msg
    src = open("tests/transformer_models.py").read().splitlines()
    line = next(i for i, text in enumerate(src, 1) if needle in text)
    assert f"transformer_models.py:{line}" in msg and "Supported:" in msg and "Embedding" in msg


def test_tied_embedding_is_refused():
    with pytest.raises(UnsupportedModelError) as e:
        _graph("tests.transformer_models:tied_head")
    assert "head.weight" in str(e.value) and "tied" in str(e.value)


# -- the C backend refuses them --------------------------------------------------------------------------

def test_emit_c_refuses_transformer_ops(tmp_path, capsys):
    with pytest.raises(UnsupportedModelError) as e:
        compile_model(CompileOptions(model="bert_tiny", target="nrf52840", budget="100%", out=str(tmp_path / "o"),
                                     batch_size=1, emit="c"))
    msg = str(e.value)
    assert "op `embedding`" in msg and "node `tok`" in msg and "has no kernel" in msg
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
    rc = cli.main(["compile", "gpt_tiny", "--target", "rpi4", "--budget", "60%", "--batch-size", "2",
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
    # Forward: 5 embedding nodes, 12 per layer (ln, q, k, v, sdpa, o, add, ln, up, gelu, down, add), ln_f, head.
    assert s["kinds"] == {"input": 1, "forward": 5 + 6 * 12 + 2, "labels": 1, "loss": 1, "backward": 66, "grad_sum": 18}
    assert milp.n_vars > 0 and milp.n_rows > 0


def test_bert_base_at_batch_8_builds_a_poet_model():
    """About 10 s here, most of it the shape run of the 110M-parameter model."""
    g, milp, seconds = _poet_size("bert_base", 8)
    s = g.summary()
    assert s["nodes"] == 310 and s["edges"] == 568
    assert s["kinds"] == {"input": 1, "forward": 154, "labels": 1, "loss": 1, "backward": 129, "grad_sum": 24}
    # Dominated page-ins are pruned; the reference formulation would have 5T^2 + T|E| = 656,580 variables.
    assert milp.n_vars == 35_782
    assert seconds < 120
