"""C training firmware (codegen/c): generated from a schedule, built by real compilers, held against PyTorch.

Fast tests cover the backend memory model, the offset planner, name sanitizing, snapshots, determinism and
the errors. The `slow` ones build the firmware for a Cortex-M4F and train 20 steps of the two zoo MCU
models under qemu-system-arm (mps2-an386) at a budget below store-all, so the plan recomputes and pages:
the weights must match PyTorch autograd, the loss must fall, the image must fit the nRF52840's RAM, and a
host build must give bit-identical weights. They skip when the toolchain or the dataset is missing.

Set EDGETRAIN_UPDATE_SNAPSHOTS=1 to rewrite tests/snapshots/ after an intended change of the generated C.
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

import edgetrain.codegen.c.firmware as firmware
from edgetrain.codegen.c import Namer, c_comment, c_ident
from edgetrain.codegen.c.arena import Lifetime, check, live_peak_words, pack
from edgetrain.compiler.workbench import cli
from edgetrain.codegen.c.ops import C_OPS, supported_text
from edgetrain.compiler.pipeline import CompileOptions, build_graph, compile_model
from edgetrain.compiler.errors import BudgetError, UnsupportedModelError
from edgetrain.compiler.graph.ir import OptimizerConfig
from edgetrain.codegen.c.runner import FirmwareError, read_result
from edgetrain.compiler.workbench.run_c import run_firmware
from edgetrain.targets import load_target

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOTS = ROOT / "tests" / "snapshots"
HAVE_HOST = bool(shutil.which("gcc") and shutil.which("make"))
HAVE_ARM = bool(HAVE_HOST and shutil.which("arm-none-eabi-gcc") and shutil.which("qemu-system-arm"))
needs_host = pytest.mark.skipif(not HAVE_HOST, reason="gcc and make are needed to build the firmware")
needs_arm = pytest.mark.skipif(not HAVE_ARM, reason="arm-none-eabi-gcc / qemu-system-arm missing: apt-get install "
                                                    "gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm")
GENERATED = ("plan.c", "plan.h", "main_host.c", "main_qemu.c", "Makefile", "firmware.json")


def _compile(out: Path, model: str, budget: str, **kw) -> dict:
    opts = dict(model=model, target="nrf52840", budget=budget, out=str(out), batch_size=1, emit="c",
                time_limit=20.0)
    opts.update(kw)
    return compile_model(CompileOptions(**opts))


def _code(text: str) -> str:
    """C source without its comments and string literals."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r'"(\\.|[^"\\])*"', '""', text)


# -- the backend memory model ----------------------------------------------------------------------------

def test_backends_count_what_their_runtime_holds():
    """torch computes a parameter's gradient into a tensor before the update (the Python plan counts it as the
    node's workspace); the C runtime fuses it into the update (et_*_wgrad_sgd: no gradient buffer), keeps
    max-pool indices and labels as int32, and drops the operands its kernels do not read."""
    target = load_target("nrf52840")
    graphs = {b: build_graph(CompileOptions(model="mcu_cnn", target="nrf52840", budget="100%", out="", batch_size=1,
                                            emit=b), target)[2] for b in ("python", "c")}
    py, c = graphs["python"], graphs["c"]
    updating = [n for n in py.nodes if n.updates]
    assert {p for n in updating for p in n.updates} == set(py.params)
    assert any(n.workspace_bytes > 0 for n in updating)
    assert all(n.workspace_bytes == 0 for n in c.nodes)
    assert c.node("labels").dtype == "int32" and py.node("labels").dtype == "int64"
    idx = [n for n in c.nodes if n.op == "aten.max_pool2d_with_indices.default" and n.attrs.get("keep") == 1]
    assert idx and all(n.dtype == "int32" for n in idx)
    for n in c.nodes:  # max-pool's backward reads the gradient and the indices, not the forward input
        if n.op == "aten.max_pool2d_with_indices_backward.default":
            assert len(n.inputs) == 2 and n.inputs[1].name.endswith(".out1")
            assert len(py.node(n.name).inputs) == 3


def test_every_op_of_the_c_table_has_an_emitter_and_nothing_else_does():
    """The C op table is the one list: each op has an emitter, and no emitter exists for an op it does not list;
    each source it names is a file of runtime/c that every firmware compiles, and each kernel a header."""
    from edgetrain.codegen.c.emitters import EMITTERS
    from edgetrain.codegen.c.q8_emit import Q8_EMITTERS  # an int8 prefix's nodes: the graph pass's own ops
    from edgetrain.codegen.c.qas_emit import QAS_EMITTERS  # int8 bias training's backward node

    assert set(EMITTERS) | set(Q8_EMITTERS) | set(QAS_EMITTERS) == set(C_OPS)
    assert not set(EMITTERS) & set(Q8_EMITTERS) and not set(QAS_EMITTERS) & (set(EMITTERS) | set(Q8_EMITTERS))
    umbrella = (ROOT / "runtime" / "c" / "et_runtime.h").read_text()  # what plan.c includes
    for k in {k.kernel for k in C_OPS.values() if k.kernel}:
        assert (ROOT / "runtime" / "c" / "kernels" / f"{k}.h").exists(), k
        assert f'#include "kernels/{k}.h"' in umbrella, k
    for src in {s for k in C_OPS.values() for s in k.source_files}:
        assert (ROOT / "runtime" / "c" / "kernels" / f"{src}.c").exists(), src
        assert f"kernels/{src}.c" in firmware.RUNTIME_SOURCES
    # A convolution's gradients live in their own sources: the firmware compiles them too.
    assert {"kernels/conv2d.c", "kernels/conv2d_input_grad.c", "kernels/conv2d_weight_grad.c"} <= set(
        firmware.RUNTIME_SOURCES)


@pytest.mark.parametrize("model, op, node, line", [
    ("tests.c_models:tiny_tanh", "aten.tanh.default", "tanh", "module `2` (Tanh)"),  # nn.Sequential: its module
    ("tests.c_models:tiny_tanh_line", "aten.tanh.default", "tanh", "c_models.py:"),
])
def test_emit_c_rejects_ops_without_a_c_kernel(tmp_path, capsys, model, op, node, line):
    # rpi4: a target without device limits, so ResNet-18's weights (far over an nRF52840) are not the refusal
    with pytest.raises(UnsupportedModelError) as e:
        _compile(tmp_path / "o", model, "100%", target="rpi4")
    msg = str(e.value)
    assert f"op `{op}` " in msg and f"at node `{node}` ({line}" in msg  # op, node, source line
    assert supported_text() in msg  # the list comes from the table
    for supported in ("2-D convolution", "linear layers", "ReLU6", "max-pool", "avg-pool", "mean over H and W",
                      "cat along channels (dim 1)", "flatten", "cross-entropy"):
        assert supported in msg
    assert "aten.tanh_backward.default" in msg  # every op at once: the forward op and its backward
    assert not (tmp_path / "o" / "plan.c").exists()
    rc = cli.main(["compile", model, "--target", "rpi4", "--budget", "100%", "--emit", "c", "--batch-size", "1",
                   "--out", str(tmp_path / "cli"), "--json"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 2 and out["ok"] is False and out["error"]["kind"] == "UnsupportedModelError" and op in out["error"]["message"]


def test_emit_c_refuses_other_optimizers(tmp_path):
    with pytest.raises(UnsupportedModelError, match="SGD"):
        _compile(tmp_path / "o", "tests.c_models:tiny_cnn", "100%", optimizer=OptimizerConfig(name="adamw"))


# -- names -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ['x; system("rm -rf /")', "conv1.weight", "9lives", "__x__", "", "ünïcode.w",
                                  "a" * 200, "int", "*/ evil /*"])
def test_identifiers_are_safe(name):
    ident = c_ident(name, "p")
    assert re.fullmatch(r"p(_[A-Za-z0-9]+)*", ident) and len(ident) <= 48
    assert "system(" not in ident and "__" not in ident


def test_namer_is_unique_and_deterministic():
    names = ["a.b", "a_b", "a b", "a-b", 'x; system("a")', "x_system_a"]
    n1, n2 = Namer(), Namer()
    a = [n1(n, "p") for n in names]
    b = [n2(n, "p") for n in names]
    assert a == b and len(set(a)) == len(a)
    assert n1("a.b", "p") == a[0]  # asked again: the same identifier


@pytest.mark.parametrize("text", ["*/ int main(void) { return 1; } /*", "a ??/\nb", "x\\", "tab\there", "**//"])
def test_comments_cannot_escape(text):
    out = c_comment(text)
    assert "*/" not in out and "/*" not in out and "??" not in out and "\n" not in out and "\\" not in out
    assert all(" " <= ch <= "~" for ch in out)


@needs_host
def test_hostile_module_names_give_valid_harmless_c(tmp_path):
    from tests.c_models import EVIL, EVIL_2

    out = tmp_path / "evil"
    _compile(out, "tests.c_models:evil_names", "97%")
    for name in GENERATED[:5]:
        text = (out / name).read_text()
        code = _code(text)
        assert not re.search(r"\bsystem\s*\(", code) and "pwned >" not in code and "return 1; }" not in code
        assert EVIL not in code and EVIL_2 not in text  # the names live on only in comments, defused
    idents = set(re.findall(r"\b[pmk]_[A-Za-z0-9_]+\b", _code((out / "plan.c").read_text())))
    assert any("system" in i for i in idents) and all(re.fullmatch(r"[pmk](_[A-Za-z0-9]+)+", i) for i in idents)
    r = run_firmware(str(out), qemu=False, steps=2, check=True)  # -Wall -Wextra -Werror -pedantic build
    assert r["ok"], r.get("error")
    assert not Path("/tmp/edgetrain-pwned").exists()


# -- the offset planner ----------------------------------------------------------------------------------

def _random_lifetimes(rng: random.Random, n: int) -> list[Lifetime]:
    out = []
    for k in range(n):
        a = rng.randrange(0, 3 * n)
        out.append(Lifetime(f"t{k}", a, a + rng.randrange(0, n), rng.choice([1, 10, 49, 196, 784])))
    return out


@pytest.mark.parametrize("seed", range(5))
def test_offset_planner_never_overlaps_and_is_deterministic(seed):
    lts = _random_lifetimes(random.Random(seed), 40)
    p = pack(lts)
    check(lts)
    assert p.words >= p.lower_bound_words == live_peak_words(lts)
    again = [Lifetime(lt.name, lt.start, lt.end, lt.words) for lt in lts]
    assert pack(again).words == p.words and [lt.offset for lt in again] == [lt.offset for lt in lts]


def test_offset_planner_reaches_the_live_peak_on_a_chain():
    # forward a -> b -> c, each freed after the next is made: two buffers suffice
    lts = [Lifetime("a", 0, 1, 100), Lifetime("b", 1, 2, 100), Lifetime("c", 2, 3, 100), Lifetime("d", 3, 4, 100)]
    p = pack(lts)
    assert p.words == p.lower_bound_words == 200


def test_fragmentation_over_the_budget_fails_with_the_figures(tmp_path, monkeypatch):
    def no_reuse(lifetimes):  # a planner that never shares bytes: fragmentation at its worst
        top = 0
        for lt in lifetimes:
            lt.offset, top = top, top + lt.words
        return firmware.Packing(words=top, lower_bound_words=live_peak_words(lifetimes), strategy="no-reuse")

    monkeypatch.setattr(firmware, "pack", no_reuse)
    out = tmp_path / "frag"
    with pytest.raises(BudgetError) as e:
        _compile(out, "tests.c_models:tiny_cnn", "95%")
    msg = str(e.value)
    assert "arena" in msg and "over the budget" in msg and "activation peak" in msg and "No firmware" in msg
    assert re.search(r"at least \d+B", msg)
    assert not (out / "plan.c").exists() and not (out / "schedule.json").exists()


# -- generated code: snapshots, determinism, ordering --------------------------------------------------------

SNAPSHOT_MODELS = {"tiny_cnn": "95%", "tiny_branchy": "90%"}  # tiny_cnn pages at 95%, tiny_branchy recomputes


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = {}
    for name, budget in SNAPSHOT_MODELS.items():
        d = tmp_path_factory.mktemp(name)
        out[name] = (d, _compile(d, f"tests.c_models:{name}", budget))
    return out


@pytest.mark.parametrize("name", list(SNAPSHOT_MODELS))
def test_plan_c_snapshot(tiny, name):
    text = (tiny[name][0] / "plan.c").read_text()
    snap = SNAPSHOTS / f"{name}.plan.c"
    if os.environ.get("EDGETRAIN_UPDATE_SNAPSHOTS"):
        snap.write_text(text)
    assert snap.exists(), f"{snap} missing: run with EDGETRAIN_UPDATE_SNAPSHOTS=1"
    assert text == snap.read_text(), f"generated plan.c differs from {snap}; if intended, update the snapshot"


def test_snapshots_cover_recompute_paging_and_every_kernel(tiny):
    text = "".join((tiny[n][0] / "plan.c").read_text() for n in SNAPSHOT_MODELS)
    for call in ("et_page_out(", "et_page_in(", "recompute", "et_conv2d_backward_input", "et_conv2d_wgrad_sgd",
                 "et_linear_wgrad_sgd", "et_relu6_forward", "et_relu6_backward", "et_relu_backward",
                 "et_maxpool2d_forward", "et_maxpool2d_backward", "et_avgpool2d_backward", "et_global_avgpool_backward",
                 "et_concat_forward_part", "et_add_forward", "et_log_softmax_backward", "et_nll_loss_backward"):
        assert call in text, call


def test_same_inputs_give_byte_identical_files(tiny, tmp_path):
    first, _ = tiny["tiny_branchy"]
    again = tmp_path / "again"
    _compile(again, "tests.c_models:tiny_branchy", "90%")
    for name in GENERATED:
        assert (first / name).read_bytes() == (again / name).read_bytes(), name
    for src in sorted((first / "et_runtime").rglob("*")):
        if src.is_file():
            assert src.read_bytes() == (again / "et_runtime" / src.relative_to(first / "et_runtime")).read_bytes()


def test_input_gradient_comes_before_the_fused_update(tiny):
    """A layer's weights change only after every reader of the old weights: its input gradient comes first, and
    no forward of the layer follows its update within the step."""
    for name in SNAPSHOT_MODELS:
        d = tiny[name][0]
        body = (d / "plan.c").read_text().split("int et_train_step", 1)[1].split("int et_predict")[0]
        lines = [ln.strip() for ln in body.splitlines() if ln.strip().startswith("et_")]
        updates = 0
        for k, ln in enumerate(lines):
            m = re.match(r"et_(conv2d|linear)_wgrad_sgd\((&k_\w+|[\d, ]+),.*?, (p_\w+|NULL), (m_\w+|NULL), ", ln)
            if not m or m.group(3) == "NULL":
                continue
            updates += 1
            kind, weight = m.group(1), m.group(3)
            assert not any(later.startswith(f"et_{kind}_forward(") and weight in later for later in lines[k + 1:])
            assert not any(later.startswith(f"et_{kind}_backward_input(") and weight in later for later in lines[k + 1:])
        params = json.loads((d / "schedule.json").read_text())["graph"]["params"]
        assert updates == sum(1 for p in params if p.endswith("weight"))  # every weight is updated, once


def test_arena_and_state_fit_the_budget(tiny):
    for d, r in tiny.values():
        man = json.loads((d / "firmware.json").read_text())
        assert man["arena_bytes"] == r["arena_bytes"]
        assert man["state_bytes"] + man["arena_bytes"] <= man["budget_bytes"] == r["budget_bytes"]
        assert man["train_arena_bytes"] >= man["activation_peak_bytes"] == r["peak_bytes"] - r["state_bytes"]
        h = (d / "plan.h").read_text()
        assert f"#define ET_ARENA_BYTES {man['arena_bytes']}u" in h


@pytest.mark.parametrize("v, lit", [(1.0, "1.0f"), (-0.0, "-0.0f"), (0.1, "0.100000001f"), (1e-45, "1.40129846e-45f"),
                                    (3.4028234663852886e38, "3.40282347e+38f"), (-2.5, "-2.5f")])
def test_float_literals_are_exact(v, lit):
    assert firmware.c_float(v) == lit
    assert np.float32(float(lit[:-1])) == np.float32(v)


@needs_host
def test_initializers_reproduce_the_weights_bit_for_bit(tiny):
    d, _ = tiny["tiny_cnn"]
    r = run_firmware(str(d), qemu=False, steps=0)
    assert r["ok"], r.get("error")
    man = json.loads((d / "firmware.json").read_text())
    got = read_result(str(d / "run-host"), man)["params"]
    w = load_file(str(d / "weights.safetensors"))
    for p in man["params"]:
        assert np.array_equal(got[p["name"]].numpy().view(np.uint32), w[f"param/{p['name']}"].view(np.uint32))


@needs_host
def test_host_build_trains_like_pytorch(tiny):
    for name in SNAPSHOT_MODELS:
        r = run_firmware(str(tiny[name][0]), qemu=False, steps=4, check=True)
        assert r["ok"], r.get("error")
        assert r["losses"] == pytest.approx(r["reference_losses"], rel=1e-5)
        assert r["paged_bytes_per_step"] == r["predicted_paged_bytes_per_step"]
        assert r["predict_max_abs_err"] <= 1e-5


@needs_host
def test_mcu_activations_and_squeeze_excitation_train_like_pytorch(tmp_path):
    """Hardswish, SiLU (its backward eager's own kernel, as the graph keeps it), hardsigmoid, a broadcast multiply,
    LeakyReLU, GELU and sigmoid, at batch 2 below store-all: exact on the host build."""
    c = _compile(tmp_path / "se", "tests.c_models:tiny_se", "90%", batch_size=2)
    assert c["recomputes"] + c["page_ins"] > 0
    plan = (tmp_path / "se" / "plan.c").read_text()
    for call in ("et_hardswish_backward", "et_silu_forward", "et_silu_backward", "et_hardsigmoid_backward", "et_mul_bcast_forward", "et_sum_planes", "et_leaky_relu_backward",
                 "et_gelu_backward", "et_sigmoid_backward"):
        assert call in plan, call
    r = run_firmware(str(tmp_path / "se"), qemu=False, steps=3, check=True)
    assert r["ok"] and not r["mismatched"], r.get("error")
    assert r["losses"] == pytest.approx(r["reference_losses"], rel=1e-5)
    assert r["predict_max_abs_err"] <= 1e-5


@needs_host
@pytest.mark.parametrize("budget", ["100%", "90%"])
def test_attention_free_transformer_block_trains_like_pytorch(tmp_path, budget):
    """LayerNorm (its mean and rstd ride to its backward as the node's aux; the fused backward updates its
    weight and bias), linear layers on [N, tokens, features], GELU and a residual: exact on the host build, at
    store-all and at 90%, where the schedule recomputes the first layer norm."""
    c = _compile(tmp_path / "m", "tests.c_models:tiny_token_mlp", budget, batch_size=2)
    assert c["recomputes"] > 0 if budget == "90%" else c["recomputes"] == 0
    plan = (tmp_path / "m" / "plan.c").read_text()
    for call in ("et_layer_norm_forward", "et_layer_norm_backward_sgd", "et_gelu_backward", "et_add_forward"):
        assert call in plan, call
    r = run_firmware(str(tmp_path / "m"), qemu=False, steps=4, check=True)
    assert r["ok"] and not r["mismatched"], r.get("error")
    assert r["losses"] == pytest.approx(r["reference_losses"], rel=1e-5)
    assert r["predict_max_abs_err"] <= 1e-5


@needs_host
@pytest.mark.parametrize("model", ["tiny_narrow_norm", "tiny_bn_on_few_positions"])
def test_statistics_kept_as_nodes_of_their_own_ride_as_aux(tmp_path, model):
    """Over few positions (a layer norm over 4 features, a batch norm after global pooling at batch 2) torch's
    graph keeps the statistics as nodes of their own; the C lowering gives them back to their forward as the
    block its backward reads: no node of a statistic is left, and the host build trains exactly."""
    _compile(tmp_path / "n", f"tests.c_models:{model}", "100%", batch_size=2)
    sched = json.loads((tmp_path / "n" / "schedule.json").read_text())
    names = {n["name"] for n in sched["graph"]["nodes"]}
    assert not any(re.search(r"\.out[12]$", x) and "norm" in x for x in names)
    r = run_firmware(str(tmp_path / "n"), qemu=False, steps=2, check=True)
    assert r["ok"] and not r["mismatched"], r.get("error")
    assert r["losses"] == pytest.approx(r["reference_losses"], rel=1e-5)


@needs_host
def test_corrupted_page_stops_the_host_step(tiny):
    d, _ = tiny["tiny_cnn"]
    man = json.loads((d / "firmware.json").read_text())
    page = next(p["id"] for p in man["pages"] if p["paged_in"])
    r = run_firmware(str(d), qemu=False, steps=2, corrupt_page=page)
    assert not r["ok"] and r["exit_code"] == 3 and r["status"] == "ET_ERR_CRC" and r["steps_done"] == 0
    assert "CRC" in r["error"]


def test_missing_toolchain_says_how_to_install(tiny, monkeypatch):
    import edgetrain.codegen.c.runner as runner

    monkeypatch.setattr(runner.shutil, "which", lambda tool: None)
    with pytest.raises(FirmwareError, match="apt-get install gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm"):
        run_firmware(str(tiny["tiny_cnn"][0]), qemu=True, steps=1)


def test_run_qemu_on_a_python_plan_says_emit_c(tmp_path, capsys):
    out = tmp_path / "py"
    compile_model(CompileOptions(model="tests.c_models:tiny_cnn", target="nrf52840", budget="100%", out=str(out),
                                 batch_size=1))
    rc = cli.main(["run", str(out), "--qemu", "--json"])
    msg = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["error"]["message"]
    assert rc == 2 and "--emit c" in msg


# -- Cortex-M4F under QEMU: the two zoo MCU models ------------------------------------------------------------

# Budgets below store-all at which POET both recomputes and pages these models (see benchmarks/cortex_m.py).
MCU = {"mcu_cnn": "85%", "mcu_resnet": "90%"}
STEPS, CYCLE, LR = 20, 4, 0.02
RAM_LIMIT = 256 * 1024


def _fashion_mnist_or_skip():
    from edgetrain.compiler.workbench.data import FASHION_MNIST_DIR

    if not FASHION_MNIST_DIR.is_dir():
        pytest.skip(f"Fashion-MNIST not installed in {FASHION_MNIST_DIR} (apt-get install dataset-fashion-mnist)")


@pytest.fixture(scope="module")
def mcu(tmp_path_factory):
    if not HAVE_ARM:
        pytest.skip("arm-none-eabi-gcc / qemu-system-arm missing")
    _fashion_mnist_or_skip()
    out = {}
    for name, budget in MCU.items():
        d = tmp_path_factory.mktemp(name)
        c = _compile(d, name, budget, optimizer=OptimizerConfig(lr=LR, momentum=0.9, weight_decay=5e-4))
        out[name] = (d, c)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MCU))
def test_qemu_trains_like_pytorch_within_the_budget(mcu, name, capsys):
    d, c = mcu[name]
    assert c["min_feasible_bytes"] <= c["budget_bytes"] < c["store_all_peak_bytes"]
    assert c["recomputes"] > 0 and c["page_ins"] > 0, "the plan must recompute and page"
    # Through the CLI, as a user runs it.
    rc = cli.main(["run", str(d), "--qemu", "--steps", str(STEPS), "--data", "fashion-mnist", "--cycle", str(CYCLE),
                   "--check", "--json"])
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and r["ok"], r.get("error")
    assert r["exit_code"] == 0 and r["steps_done"] == STEPS and r["status"] == "ET_OK"
    assert r["max_rel_err"] is not None and not r["mismatched"]  # rtol 1e-5, atol 1e-6 per element
    assert r["losses"] == pytest.approx(r["reference_losses"], rel=1e-5)
    losses = r["losses"]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5, losses
    assert r["ram_bytes"] == r["data_bytes"] + r["bss_bytes"] <= RAM_LIMIT
    assert r["arena_bytes"] <= r["budget_bytes"] and r["arena_bytes"] + r["state_bytes"] <= r["budget_bytes"]
    assert r["paged_bytes_per_step"] == r["predicted_paged_bytes_per_step"] > 0
    assert r["instructions_per_step"] > 1e6
    (d / "qemu.json").write_text(json.dumps(r))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MCU))
def test_host_build_is_bit_identical_to_qemu(mcu, name):
    d, _ = mcu[name]
    host = run_firmware(str(d), qemu=False, steps=STEPS, data="fashion-mnist", cycle=CYCLE)
    assert host["ok"], host.get("error")
    qemu_path = d / "qemu.json"
    if qemu_path.exists():
        q = json.loads(qemu_path.read_text())
    else:
        q = run_firmware(str(d), qemu=True, steps=STEPS, data="fashion-mnist", cycle=CYCLE)
    assert host["params_sha256"] == q["params_sha256"]
    assert host["losses"] == q["losses"]  # float32 values, bit for bit


@pytest.mark.slow
def test_corrupted_page_is_caught_by_the_crc_on_the_mcu(mcu, capsys):
    d, _ = mcu["mcu_cnn"]
    man = json.loads((d / "firmware.json").read_text())
    page = next(p["id"] for p in man["pages"] if p["paged_in"])
    rc = cli.main(["run", str(d), "--qemu", "--steps", "3", "--inject-corrupt-page", str(page), "--json"])
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 1 and not r["ok"]
    assert r["exit_code"] == 3 and r["status"] == "ET_ERR_CRC" and r["steps_done"] == 0
    assert "CRC" in r["error"]["message"] and r["error"]["kind"] == "FirmwareStatus"


def test_c_codegen_renders_without_any_solver(tiny, tmp_path):
    from tests.test_layout import CODEGEN_FORBIDDEN, _run_blocked

    src = tiny["tiny_branchy"][0]
    for name in ("schedule.json", "weights.safetensors"):
        shutil.copyfile(src / name, tmp_path / name)
    _run_blocked(CODEGEN_FORBIDDEN, f"""
        import json
        from codegen.c import render_c_firmware

        body = json.loads(open({str(tmp_path / "schedule.json")!r}).read())
        result = dict(arena=render_c_firmware(body, {str(tmp_path)!r})["arena_bytes"])
    """)
    for name in GENERATED:
        assert (tmp_path / name).read_bytes() == (src / name).read_bytes(), name
