"""Render a schedule as a Python plan module for the torch runtime (Jetson, Raspberry Pi, host).

plan.py reads as Python: `train_step(rt)` has one statement per schedule step, each op called with its arguments
inline on the plan's variables (`python_calls.py`, in the language of runtime/python/plan_api.py), each free and
page with its reason, each stage headed by its node and the user's source line, lines kept short (`py_layout.py`).
"""
from __future__ import annotations

import json
import os
import struct

import torch

from edgetrain.compiler.schedule_file.format import content_hash  # the schedule format, not a solver
from edgetrain.runtime.python.fused_kernels import FUSED_OP
from edgetrain.runtime.python.inplace import INPLACE
from edgetrain.runtime.python.streamed_weights import DTYPES
from edgetrain.targets import Target

from .py_layout import Group, comment, statement
from .python_calls import CallWriter, Names, layout, literal
from .templating import environment

_ENV = environment("templates")
SAFETENSORS_DTYPE = {v: k for k, v in DTYPES.items()}  # torch dtype -> the file's name for it


def _py(value) -> str:
    """A Python literal; repr() of a float round-trips exactly."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_py(k)}: {_py(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_py(v) for v in value) + "]"
    return repr(value)


_ENV.filters.update(py=literal)


def dying_operands(steps: list[dict], i: int, node: dict) -> list[int]:
    """Operands of step i's op (as they are, not through a view) that the steps right after it free before
    anything else runs: the runtime may write an in-place op's output into them (runtime/python/inplace.py)."""
    freed = set()
    for st in steps[i + 1:]:
        if st["action"] != "free":
            break
        freed.add(st["tensor"])
    names = [r["t"] for r in node["inputs"]]
    return [k for k, r in enumerate(node["inputs"])
            if not r.get("view") and r["t"] in freed and names.count(r["t"]) == 1]


def _same_call(a: dict | None, b: dict) -> bool:
    """Whether two nodes hold different outputs of one call of their op (the runtime runs it once)."""
    if a is None or a["op"] != b["op"] or a["inputs"] != b["inputs"]:
        return False
    strip = ("keep", "aux", "updates", "then", "scratch", "dying", "loss_item", "into")

    def call(n: dict) -> dict:
        return {k: v for k, v in n["attrs"].items() if k not in strip}

    return isinstance(a["attrs"].get("keep"), int) and isinstance(b["attrs"].get("keep"), int) and call(a) == call(b)


def _stage_lines(t: int, node: dict) -> list[str]:
    words = f"-- stage {t}: {node['name']} ({node['kind']})" + (f" -- {node['source']}" if node.get("source") else "")
    return comment(words)


def _step_lines(steps: list[dict], i: int, node: dict | None, names: Names, before: dict | None) -> list[str]:
    st = steps[i]
    action, tensor, reason = st["action"], st["tensor"], st.get("reason", "")
    if action in ("free", "page_out", "page_in"):
        return statement(f"rt.{action}(", names.tensor(tensor) + ")", note=reason)
    if node["kind"] in ("input", "labels"):
        return statement(f"{names.tensor(tensor)} = ", f"rt.load_{node['kind']}()")
    first = action == "compute"
    dying = dying_operands(steps, i, node) if node["op"] in INPLACE and "into" not in node["attrs"] else []
    call = CallWriter(names, node).call("rt.call(" if first else "rt.recompute(", dying)
    keep = node["attrs"].get("keep")
    if keep in ("none", []):
        head = ""
    elif first and node["attrs"].get("aux"):
        head = f"{names.tensor(tensor)}, {names.tensor(tensor + '.aux')} = "
    else:
        head = f"{names.tensor(tensor)} = "
    notes = []  # a first computation's reason is its stage's source line, above it already
    if not first:
        notes.append(f"recompute {tensor}: {reason}" if reason else f"recompute {tensor}")
    if _same_call(before, node):
        notes.append(f"output {keep} of the call above: the op runs once")
    lines = [line for n in notes for line in comment(n)]
    return lines + statement(head, call)


def render_plan_text(schedule: dict, schedule_file: str = "schedule.json") -> str:
    """plan.py's text for a schedule (as loaded from JSON)."""
    graph = schedule["graph"]
    nodes = graph["nodes"]
    by_name = {n["name"]: n for n in nodes}
    names = Names()
    for p in graph.get("params", {}):  # named in the model's order, whichever the plan reads first
        names.declare("param", p)
    for b in graph.get("buffers", {}):
        names.declare("buffer", b)
    for n in nodes:
        names.tensor(n["name"])
        if n["attrs"].get("aux"):
            names.tensor(n["name"] + ".aux")
    steps = schedule["steps"]
    body: list[str] = []
    stage, before = None, None
    for i, st in enumerate(steps):
        if st["stage"] != stage:
            stage = st["stage"]
            body += _stage_lines(stage, nodes[stage])
        node = by_name.get(st["tensor"])
        body += _step_lines(steps, i, node, names, before)
        before = node if st["action"] in ("compute", "recompute") else None  # any other op ends a twin's turn
    s = schedule
    plan = {"schedule_content": content_hash(s), "weights": "weights.safetensors", "optimizer": graph["optimizer"],
            "trainable": graph.get("trainable"), "seed": s["seed"], "model": s["model"]["spec"],
            "input_shape": graph["input_shape"], "loss": graph["loss"],
            "num_classes": s["model"]["num_classes"],  # labels are class ids 0..num_classes-1 (None: values)
            "labels_shape": next(n["shape"] for n in nodes if n["kind"] == "labels"),
            "budget_bytes": s["budget"]["bytes"],
            "predicted_peak_bytes": s["predicted"]["peak_bytes"],
            "threads": Target(**s["target"]).cpu_threads}  # the profile's, or the field's own default
    if graph.get("memory_format"):  # `--fuse` on a convolutional model: its weights channels-last
        plan["memory_format"] = graph["memory_format"]
    streamed = {n["name"]: n["streamed"] for n in nodes if n.get("streamed")}
    if streamed:  # node -> the frozen weights it reads from weights.safetensors each time it runs
        plan["streamed"] = streamed
    kernels = []  # each fused node's chain, bound once
    by_kernel = {names.kernel(n["name"]): n for n in nodes if n["op"] == FUSED_OP}
    for ident, n in by_kernel.items():
        kernels += statement(f"{ident} = ", Group("kernel(", (layout(n["attrs"]["chain"]),), ")"), indent=0)
    plan_lines = []
    for k, v in plan.items():
        lines = statement(f'"{k}": ', layout(v))
        lines[-1] += ","
        if k == "threads":
            lines[-1] += "  # CPU threads: the kernel scratch is counted for them"
        plan_lines += lines
    return _ENV.get_template("plan.py.j2").render(
        s=s, schedule_file=schedule_file, content=plan["schedule_content"], plan_lines=plan_lines,
        params=names.bound("param"), buffers=names.bound("buffer"), body=body, kernels=kernels,
        imports=", ".join(sorted({"aten", *(w for w in ("buffer", "param") if names.bound(w))}
                                 | (names.used & {"empty", "fused", "held", "kernel", "out"}))),
        uses_torch="torch" in names.used)


def render_python_plan(schedule: dict, out_dir: str, schedule_file: str = "schedule.json") -> str:
    text = render_plan_text(schedule, schedule_file)
    path = os.path.join(out_dir, "plan.py")
    with open(path, "w") as f:
        f.write(text)
    return path


def _bytes(t: torch.Tensor) -> memoryview:
    """A CPU tensor's bytes as laid out in memory (bf16 has no numpy dtype: read as bytes)."""
    t = t.detach().contiguous().cpu()
    return memoryview(t.reshape(-1).view(torch.uint8).numpy()) if t.numel() else memoryview(b"")


def write_weights(params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], out_dir: str,
                  source=None) -> str:
    """Initial weights as safetensors: `param/<name>` and `buffer/<name>`, written one tensor at a time (a copy of
    every weight doubled a large model's memory while writing); a meta tensor's bytes read from `source`
    (compiler/frontend/meta_weights.WeightSource), one tensor held at a time. Written to a temporary name, then
    renamed."""
    tensors = {**{f"param/{k}": v for k, v in params.items()}, **{f"buffer/{k}": v for k, v in buffers.items()}}
    header, at = {}, 0
    for k, v in tensors.items():
        if v.dtype not in SAFETENSORS_DTYPE:
            raise ValueError(f"weight {k} has dtype {v.dtype}, which the weights file cannot hold")
        n = v.numel() * v.element_size()
        header[k] = {"dtype": SAFETENSORS_DTYPE[v.dtype], "shape": list(v.shape), "data_offsets": [at, at + n]}
        at += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    path = os.path.join(out_dir, "weights.safetensors")
    tmp = path + ".partial"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for k, v in tensors.items():
            if v.is_meta and source is None:
                raise ValueError(f"weight {k} is on the meta device and the model names no source of its values")
            value = source.get(k.split("/", 1)[1]) if v.is_meta else v
            if value.dtype != v.dtype or tuple(value.shape) != tuple(v.shape):
                raise ValueError(f"the weights source's '{k}' is {value.dtype} {list(value.shape)}, the model's "
                                 f"{v.dtype} {list(v.shape)}")
            f.write(_bytes(value))
            del value  # a source's tensor is let go before the next is read
    os.replace(tmp, path)
    return path
