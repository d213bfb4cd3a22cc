"""Render a schedule as C training firmware for runtime/c: plan.c/plan.h, two drivers and a Makefile.

Everything comes from schedule.json and weights.safetensors; no solver runs here. The steps of the
schedule become straight-line kernel calls at literal offsets of one static arena, whose offsets the
planner in `arena.py` packs from the steps' lifetimes. If the packed arena plus the parameters and
momentum buffers would exceed the budget, rendering fails with the figures: no firmware that can
overflow is ever written.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from math import prod
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

from edgetrain.compiler.errors import BudgetError, UnsupportedModelError  # messages for the user, not a solver
from edgetrain.compiler.graph.ir import TensorRef, view_shape  # the schedule's operands and their views
from edgetrain.compiler.schedule_file.format import content_hash  # the schedule format

from edgetrain.codegen.templating import environment
from .arena import Lifetime, Packing, pack
from .names import Namer, c_comment

RUNTIME_DIR = Path(__file__).resolve().parents[2] / "runtime" / "c"
VENDORED = "et_runtime"  # the runtime's copy inside the firmware folder
FIRMWARE_FILES = ("plan.c", "plan.h", "main_host.c", "main_qemu.c", "Makefile", "firmware.json")
# Runtime sources every build compiles. Both builds keep pages in files (storage_file.c); each adds the
# raw-I/O back end under it (storage_stdio.c on the host, storage_semihost.c under QEMU).
RUNTIME_SOURCES = ("et_status.c", "et_math.c", "crc32.c", "storage_block.c", "storage_file.c") + tuple(
    f"kernels/{k}.c" for k in ("add", "avgpool2d", "batch_norm", "concat", "conv2d", "cross_entropy", "flatten",
                               "gelu", "global_avgpool", "hardsigmoid", "hardswish", "layer_norm", "leaky_relu", "linear", "maxpool2d",
                               "mul", "relu", "relu6", "sgd", "sigmoid", "silu"))
INSTRUCTIONS_PER_TICK = 40  # QEMU -icount shift=0: 1 ns per instruction; the CMSDK timer counts at 25 MHz

_ENV = environment("templates/c")


def c_float(v: float) -> str:
    """An exact float32 literal: 9 significant digits round-trip every float32, parsed with the f suffix."""
    v = float(np.float32(v))
    if not np.isfinite(v):
        raise UnsupportedModelError(f"a non-finite value ({v}) cannot be written as a C initializer")
    s = "%.9g" % v
    if not any(ch in s for ch in ".e"):
        s += ".0"
    return s + "f"


_ENV.filters.update(comment=c_comment, cfloat=c_float)


class CodegenError(UnsupportedModelError):
    """The schedule asks for something the C runtime cannot do."""


@dataclass
class Block:
    """One schedule step as C: the comment lines above it and the statements."""

    comments: list[str]
    code: list[str] = field(default_factory=list)


def _numel(shape) -> int:
    return prod(shape) if shape else 1


class _Emitter:
    """Turns the schedule's nodes into kernel calls (one small method per op, like torch.fx's Interpreter)."""

    def __init__(self, schedule: dict) -> None:
        g = schedule["graph"]
        self.nodes = g["nodes"]
        self.by_name = {n["name"]: n for n in self.nodes}
        self.params = g["params"]
        self.opt = g["optimizer"]
        self.namer = Namer()
        self.pident = {p: self.namer(p, "p") for p in self.params}
        self.mident = {p: self.namer(p, "m") for p in self.params} if self.opt["momentum"] else {}
        self.structs: dict[str, dict] = {}  # node name -> {"type", "ident", "fields", "layer"}

    # -- operands ----------------------------------------------------------------------------------
    def ptr(self, ref: dict, lts: dict[str, Lifetime]) -> tuple[str, list[int]]:
        """A C pointer to an operand (through its views) and the shape it is seen in."""
        base = self.by_name[ref["t"]]
        lt = lts[ref["t"]]
        view = TensorRef.from_json(ref).view
        off = 0
        for k, v in enumerate(view):  # a reshape moves nothing; a narrow of a contiguous block is an offset
            if v[0] == "narrow":
                shape = view_shape(base["shape"], view[:k])
                dim, start = int(v[1]), int(v[2])
                if _numel(shape[:dim]) != 1:
                    raise CodegenError(
                        f"the gradient slice of `{c_comment(ref['t'])}` along dim {dim} is strided (batch > 1 "
                        "through a concat); the C plan supports concat gradients at batch size 1 only")
                off += start * _numel(shape[dim + 1:])
            elif v[0] != "reshape":
                raise CodegenError(f"view {v!r} on `{c_comment(ref['t'])}` has no C equivalent (reshape and "
                                   "contiguous narrow only)")
        shape = list(view_shape(base["shape"], view))
        macro = "ET_I" if base["dtype"] == "int32" else "ET_F"
        if base["dtype"] not in ("int32", "float32"):
            raise CodegenError(f"tensor `{c_comment(ref['t'])}` has dtype {base['dtype']}; the C runtime holds "
                               "float32 and int32 only (compile with --emit c)")
        return f"{macro}({lt.offset + off})", shape

    def param(self, node: dict, k: int) -> str:
        return self.pident[node["params"][k]] if k < len(node["params"]) else "NULL"

    def mom(self, node: dict, k: int) -> str:
        if k >= len(node["params"]) or not self.mident:
            return "NULL"
        return self.mident[node["params"][k]]

    # -- shape structs -----------------------------------------------------------------------------
    def conv_struct(self, node: dict) -> str:
        if node["name"] not in self.structs:
            x = self._in_shape(node, 0)
            a = node["attrs"]
            f = dict(n=x[0], c_in=x[1], h_in=x[2], w_in=x[3], c_out=node["shape"][1], h_out=node["shape"][2],
                     w_out=node["shape"][3], k_h=a["kernel_size"][0], k_w=a["kernel_size"][1],
                     stride_h=a["stride"][0], stride_w=a["stride"][1], pad_h=a["padding"][0],
                     pad_w=a["padding"][1], dil_h=a["dilation"][0], dil_w=a["dilation"][1], groups=a["groups"])
            self._struct(node, "et_conv2d_shape", f)
        return "&" + self.structs[node["name"]]["ident"]

    def pool_struct(self, node: dict, dilation: bool) -> str:
        if node["name"] not in self.structs:
            x = self._in_shape(node, 0)
            a = node["attrs"]
            dil = a.get("dilation", [1, 1]) if dilation else [1, 1]
            f = dict(n=x[0], c=x[1], h_in=x[2], w_in=x[3], h_out=node["shape"][2], w_out=node["shape"][3],
                     k_h=a["kernel_size"][0], k_w=a["kernel_size"][1], stride_h=a["stride"][0],
                     stride_w=a["stride"][1], pad_h=a["padding"][0], pad_w=a["padding"][1], dil_h=dil[0],
                     dil_w=dil[1], count_include_pad=int(bool(a.get("count_include_pad", False))))
            self._struct(node, "et_pool2d_shape", f)
        return "&" + self.structs[node["name"]]["ident"]

    def _struct(self, node: dict, ctype: str, fields: dict) -> None:
        """One const struct per distinct shape (max-pool's argmax and gather nodes share theirs)."""
        items = [(k, int(v)) for k, v in fields.items()]
        for entry in self.structs.values():
            if entry["type"] == ctype and entry["fields"] == items:
                entry["layers"].append(node["name"])
                self.structs[node["name"]] = entry
                return
        self.structs[node["name"]] = {"type": ctype, "ident": self.namer(node["name"], "k"), "fields": items,
                                      "layers": [node["name"]]}

    def _in_shape(self, node: dict, k: int) -> list[int]:
        ref = TensorRef.from_json(node["inputs"][k])
        return list(view_shape(self.by_name[ref.name]["shape"], ref.view))

    # -- one node ----------------------------------------------------------------------------------
    def call(self, node: dict, out: str | None, ins: list[tuple[str, list[int]]], first: bool) -> list[str]:
        method = getattr(self, "op_" + node["op"], None)
        if method is None:
            raise CodegenError(f"op `{node['op']}` of node `{c_comment(node['name'])}` has no kernel in the C "
                               "runtime; compile with --emit c to get a schedule checked for it")
        return method(node, out, ins, first)

    def op_input(self, node, out, ins, first):
        return [f"memcpy({out}, x, {4 * _numel(node['shape'])}u);"]

    def op_labels(self, node, out, ins, first):
        return [f"memcpy({out}, y, {4 * _numel(node['shape'])}u);"]

    def op_conv2d(self, node, out, ins, first):
        return [f"et_conv2d_forward({self.conv_struct(node)}, {ins[0][0]}, {self.param(node, 0)}, "
                f"{self.param(node, 1) if node['attrs']['bias'] else 'NULL'}, {out});"]

    def op_conv2d_bwd(self, node, out, ins, first):
        fwd = self.by_name[node["forward_of"]]
        k = self.conv_struct(fwd)
        (gy, _), (x, _) = ins[0], ins[1]
        lines = []
        if node["attrs"].get("needs_input_grad", True):  # first: it reads the weights before the update
            lines.append(f"et_conv2d_backward_input({k}, {gy}, {self.param(node, 0)}, {out});")
        b = node["attrs"]["bias"]
        lines.append(f"et_conv2d_wgrad_sgd({k}, {gy}, {x}, &et_sgd, {self.param(node, 0)}, {self.mom(node, 0)}, "
                     f"{self.param(node, 1) if b else 'NULL'}, {self.mom(node, 1) if b else 'NULL'});")
        return lines

    def _linear_dims(self, fwd: dict) -> str:
        x = self._in_shape(fwd, 0)
        return f"{x[0]}, {x[1]}, {fwd['shape'][1]}"

    def op_linear(self, node, out, ins, first):
        return [f"et_linear_forward({self._linear_dims(node)}, {ins[0][0]}, {self.param(node, 0)}, "
                f"{self.param(node, 1) if node['attrs']['bias'] else 'NULL'}, {out});"]

    def op_linear_bwd(self, node, out, ins, first):
        fwd = self.by_name[node["forward_of"]]
        dims = self._linear_dims(fwd)
        (gy, _), (x, _) = ins[0], ins[1]
        lines = []
        if node["attrs"].get("needs_input_grad", True):
            lines.append(f"et_linear_backward_input({dims}, {gy}, {self.param(node, 0)}, {out});")
        b = node["attrs"]["bias"]
        lines.append(f"et_linear_wgrad_sgd({dims}, {gy}, {x}, &et_sgd, {self.param(node, 0)}, {self.mom(node, 0)}, "
                     f"{self.param(node, 1) if b else 'NULL'}, {self.mom(node, 1) if b else 'NULL'});")
        return lines

    def op_relu(self, node, out, ins, first):
        return [f"et_relu_forward({_numel(node['shape'])}, {ins[0][0]}, {out});"]

    def op_relu_bwd(self, node, out, ins, first):
        return [f"et_relu_backward({_numel(node['shape'])}, {ins[0][0]}, {ins[1][0]}, {out});"]

    def op_relu6(self, node, out, ins, first):
        return [f"et_relu6_forward({_numel(node['shape'])}, {ins[0][0]}, {out});"]

    def op_relu6_bwd(self, node, out, ins, first):
        return [f"et_relu6_backward({_numel(node['shape'])}, {ins[0][0]}, {ins[1][0]}, {out});"]

    def op_maxpool_argmax(self, node, out, ins, first):
        return [f"et_maxpool2d_forward({self.pool_struct(node, True)}, {ins[0][0]}, NULL, {out});"]

    def op_maxpool_gather(self, node, out, ins, first):
        return [f"et_maxpool2d_gather({self.pool_struct(node, True)}, {ins[0][0]}, {ins[1][0]}, {out});"]

    def op_maxpool_bwd(self, node, out, ins, first):
        k = self.pool_struct(self.by_name[node["forward_of"]], True)
        return [f"et_maxpool2d_backward({k}, {ins[0][0]}, {ins[1][0]}, {out});"]

    def op_avg_pool2d(self, node, out, ins, first):
        return [f"et_avgpool2d_forward({self.pool_struct(node, False)}, {ins[0][0]}, {out});"]

    def op_avg_pool2d_bwd(self, node, out, ins, first):
        k = self.pool_struct(self.by_name[node["forward_of"]], False)
        return [f"et_avgpool2d_backward({k}, {ins[0][0]}, {out});"]

    def op_adaptive_avg_pool2d(self, node, out, ins, first):
        x = ins[0][1]
        return [f"et_global_avgpool_forward({x[0]}, {x[1]}, {x[2] * x[3]}, {ins[0][0]}, {out});"]

    def op_adaptive_avg_pool2d_bwd(self, node, out, ins, first):
        x = node["attrs"]["input_shape"]
        return [f"et_global_avgpool_backward({x[0]}, {x[1]}, {x[2] * x[3]}, {ins[0][0]}, {out});"]

    def op_add(self, node, out, ins, first):
        return [f"et_add_forward({_numel(node['shape'])}, {ins[0][0]}, {ins[1][0]}, {out});"]

    def op_grad_sum(self, node, out, ins, first):
        n = _numel(node["shape"])
        lines = [f"et_add_forward({n}, {ins[0][0]}, {ins[1][0]}, {out});"]
        lines += [f"et_add_into({n}, {out}, {p});" for p, _ in ins[2:]]  # left to right, as the Python runtime
        return lines

    def op_cat(self, node, out, ins, first):
        shape = node["shape"]
        hw = _numel(shape[2:])
        lines, c_off = [], 0
        for p, s in ins:
            lines.append(f"et_concat_forward_part({shape[0]}, {hw}, {shape[1]}, {c_off}, {s[1]}, {p}, {out});")
            c_off += s[1]
        return lines

    def op_cross_entropy(self, node, out, ins, first):
        (logits, ls), (labels, _) = ins
        call = f"et_cross_entropy_forward({ls[0]}, {ls[1]}, {logits}, {labels})"
        if first:
            return [f"step_loss = {call};", f"*{out} = step_loss;"]
        return [f"*{out} = {call};"]

    def op_cross_entropy_bwd(self, node, out, ins, first):
        (logits, ls), (labels, _) = ins
        return [f"et_cross_entropy_backward({ls[0]}, {ls[1]}, {logits}, {labels}, {out});"]


def _why(st: dict, prefix: str) -> str:
    """A step's reason, without the "<action> <tensor>: " the validator's reasons may start with."""
    reason = st["reason"]
    return reason[len(prefix):] if reason.startswith(prefix) else reason


def _lifetimes(em: _Emitter, steps: list[dict]) -> tuple[list[tuple], list[Lifetime]]:
    """Each step with the lifetimes of the tensors it touches, and all lifetimes (to be packed before the
    code is rendered: the offsets go into the code)."""
    by_name = em.by_name
    lifetimes: list[Lifetime] = []
    current: dict[str, Lifetime] = {}
    plan: list[tuple[dict, dict, Lifetime | None]] = []  # step, operand lifetimes, output lifetime
    for k, st in enumerate(steps):
        a, name = st["action"], st["tensor"]
        node = by_name.get(name)
        if a in ("compute", "recompute"):
            lts = {r["t"]: current[r["t"]] for r in node["inputs"]}
            out = None
            if node["shape"] is not None:
                out = Lifetime(name, k, -1, _numel(node["shape"]))
                lifetimes.append(out)
                current[name] = out
            plan.append((st, lts, out))
        elif a == "page_in":
            out = Lifetime(name, k, -1, _numel(node["shape"]))
            lifetimes.append(out)
            current[name] = out
            plan.append((st, {}, out))
        elif a == "page_out":
            plan.append((st, {}, current[name]))
        elif a == "free":
            lt = current.pop(name)
            lt.end = k
            plan.append((st, {}, lt))
        else:
            raise CodegenError(f"unknown step action {a!r}")
    if current:
        raise CodegenError(f"the schedule leaves {sorted(current)[:5]} resident at the end of the step")
    return plan, lifetimes


def _render_train(em: _Emitter, plan) -> tuple[list[Block], list[dict]]:
    blocks: list[Block] = []
    page_ids: dict[str, int] = {}
    pages: list[dict] = []
    stage = -1
    for st, lts, lt in plan:
        node = em.by_name[st["tensor"]]
        a = st["action"]
        comments = []
        if st["stage"] != stage:
            stage = st["stage"]
            snode = em.nodes[stage]
            comments.append(f"---- stage {stage}: {snode['name']} ({snode['kind']}, {snode['op']})")
        if a in ("compute", "recompute"):
            out = None
            if lt is not None:
                out, _ = em.ptr({"t": node["name"]}, {node["name"]: lt})
            ins = [em.ptr(r, lts) for r in node["inputs"]]
            what = f"{a} {node['name']} ({node['op']})"
            why = _why(st, f"{a} {node['name']}: ")
            comments.append(f"{what}: {why}" if why else what)
            blocks.append(Block(comments, em.call(node, out, ins, a == "compute")))
        elif a == "page_out":
            if node["name"] not in page_ids:
                page_ids[node["name"]] = len(page_ids) + 1
                pages.append({"id": page_ids[node["name"]], "tensor": node["name"], "bytes": 4 * lt.words,
                              "paged_in": False})
            p, _ = em.ptr({"t": node["name"]}, {node["name"]: lt})
            comments.append(f"page out {node['name']} (page {page_ids[node['name']]}, {4 * lt.words} B): {st['reason']}")
            blocks.append(Block(comments, [f"ET_TRY(et_page_out({page_ids[node['name']]}u, {p}, {4 * lt.words}u));",
                                           f"if (et_page_out_hook != NULL) et_page_out_hook({page_ids[node['name']]}u);"]))
        elif a == "page_in":
            pid = page_ids.get(node["name"])
            if pid is None:
                raise CodegenError(f"page-in of `{c_comment(node['name'])}` before any page-out")
            pages[pid - 1]["paged_in"] = True
            p, _ = em.ptr({"t": node["name"]}, {node["name"]: lt})
            comments.append(f"page in {node['name']} (page {pid}, {4 * lt.words} B): {_why(st, 'page in ' + node['name'] + ': ')}")
            blocks.append(Block(comments, [f"ET_TRY(et_page_in({pid}u, {p}, {4 * lt.words}u));"]))
        else:  # free: nothing to do at run time but the arena slot is reusable from the next step on
            comments.append(f"free {node['name']} (floats {lt.offset}..{lt.offset + lt.words - 1}): {st['reason']}")
            blocks.append(Block(comments, []))
    return blocks, pages


def _predict(em: _Emitter, logits_ref: dict) -> tuple[list[Block], Packing, str]:
    """A forward pass only, no paging: every forward tensor freed after its last forward reader."""
    fwd = [n for n in em.nodes if n["kind"] in ("input", "forward")]
    last = {n["name"]: i for i, n in enumerate(fwd)}
    for i, n in enumerate(fwd):
        for r in n["inputs"]:
            last[r["t"]] = max(last[r["t"]], i)
    last[logits_ref["t"]] = len(fwd)
    lts = {n["name"]: Lifetime(n["name"], i, last[n["name"]], _numel(n["shape"])) for i, n in enumerate(fwd)}
    packing = pack(list(lts.values()))
    blocks = []
    for n in fwd:
        out, _ = em.ptr({"t": n["name"]}, lts)
        ins = [em.ptr(r, lts) for r in n["inputs"]]
        blocks.append(Block([f"{n['name']} ({n['op']})" + (f" -- {n['source']}" if n["source"] else "")],
                            em.call(n, out, ins, True)))
    logits_ptr, _ = em.ptr(logits_ref, lts)
    return blocks, packing, logits_ptr


def _weights(path: str, params: dict) -> dict[str, np.ndarray]:
    tensors = load_file(path)
    out = {}
    for name, spec in params.items():
        key = f"param/{name}"
        if key not in tensors:
            raise CodegenError(f"{path} has no tensor for parameter `{c_comment(name)}`; recompile the model")
        a = np.ascontiguousarray(tensors[key], dtype=np.float32).reshape(-1)
        if a.size != _numel(spec["shape"]):
            raise CodegenError(f"{path}: parameter `{c_comment(name)}` has {a.size} values, the schedule {spec['shape']}")
        out[name] = a
    return out


def _rows(values: np.ndarray, per_row: int = 6) -> list[str]:
    lits = [c_float(v) for v in values.tolist()]
    return [", ".join(lits[i:i + per_row]) for i in range(0, len(lits), per_row)]


def render_c_firmware(schedule: dict, out_dir: str, weights_file: str = "weights.safetensors",
                      schedule_file: str = "schedule.json") -> dict:
    """Write the firmware folder; returns its figures (arena, state, paging). Raises BudgetError when
    the packed arena does not fit the budget."""
    if schedule.get("backend") != "c":
        raise CodegenError("this schedule was compiled for the Python runtime (its DAG counts int64 indices and "
                           "gradient buffers); compile with --emit c for C firmware")
    g = schedule["graph"]
    if g["buffers"]:
        raise CodegenError(f"the model has buffers ({', '.join(c_comment(b) for b in list(g['buffers'])[:3])}); "
                           "the C runtime has no op that keeps buffers")
    em = _Emitter(schedule)
    for n in em.nodes:
        if n["workspace_bytes"] or n["aux_bytes"]:
            raise CodegenError(f"node `{c_comment(n['name'])}` holds a workspace the C runtime does not have; "
                               "compile with --emit c")
    steps = schedule["steps"]
    plan, lifetimes = _lifetimes(em, steps)
    packing = pack(lifetimes)
    blocks, pages = _render_train(em, plan)
    loss_node = next(n for n in em.nodes if n["kind"] == "loss")
    predict_blocks, predict_packing, logits_ptr = _predict(em, loss_node["inputs"][0])

    # The memory figures, held against the schedule's prediction and the budget.
    param_bytes = sum(4 * _numel(p["shape"]) for p in g["params"].values())
    state_bytes = param_bytes * (2 if g["optimizer"]["momentum"] else 1)
    predicted_activation = schedule["predicted"]["peak_bytes"] - state_bytes
    if 4 * packing.lower_bound_words != predicted_activation:
        raise CodegenError(  # the schedule's memory model and the firmware's must count the same bytes
            f"memory model mismatch: the steps keep at most {4 * packing.lower_bound_words} B of tensors alive, "
            f"the schedule predicted {predicted_activation} B of activations")
    arena_words = max(packing.words, predict_packing.words)
    budget = schedule["budget"]["bytes"]
    if state_bytes + 4 * arena_words > budget:
        raise BudgetError(
            f"the offset planner packs the schedule's tensors into a {4 * arena_words} B arena "
            f"(the schedule's activation peak is {predicted_activation} B; fragmentation adds "
            f"{4 * arena_words - predicted_activation} B), which with {state_bytes} B of parameters and momentum "
            f"is {state_bytes + 4 * arena_words} B, over the budget of {budget} B. No firmware was written. Raise "
            f"--budget to at least {state_bytes + 4 * arena_words}B or try another --scheduler.")

    weights = _weights(os.path.join(out_dir, weights_file), g["params"])
    input_node = em.nodes[0]
    logits_shape = em._in_shape(loss_node, 0)
    ctx = {
        "s": schedule,
        "schedule_file": schedule_file,
        "content": content_hash(schedule),
        "params": [{"name": name, "ident": em.pident[name], "mident": em.mident.get(name),
                    "floats": _numel(spec["shape"]), "shape": spec["shape"], "rows": _rows(weights[name])}
                   for name, spec in g["params"].items()],
        "momentum": bool(g["optimizer"]["momentum"]),
        "sgd": {k: c_float(g["optimizer"][k]) for k in ("lr", "momentum", "weight_decay")},
        "structs": list({id(e): e for e in em.structs.values()}.values()),
        "blocks": blocks,
        "predict_blocks": predict_blocks,
        "logits_ptr": logits_ptr,
        "arena_words": arena_words,
        "train_arena_bytes": packing.bytes,
        "predict_arena_bytes": predict_packing.bytes,
        "activation_peak_bytes": predicted_activation,
        "strategy": packing.strategy,
        "state_bytes": state_bytes,
        "param_floats": param_bytes // 4,
        "budget_bytes": budget,
        "pages": pages,
        "paged_bytes": schedule["predicted"]["paged_bytes"],
        "batch": input_node["shape"][0],
        "input_floats": _numel(input_node["shape"]),
        "logits_floats": _numel(logits_shape),
        "num_classes": logits_shape[-1],
        "runtime_sources": RUNTIME_SOURCES,
        "vendored": VENDORED,
        "instructions_per_tick": INSTRUCTIONS_PER_TICK,
    }
    texts = {name: _ENV.get_template(name + ".j2").render(**ctx, target=target)
             for name, target in (("plan.c", None), ("plan.h", None), ("Makefile", None))}
    driver = _ENV.get_template("main.c.j2")
    texts["main_host.c"] = driver.render(**ctx, target="host")
    texts["main_qemu.c"] = driver.render(**ctx, target="qemu")
    manifest = {
        "format": "edgetrain.firmware", "version": 1, "schedule_content": ctx["content"],
        "params": [{"name": p["name"], "ident": p["ident"], "floats": p["floats"], "shape": p["shape"]}
                   for p in ctx["params"]],
        "pages": pages, "arena_bytes": 4 * arena_words, "train_arena_bytes": packing.bytes,
        "predict_arena_bytes": predict_packing.bytes, "activation_peak_bytes": predicted_activation,
        "arena_strategy": packing.strategy, "state_bytes": state_bytes, "budget_bytes": budget,
        "predicted_peak_bytes": schedule["predicted"]["peak_bytes"], "paged_bytes_per_step": ctx["paged_bytes"],
        "batch": ctx["batch"], "input_floats": ctx["input_floats"], "logits_floats": ctx["logits_floats"],
        "num_classes": ctx["num_classes"], "instructions_per_tick": INSTRUCTIONS_PER_TICK,
    }
    texts["firmware.json"] = json.dumps(manifest, indent=1, sort_keys=True) + "\n"
    for name, text in texts.items():
        with open(os.path.join(out_dir, name), "w") as f:
            f.write(text)
    _vendor_runtime(os.path.join(out_dir, VENDORED))
    return manifest


def _vendor_runtime(dest: str) -> None:
    """A copy of runtime/c next to the plan, so the firmware folder builds on its own."""
    shutil.rmtree(dest, ignore_errors=True)
    for src in sorted(RUNTIME_DIR.rglob("*")):
        rel = src.relative_to(RUNTIME_DIR)
        if src.is_dir() or rel.parts[0] == "selftest" or src.suffix not in (".c", ".h", ".ld", ".md"):
            continue
        os.makedirs(os.path.join(dest, *rel.parts[:-1]), exist_ok=True)
        shutil.copyfile(src, os.path.join(dest, *rel.parts))
