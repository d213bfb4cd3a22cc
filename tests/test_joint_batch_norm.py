"""Batch norm in torch's joint graph: the training-mode backward reads the running statistics from the buffers,
so the forward node keeps only the saved mean and inverse std for it (2C words, not 4C)."""
from edgetrain.compiler.pipeline import CompileOptions, build_graph
from edgetrain.compiler.workbench.run import run_plan
from edgetrain.compiler.pipeline import compile_model
from edgetrain.targets import load_target

BN_FWD = "aten._native_batch_norm_legit_functional.default"
BN_BWD = "aten.native_batch_norm_backward.default"


def _graph(model: str):
    _, _, g = build_graph(CompileOptions(model=model, target="nrf52840", budget="100%", out="", batch_size=4),
                          load_target("nrf52840"))
    return g


def test_backward_reads_running_statistics_from_buffers():
    g = _graph("resnet18")
    backward = [n for n in g.nodes if n.op == BN_BWD]
    assert len(backward) == 20
    for n in backward:
        fwd = g.node(n.aux_of)
        assert fwd.op == BN_FWD
        mean, var = n.attrs["args"][3:5]
        assert mean == {"$b": mean["$b"]} and mean["$b"].endswith("running_mean")
        assert var == {"$b": var["$b"]} and var["$b"].endswith("running_var")
        assert {mean["$b"], var["$b"]} <= set(n.buffers) and mean["$b"] in g.buffers
        assert n.attrs["args"][5:7] == [{"$aux": 0}, {"$aux": 1}]  # the saved mean and inverse std
        assert fwd.attrs["aux"] == [1, 2] and fwd.aux_bytes == 2 * 4 * fwd.shape[1]
        assert all(r.name != fwd.name for r in n.inputs)  # nothing of the forward node but its aux


def test_tight_plan_with_recomputed_batch_norm_matches_autograd(tmp_path):
    out = str(tmp_path / "plan")
    c = compile_model(CompileOptions(model="small_cnn", target="rpi4", budget="80%", out=out, batch_size=8,
                                     time_limit=8.0, scheduler="checkmate"))
    assert c["recomputes"] > 0
    r = run_plan(out, steps=2, check=True)  # parameters and buffers (running statistics) against autograd
    assert r["ok"], r.get("error")
    assert r["max_abs_err"] == 0
    assert r["measured_peak_bytes"] == r["predicted_peak_bytes"] == c["peak_bytes"]
