"""A language model's head and cross-entropy chunked over positions (compiler/frontend/chunked_head.py): the joint
graph rewritten has no (positions, vocabulary) tensor and no second copy of a tied embedding's gradient, runs
as torch's own joint graph does (bitwise but for two reordered sums), and its plans train as eager autograd."""
from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from edgetrain.compiler.frontend.capture import capture  # noqa: E402
from edgetrain.compiler.frontend.chunked_head import chunk_count, chunk_lm_head  # noqa: E402
from edgetrain.compiler.pipeline import CompileOptions, compile_model  # noqa: E402
from edgetrain.compiler.schedule_file import format as schedule_format  # noqa: E402
from edgetrain.compiler.workbench.run import run_plan  # noqa: E402

import llm_models  # noqa: E402
from test_user_models import OPTIMIZERS  # noqa: E402

VOCAB, SEQ, HIDDEN = 256, 16, 32


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, VOCAB, (1, SEQ), generator=g)
    y = torch.randint(0, VOCAB, (1, SEQ), generator=g)
    x[0, 5] = x[0, 2]  # a repeated token: two rows of the embedding's gradient land in one
    return x, y


def _run(model, cap, x, y):
    """The captured joint graph run on real tensors: (loss, {parameter: gradient})."""
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    args = []
    for n in cap.gm.graph.nodes:
        if n.op == "placeholder":
            name = cap.params.get(n.name) or cap.buffers.get(n.name)
            args.append(state[name] if name else (x if n.name == cap.inputs[0] else y))
    with torch.no_grad():
        outs = dict(zip([o.name for o in cap.gm.graph.output_node().args[0]], cap.gm(*args)))
    return outs[cap.loss], {p: outs[k] for k, p in cap.grads.items()}


def _ops(cap) -> list[str]:
    return [str(n.target) for n in cap.gm.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_chunked_graph_computes_what_torchs_joint_graph_does(dtype):
    model = llm_models.llama(dtype, lora=False, vocab=VOCAB, seq=SEQ, hidden=HIDDEN)
    x, y = _batch()
    plain = capture(model, x, y, loss="model", token_ids=True)
    chunked = chunk_lm_head(capture(model, x, y, loss="model", token_ids=True))
    assert chunk_count(SEQ, VOCAB, HIDDEN) == 2
    assert _ops(chunked).count("aten.nll_loss_forward.default") == 2
    # No (positions, vocabulary) tensor is left but the weight's own shape; no second full embedding gradient.
    whole = [n.name for n in chunked.gm.graph.nodes if n.op == "call_function"
             and isinstance(n.meta.get("val"), torch.Tensor) and tuple(n.meta["val"].shape[-2:]) == (SEQ, VOCAB)]
    assert whole == []
    assert "aten.embedding_dense_backward.default" in _ops(plain)
    assert "aten.embedding_dense_backward.default" not in _ops(chunked)
    assert "aten.index_put.default" in _ops(chunked)

    loss0, grads0 = _run(model, plain, x, y)
    loss1, grads1 = _run(model, chunked, x, y)
    eps = torch.finfo(getattr(torch, dtype)).eps
    assert abs(loss0.item() - loss1.item()) <= 4 * torch.finfo(torch.float32).eps * abs(loss0.item())
    assert grads0.keys() == grads1.keys()
    tied = "model.model.embed_tokens.weight"
    for p, g in grads0.items():
        if p == tied:  # the head's weight gradient summed by chunks, the embedding's rows added one by one: a few
            # units in the last place of its largest element
            assert (g.double() - grads1[p].double()).abs().max() <= 8 * eps * g.double().abs().max()
        else:  # every other gradient by eager's kernels on the same values: bitwise
            assert torch.equal(g, grads1[p]), p


def test_a_frozen_head_keeps_its_input_gradient_bitwise():
    model = llm_models.llama("bfloat16", lora=True, vocab=VOCAB, seq=SEQ, hidden=HIDDEN)
    x, y = _batch(1)
    loss0, grads0 = _run(model, capture(model, x, y, loss="model", token_ids=True), x, y)
    chunked = chunk_lm_head(capture(model, x, y, loss="model", token_ids=True))
    assert _ops(chunked).count("aten.nll_loss_forward.default") == 2
    loss1, grads1 = _run(model, chunked, x, y)
    assert all(torch.equal(g, grads1[p]) for p, g in grads0.items())


def test_a_classifier_is_left_as_it_was():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    x, y = torch.randn(2, 8), torch.tensor([1, 3])
    cap = capture(model, x, y)
    before = _ops(cap)
    assert _ops(chunk_lm_head(cap)) == before


@pytest.mark.parametrize("budget", ["100%", "min"])
def test_full_fine_tuning_with_a_tied_head_trains_as_eager(tmp_path, budget):
    res = compile_model(CompileOptions(model="tests/llm_models.py:llama", target="rpi4", budget=budget,
                                       out=str(tmp_path), batch_size=1, time_limit=5, loss="model",
                                       optimizer=OPTIMIZERS["adamw"], model_kwargs={"lora": False}))
    assert res["peak_bytes"] <= res["budget_bytes"]
    assert res["tokens_per_step"] == SEQ and res["tokens_per_s"] == pytest.approx(SEQ / res["time_s"])
    # The tied gradient is one buffer: each chunk's addmm and the embedding's index_put write into the accumulator.
    nodes = schedule_format.load(str(tmp_path))["graph"]["nodes"]
    into = {n["op"]: n["attrs"].get("into") for n in nodes
            if n["op"] in ("aten.addmm.default", "aten.index_put.default")}
    assert into == {"aten.addmm.default": 0, "aten.index_put.default": 0}
    result = run_plan(str(tmp_path), steps=2, check=True)
    assert result["ok"], result.get("error")
    assert result["max_abs_err"] <= 1e-6
    assert result["measured_peak_bytes"] == result["predicted_peak_bytes"]


class _SumLoss(nn.Module):
    """An untied head and cross-entropy summed over a batch of 3 with ignored labels (a Hugging Face loss given
    num_items_in_batch sums so)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.lin, self.head = nn.Embedding(300, 16), nn.Linear(16, 16), nn.Linear(16, 300, bias=False)

    def forward(self, x, y):
        logits = self.head(torch.tanh(self.lin(self.emb(x))))
        return nn.functional.cross_entropy(logits.reshape(-1, 300), y.reshape(-1), reduction="sum", ignore_index=-100)


def test_a_summed_loss_with_ignored_labels_over_a_batch():
    torch.manual_seed(0)
    model = _SumLoss()
    x, y = torch.randint(0, 300, (3, 10)), torch.randint(0, 300, (3, 10))
    y[0, :4] = -100
    loss0, grads0 = _run(model, capture(model, x, y, loss="model"), x, y)
    chunked = chunk_lm_head(capture(model, x, y, loss="model"))
    assert _ops(chunked).count("aten.nll_loss_forward.default") == chunk_count(30, 300, 16) == 5
    loss1, grads1 = _run(model, chunked, x, y)
    torch.testing.assert_close(loss1, loss0, rtol=1e-6, atol=0)
    for p, g in grads0.items():  # the check's float32 tolerance (compiler/workbench/run.py)
        torch.testing.assert_close(grads1[p], g, rtol=1e-5, atol=1e-6)
