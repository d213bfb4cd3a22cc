"""Render a schedule as C training firmware for runtime/c: plan.c/plan.h, two drivers and a Makefile.

Everything comes from schedule.json and weights.safetensors; no solver runs here. The steps of the
schedule become straight-line kernel calls at literal offsets of one static arena, whose offsets the
planner in `arena.py` packs from the steps' lifetimes (`lifetimes.py`). Parameters are C initializers, and
frozen weights the graph streams from storage are written as CRC-checked blocks to storage/ (the SD card's
files; both `flash_data.py`; an int8 prefix's in their integer bytes) and paged into the arena before each
computation that reads them. If the packed
arena plus the parameters and momentum buffers would exceed the budget, rendering fails with the figures: no
firmware that can overflow is ever written.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from math import prod
from pathlib import Path

from edgetrain.compiler.errors import ArenaOverflowError  # messages for the user, not a solver
from edgetrain.compiler.graph.input_storage import read_bytes  # an input batch read patch by patch
from edgetrain.compiler.graph.ir import TensorRef, TrainingGraph  # the schedule's graph
from edgetrain.compiler.graph.quantize import Q8_DEQUANTIZE  # an int8 prefix's boundary
from edgetrain.compiler.graph.tiling import TILED_OP  # a frozen prefix computed patch by patch
from edgetrain.compiler.schedule_file.format import content_hash  # the schedule format
from edgetrain.targets import Target
from edgetrain.targets.boards import board_of

from edgetrain.codegen.templating import environment
from .arena import Lifetime, Packing, live_peak_bytes, pack
from .flash_data import C_TYPES, STORAGE_DIR, WEIGHT_PAGE_BASE, BLOCK_PAGES, buffer_rows, float_rows, \
    q8_integers, read_weights, write_storage
from .lifetimes import (in_storage, own_workspace, step_lifetimes, stream_bytes, stream_lifetimes, tensor_bytes,
                        tensor_lifetime, transient_lifetimes)
from .emitters import Context, EmitError, emit
from .names import Namer, c_comment, c_float
from .patches import emit_patches, emit_q8_patches
from .weight_blocks import emit_blocked_conv, read_shape
from .operands import holder_meta, node_cases, operand_meta, state_shapes  # each node's ops, bound
from .ops import DROPOUT, Q8_OPS, Q8_PATCH_SOURCE, CodegenError, kernel_sources  # the C op table
from .q8_emit import emit_q8
from .qas_emit import emit_qas, gradient_floats  # int8 bias training's backward node
from edgetrain.compiler.graph.qas_lower import QAS_BACKWARD

RUNTIME_DIR = Path(__file__).resolve().parents[2] / "runtime" / "c"
VENDORED = "et_runtime"  # the runtime's copy inside the firmware folder
FIRMWARE_FILES = ("plan.c", "plan.h", "main_host.c", "main_qemu.c", "Makefile", "firmware.json")
# Runtime sources every build compiles. Both builds keep pages in files (storage_file.c); each adds the
# raw-I/O back end under it (storage_stdio.c on the host, storage_semihost.c under QEMU).
RUNTIME_SOURCES = ("et_status.c", "et_math.c", "crc32.c", "storage_block.c", "storage_file.c",
                   "storage_input.c") + kernel_sources()
Q8_SOURCES = {f"kernels/{s}.c" for k in Q8_OPS.values() for s in k.source_files} | {  # an int8 prefix's kernels
    f"kernels/{Q8_PATCH_SOURCE}.c"}
# int8 bias training's alone: linked only where a plan trains int8 biases (3.6 KB of flash in every int8 image else)
QAS_SOURCES = {f"kernels/{s}.c" for s in Q8_OPS[QAS_BACKWARD].source_files} - {
    f"kernels/{s}.c" for op, k in Q8_OPS.items() if op != QAS_BACKWARD for s in k.source_files}

_ENV = environment("templates/c")


def _runtime_sources(em) -> tuple[str, ...]:
    """The runtime sources a plan's image compiles: a float plan's holds no int8 code, an int8 prefix's no int8
    bias training's."""
    ops = {n["op"] for n in em.nodes}
    if not (em.q8_tables or ops & set(Q8_OPS)):
        return tuple(s for s in RUNTIME_SOURCES if s not in Q8_SOURCES)
    return RUNTIME_SOURCES if QAS_BACKWARD in ops else tuple(s for s in RUNTIME_SOURCES if s not in QAS_SOURCES)
ARENA_MACROS = {"float32": "ET_F", "int32": "ET_I", "int8": "ET_Q"}  # plan.c's typed pointers into the arena


_ENV.filters.update(comment=c_comment, cfloat=c_float, size=lambda n: f"{n >> 20} MB" if n % (1 << 20) == 0 else f"{n >> 10} KB",
                    hex32=lambda n: f"0x{n:08X}u")


@dataclass
class Block:
    """One schedule step as C: the comment lines above it and the statements."""

    comments: list[str]
    code: list[str] = field(default_factory=list)


def _numel(shape) -> int:
    return prod(shape) if shape else 1


class _Emitter:
    """Turns the schedule's nodes into kernel calls: each op of a node through its emitter (emitters.py)."""

    def __init__(self, schedule: dict) -> None:
        g = schedule["graph"]
        self.graph = TrainingGraph.from_json(g)
        self.nodes = g["nodes"]
        self.by_name = {n["name"]: n for n in self.nodes}
        self.node_objs = {n.name: n for n in self.graph.nodes}
        self.params = g["params"]
        self.trainable = set(self.graph.trainable_params)
        self.opt = g["optimizer"]
        self.namer = Namer()
        self.pident = {p: self.namer(p, "p") for p in self.params}
        self.buffers = g["buffers"]
        self.bident = {b: self.namer(b, "b") for b in self.buffers}
        self.mident = {p: self.namer(p, "m") for p in self.params if p in self.trainable} \
            if self.opt["momentum"] else {}
        self.structs: dict[str, dict] = {}  # struct key -> {"type", "ident", "fields", "layers"}
        self.by_param: dict[str, dict] = {}  # a convolution's weight -> its struct
        # The input batch read from storage by its readers' patches (`x` is then an et_input_reader *).
        self.input_in_storage = any(in_storage(n) for n in self.nodes)
        self._layer = ""
        self.ctx = Context({**self.pident, **self.bident}, self.mident, self._struct)
        self.state = state_shapes(self.graph)
        self.shapes = {n.name: n.shape for n in self.graph.nodes}
        self.q8_tables: dict[str, dict] = {}  # an int8 convolution's requantisation, by node: const data
        self.qas_consts: list[dict] = []  # int8 bias training's rescale tables and bias scales: const data
        # Streamed weights: a page id each; they have no array, a reader finds them where they were paged in.
        self.patch_calls = 0  # kernel calls emitted for patch-by-patch nodes: code the per-step estimate misses
        self.q8_patch_calls = 0  # the same for int8 ones (larger calls)
        self.streamed = {p: WEIGHT_PAGE_BASE + BLOCK_PAGES * k for k, p in enumerate(self.graph.streamed_params)}
        # A weight paged in by blocks of output channels: (page, first row, end row) per block, its pages in a row.
        rows = {p: r for n in self.graph.nodes for p, r in n.attrs.get("stream_rows", {}).items()}
        self.blocks = {p: [(self.streamed[p] + j, r0, min(r0 + rows[p], self.params[p]["shape"][0]))
                           for j, r0 in enumerate(range(0, self.params[p]["shape"][0], rows[p]))] for p in rows}

    def _struct(self, ctype: str, param: str | None, fields: dict | None) -> str:
        """One const struct per distinct shape; a backward without the shapes at hand (fields None) takes the
        struct of the forward that reads the same weight."""
        if fields is None:
            return "&" + self.by_param[param]["ident"]
        items = [(k, int(v)) for k, v in fields.items()]
        entry = next((e for e in self.structs.values() if e["type"] == ctype and e["fields"] == items), None)
        if entry is None:
            entry = {"type": ctype, "ident": self.namer(self._layer, "k"), "fields": items, "layers": []}
            self.structs[entry["ident"]] = entry
        if self._layer not in entry["layers"]:
            entry["layers"].append(self._layer)
        if param is not None:
            self.by_param.setdefault(param, entry)
        return "&" + entry["ident"]

    def _read_paged(self, paged: dict[str, int] | None) -> dict[str, str]:
        """Point the emitters at the streamed weights where they were paged in (arena word `paged[p]`), typed as
        their arrays in flash would be (float, an int8 prefix's int8 weights and int32 biases); returns the
        identifiers to put back."""
        held = {p: self.ctx.pident[p] for p in paged or {}}
        self.ctx.pident.update({p: f"{ARENA_MACROS[self.params[p].get('dtype', 'float32')]}({off})"
                                for p, off in (paged or {}).items()})
        return held

    def call(self, name: str, offsets: dict[str, int], first: bool, predict: bool = False,
             paged: dict[str, int] | None = None) -> list[str]:
        """The statements of one computation of node `name`, its tensors at the arena `offsets` (in words);
        `first`: its first computation in the step (buffer updates happen then), `predict`: inference;
        `paged`: the arena offsets its streamed weights were paged in at."""
        node = self.node_objs[name]
        self._layer = name
        self.ctx.first, self.ctx.predict = first, predict
        if node.attrs.get("stream_rows"):  # a weight paged in block by block: the op per block (weight_blocks.py)
            return emit_blocked_conv(node, offsets, self.ctx, self.params, self.blocks, paged or {},
                                     read_shape(self.node_objs[node.inputs[0].name], node.inputs[0].view))
        if node.op == QAS_BACKWARD:  # int8 bias training's backward and update (qas_emit.py)
            try:
                return emit_qas(node, offsets, self.ctx, self.graph.node, self.params, self.opt, self.qas_consts,
                                self.namer)
            except EmitError as e:
                raise CodegenError(f"node `{c_comment(name)}` ({node.op}): {e}") from None
        if node.op in Q8_OPS:  # an int8 frozen prefix's node: its kernel call (q8_emit.py)
            held = self._read_paged(paged)
            try:
                return emit_q8(node, offsets, self.ctx, self.shapes, self.params, self.q8_tables, self.namer)
            except EmitError as e:
                raise CodegenError(f"node `{c_comment(name)}` ({node.op}): {e}") from None
            finally:
                self.ctx.pident.update(held)
        if node.op == TILED_OP:  # a frozen prefix, patch by patch: its own statements (patches.py)
            try:
                reader = "x" if self.reads_stored_input(name) else None  # the input batch from storage
                lines = (emit_q8_patches(node, offsets, self.ctx, self.params, self.q8_tables, self.namer, reader)
                         if node.dtype == "int8" else emit_patches(node, offsets, self.ctx, self.params, reader))
                calls = sum(1 for line in lines if not line.startswith("/*"))
                if node.dtype == "int8":
                    self.q8_patch_calls += calls
                else:
                    self.patch_calls += calls
                return lines
            except EmitError as e:
                raise CodegenError(f"node `{c_comment(name)}` ({node.op}): {e}") from None
        cases = node_cases(node, self.node_objs, self.state, offsets)
        lines: list[str] = []
        held = self._read_paged(paged)
        try:
            for i, case in enumerate(cases):
                out = case.out if i == 0 else None
                try:
                    lines += emit(case, self.ctx, out, f"node `{name}`")
                except EmitError as e:
                    raise CodegenError(f"node `{c_comment(name)}` ({case.op}): {e}; recompile with --emit c") from None
        finally:
            self.ctx.pident.update(held)
        if first and "loss_item" in node.attrs:  # the step's loss, as computed (not as recomputed)
            held = holder_meta(node, offsets[name])
            loss = held[node.attrs["loss_item"]] if isinstance(held, tuple) else held
            lines.append(f"step_loss = *ET_F({loss.storage_offset()});")
        return lines

    def reads_stored_input(self, name: str) -> bool:
        """Whether node `name` reads the input batch from storage (its bytes: input_storage.read_bytes)."""
        return any(in_storage(self.by_name[r["t"]]) for r in self.by_name[name]["inputs"])


def _why(st: dict, prefix: str) -> str:
    """A step's reason, without the "<action> <tensor>: " the validator's reasons may start with."""
    reason = st["reason"]
    return reason[len(prefix):] if reason.startswith(prefix) else reason


def _compute(em: _Emitter, node: dict, offsets: dict[str, int], first: bool, predict: bool = False,
             streams: dict[str, Lifetime] | None = None) -> list[str]:
    """The statements that compute a node: the batch copied in, or its streamed weights paged in (stopping
    the step if a block fails its check) and its ops."""
    if in_storage(node):  # never whole in RAM: its readers read their patches where it lies
        return ["/* read from storage patch by patch by its readers (et_patch_read) */"]
    if node["kind"] in ("input", "labels"):
        src = "x" if node["kind"] == "input" else "y"
        return [f"memcpy({'ET_I' if node['dtype'] == 'int32' else 'ET_F'}({offsets[node['name']]}), {src}, "
                f"{tensor_bytes(node)}u);"]
    streams = streams or {}
    lines = [f"ET_TRY(et_page_in({em.streamed[p]}u, ET_F({lt.offset}), {lt.nbytes}u)); /* {c_comment(p)} */"
             for p, lt in streams.items() if p not in em.blocks]  # a blocked one: paged in by its op, block by block
    return lines + em.call(node["name"], offsets, first, predict, {p: lt.offset for p, lt in streams.items()})


def _render_train(em: _Emitter, plan) -> tuple[list[Block], list[dict]]:
    blocks: list[Block] = []
    page_ids: dict[str, int] = {}
    pages: list[dict] = []
    stage = -1
    for st, lts, lt, streams in plan:
        node = em.by_name.get(st["tensor"], {"name": st["tensor"]})  # or a batch norm's statistics (free)
        a = st["action"]
        comments = []
        if st["stage"] != stage:
            stage = st["stage"]
            snode = em.nodes[stage]
            comments.append(f"---- stage {stage}: {snode['name']} ({snode['kind']}, {snode['op']})"
                            + (f" -- {snode['source']}" if snode.get("source") else ""))
        if a in ("compute", "recompute"):
            offsets = {name: t.offset for name, t in lts.items()}
            if lt is not None:
                offsets[node["name"]] = lt.offset
            what = f"{a} {node['name']} ({node['op']})"
            why = _why(st, f"{a} {node['name']}: ")
            comments.append(f"{what}: {why}" if why else what)
            if streams:
                comments.append("its frozen weights streamed from storage: " + ", ".join(
                    f"{p} (page {em.streamed[p]}, {t.nbytes} B)" for p, t in streams.items()))
            blocks.append(Block(comments, _compute(em, node, offsets, a == "compute", streams=streams)))
        elif a == "page_out":
            if node["name"] not in page_ids:
                page_ids[node["name"]] = len(page_ids) + 1
                pages.append({"id": page_ids[node["name"]], "tensor": node["name"], "bytes": lt.nbytes,
                              "paged_in": False})
            pid = page_ids[node["name"]]
            comments.append(f"page out {node['name']} (page {pid}, {lt.nbytes} B): {st['reason']}")
            blocks.append(Block(comments, [f"ET_TRY(et_page_out({pid}u, ET_F({lt.offset}), {lt.nbytes}u));",
                                           f"if (et_page_out_hook != NULL) et_page_out_hook({pid}u);"]))
        elif a == "page_in":
            pid = page_ids.get(node["name"])
            if pid is None:
                raise CodegenError(f"page-in of `{c_comment(node['name'])}` before any page-out")
            pages[pid - 1]["paged_in"] = True
            comments.append(f"page in {node['name']} (page {pid}, {lt.nbytes} B): "
                            f"{_why(st, 'page in ' + node['name'] + ': ')}")
            blocks.append(Block(comments, [f"ET_TRY(et_page_in({pid}u, ET_F({lt.offset}), {lt.nbytes}u));"]))
        elif lt is None:  # free of an operand an output was written over: its floats are that output's
            comments.append(f"free {node['name']}: {st['reason']} (its floats hold the output written over it)")
            blocks.append(Block(comments, []))
        else:  # free: nothing to do at run time but the arena slot is reusable from the next step on
            comments.append(f"free {node['name']} (floats {lt.offset}..{lt.offset + lt.words - 1}): {st['reason']}")
            blocks.append(Block(comments, []))
    return blocks, pages


def _logits(em: _Emitter) -> dict:
    """The model's output: what the loss reads, before the log-softmax the loss begins with."""
    loss = next(n for n in em.nodes if n["kind"] == "loss")
    ref = loss["inputs"][0]
    src = em.by_name[ref["t"]]
    if src["op"] == "aten._log_softmax.default" and not ref.get("view"):
        ref = src["inputs"][0]
    return ref


def _predict(em: _Emitter, logits_ref: dict) -> "Predict":
    """A forward pass only, no paging but of streamed weights, no buffer updates: every forward tensor freed
    after its last forward reader, up to the logits."""
    fwd = [n for n in em.nodes if n["kind"] in ("input", "forward")]
    end = next(i for i, n in enumerate(fwd) if n["name"] == logits_ref["t"]) + 1
    fwd = fwd[:end]
    last = {n["name"]: i for i, n in enumerate(fwd)}
    for i, n in enumerate(fwd):
        for r in n["inputs"]:
            last[r["t"]] = max(last[r["t"]], i)
    last[logits_ref["t"]] = len(fwd)
    lts = {n["name"]: tensor_lifetime(n, i, last[n["name"]]) for i, n in enumerate(fwd) if not in_storage(n)}
    for i, n in enumerate(fwd):  # patch buffers, int8 scratch
        lts.update(transient_lifetimes(em, n, i))
    streams = {n["name"]: stream_lifetimes(em, n, i) for i, n in enumerate(fwd)}
    packing = pack(list(lts.values()) + [lt for s in streams.values() for lt in s.values()])
    offsets = {name: lt.offset for name, lt in lts.items()}
    blocks, boundary, at = [], [], 0
    for n in fwd:
        blocks.append(Block([f"{n['name']} ({n['op']})" + (f" -- {n['source']}" if n["source"] else "")],
                            _compute(em, n, offsets, False, predict=True, streams=streams[n["name"]])))
        if n["kind"] == "input" or n["op"] in Q8_OPS or (n["op"] == TILED_OP and n["dtype"] == "int8"):
            # the int8 prefix alone (its nodes, or its patch-by-patch ones), to its dequantised boundary
            boundary.append(Block(blocks[-1].comments, list(blocks[-1].code)))
            if n["op"] == Q8_DEQUANTIZE:  # copied out at once: its slot may serve a later tensor
                count = _numel(n["shape"])
                boundary[-1].code.append(f"ET_TRY(out(ctx, ET_F({offsets[n['name']]}), {count}u));")
                at += count
    logits = operand_meta(em.node_objs, TensorRef.from_json(logits_ref), offsets)
    if not logits.is_contiguous():
        raise CodegenError("the model's output is not contiguous in the arena")
    return Predict(blocks, packing, f"ET_F({logits.storage_offset()})", logits.numel(), boundary if at else [], at)


@dataclass
class Predict:
    """Inference as C: its statements and arena; and, with an int8 prefix, the statements that run that prefix
    alone and copy its dequantised boundary tensors out (`boundary_floats` of them, in graph order)."""

    blocks: list[Block]
    packing: Packing
    logits_ptr: str
    logits_floats: int
    boundary_blocks: list[Block]
    boundary_floats: int


def render_c_firmware(schedule: dict, out_dir: str, weights_file: str = "weights.safetensors",
                      schedule_file: str = "schedule.json") -> dict:
    """Write the firmware folder; returns its figures (arena, state, paging). Raises BudgetError when
    the packed arena does not fit the budget."""
    if schedule.get("backend") != "c":
        raise CodegenError("this schedule was compiled for the Python runtime (its DAG counts int64 indices and "
                           "gradient buffers); compile with --emit c for C firmware")
    g = schedule["graph"]
    em = _Emitter(schedule)
    for n in em.nodes:  # the only workspace the C runtime has: the weights a node pages in, or its patches
        own = own_workspace(em, n) if n["op"] in (TILED_OP, *Q8_OPS) else 0  # patches, int8 scratch
        if n["workspace_bytes"] != own + sum(stream_bytes(em, n, p) for p in n.get("streamed", ())):
            raise CodegenError(f"node `{c_comment(n['name'])}` holds a workspace the C runtime does not have; "
                               "compile with --emit c")
    steps = schedule["steps"]
    # Bytes of the input batch read from storage per step: each computation of a reader, recomputes too.
    input_reads = sum(read_bytes(em.node_objs[st["tensor"]]) for st in steps
                      if st["action"] in ("compute", "recompute") and em.reads_stored_input(st["tensor"]))
    plan, lifetimes = step_lifetimes(em, steps)
    packing = pack(lifetimes)
    blocks, pages = _render_train(em, plan)
    pr = _predict(em, _logits(em))
    predict_blocks, predict_packing, logits_ptr, logits_floats = pr.blocks, pr.packing, pr.logits_ptr, pr.logits_floats

    # The memory figures, held against the schedule's prediction and the budget.
    state_bytes = em.graph.state_bytes  # parameters, and momentum for the trained ones
    predicted_activation = schedule["predicted"]["peak_bytes"] - state_bytes
    live = live_peak_bytes(lifetimes)  # int8 tensors count their bytes, not the words they are placed on
    if live != predicted_activation:
        raise CodegenError(  # the schedule's memory model and the firmware's must count the same bytes
            f"memory model mismatch: the steps keep at most {live} B of tensors alive, "
            f"the schedule predicted {predicted_activation} B of activations")
    arena_words = max(packing.words, predict_packing.words)
    budget = schedule["budget"]["bytes"]
    if state_bytes + 4 * arena_words > budget:
        raise ArenaOverflowError(
            f"the offset planner packs the schedule's tensors into a {4 * arena_words} B arena "
            f"(the schedule's activation peak is {predicted_activation} B; fragmentation adds "
            f"{4 * arena_words - predicted_activation} B), which with {state_bytes} B of parameters and momentum "
            f"is {state_bytes + 4 * arena_words} B, over the budget of {budget} B. No firmware was written. Raise "
            f"--budget to at least {state_bytes + 4 * arena_words}B or try another --scheduler.",
            state_bytes + 4 * arena_words - budget)

    weights = read_weights(os.path.join(out_dir, weights_file), g["params"])
    integers = q8_integers(em, weights)  # an int8 prefix's weights and biases, from the float ones
    streamed = write_storage(out_dir, em, {**weights, **integers})  # each in the dtype its kernel reads
    buffer_values = read_weights(os.path.join(out_dir, weights_file), g["buffers"], "buffer")
    for name, spec in g["buffers"].items():
        if spec["dtype"] not in ("float32", "int64"):
            raise CodegenError(f"buffer `{c_comment(name)}` has dtype {spec['dtype']}; the C runtime keeps float32 "
                               "and int64 buffers")
    buffers = [{"name": name, "ident": em.bident[name], "ctype": "float" if spec["dtype"] == "float32" else "int64_t",
                "floats": _numel(spec["shape"]), "shape": spec["shape"], "rows": buffer_rows(buffer_values[name],
                                                                                          spec["dtype"])}
               for name, spec in g["buffers"].items()]
    params = [{"name": name, "ident": em.pident[name], "mident": em.mident.get(name), "trainable": name in em.trainable,
               "floats": _numel(spec["shape"]), "shape": spec["shape"], "ctype": C_TYPES[spec.get("dtype", "float32")],
               "rows": buffer_rows(integers[name], "int") if name in integers else float_rows(weights[name])}
              for name, spec in g["params"].items() if name not in em.streamed]
    input_node = em.nodes[0]
    board = board_of(Target(**schedule["target"]))  # where the QEMU build runs
    ctx = {
        "s": schedule,
        "schedule_file": schedule_file,
        "content": content_hash(schedule),
        "params": params,
        "buffers": buffers,
        # What the driver writes back after training: the parameters, then the float buffers.
        # (and int8 bias training's int32 biases, their bits as the floats' slots)
        "dumped": [p for p in params if p["ctype"] == "float" or (p["ctype"] == "int32_t" and p["trainable"])]
        + [b for b in buffers if b["ctype"] == "float"],
        "qas_consts": em.qas_consts,
        "qas": any(n["op"] == QAS_BACKWARD for n in em.nodes),
        "q8_tables": list(em.q8_tables.values()),
        "momentum": bool(g["optimizer"]["momentum"]),
        "sgd": {k: c_float(g["optimizer"][k]) for k in ("lr", "momentum", "weight_decay")},
        "structs": list({id(e): e for e in em.structs.values()}.values()),
        "blocks": blocks,
        "predict_blocks": predict_blocks,
        "logits_ptr": logits_ptr,
        "boundary_blocks": pr.boundary_blocks,
        "boundary_floats": pr.boundary_floats,
        "arena_words": arena_words,
        "train_arena_bytes": packing.bytes,
        "predict_arena_bytes": predict_packing.bytes,
        "activation_peak_bytes": predicted_activation,
        "strategy": packing.strategy,
        "state_bytes": state_bytes,
        "param_floats": sum(p["floats"] for p in params + buffers if p.get("ctype", "float") == "float"
                            or (p["ctype"] == "int32_t" and p["trainable"])),
        "budget_bytes": budget,
        "pages": pages,
        "streamed": streamed,
        "paged_bytes": schedule["predicted"]["paged_bytes"],
        "batch": input_node["shape"][0],
        "input_floats": _numel(input_node["shape"]),
        "input_in_storage": em.input_in_storage,
        "input_read_bytes": input_reads,
        "logits_floats": logits_floats,
        "num_classes": logits_floats // input_node["shape"][0],
        "runtime_sources": _runtime_sources(em),
        "vendored": VENDORED,
        "board": board,
        "instructions_per_tick": board.instructions_per_tick,
        # Only a plan with dropout has a seed and a step counter (its masks are hashes of both).
        "dropout_seed": int(schedule["seed"]) & 0xFFFFFFFF if any(n["op"] == DROPOUT for n in em.nodes) else None,
    }
    texts = {name: _ENV.get_template(name + ".j2").render(**ctx, target=target)
             for name, target in (("plan.c", None), ("plan.h", None), ("Makefile", None))}
    driver = _ENV.get_template("main.c.j2")
    texts["main_host.c"] = driver.render(**ctx, target="host")
    texts["main_qemu.c"] = driver.render(**ctx, target="qemu")
    manifest = {
        "format": "edgetrain.firmware", "version": 1, "schedule_content": ctx["content"],
        "params": [{"name": p["name"], "ident": p["ident"], "floats": p["floats"], "shape": p["shape"],
                    **({} if "mident" in p else {"kind": "buffer"}),
                    **({"dtype": "int32"} if p["ctype"] == "int32_t" else {})} for p in ctx["dumped"]],
        # int8 bias training: the floats of the head's gradient the driver writes each step (qas_grads.bin)
        "qas_grad_floats": sum(gradient_floats(n, em.graph.node) for n in em.graph.nodes if n.op == QAS_BACKWARD),
        "pages": pages, "streamed": streamed, "storage_dir": STORAGE_DIR,
        "streamed_bytes": sum(w["bytes"] for w in streamed), "arena_bytes": 4 * arena_words, "train_arena_bytes": packing.bytes,
        "predict_arena_bytes": predict_packing.bytes, "activation_peak_bytes": predicted_activation,
        "arena_strategy": packing.strategy, "state_bytes": state_bytes, "budget_bytes": budget,
        "predicted_peak_bytes": schedule["predicted"]["peak_bytes"], "paged_bytes_per_step": ctx["paged_bytes"],
        "batch": ctx["batch"], "input_floats": ctx["input_floats"], "input_in_storage": em.input_in_storage,
        "input_read_bytes_per_step": input_reads, "logits_floats": ctx["logits_floats"],
        "num_classes": ctx["num_classes"], "instructions_per_tick": board.instructions_per_tick,
        "patch_calls": em.patch_calls,
        "q8_patch_calls": em.q8_patch_calls,
        "int8_boundary": [n["name"] for n in em.nodes if n["op"] == Q8_DEQUANTIZE],  # et_int8_boundary's tensors
        "int8_boundary_floats": pr.boundary_floats,
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
