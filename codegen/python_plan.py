"""Render a schedule as a Python plan module for the torch runtime (Jetson, Raspberry Pi, host)."""
from __future__ import annotations

import os

import torch
from safetensors.torch import save_file

from edgetrain.compiler.schedule_file.format import content_hash  # the schedule format, not a solver
from edgetrain.runtime.python.inplace import INPLACE
from edgetrain.targets import Target

from .templating import environment

_ENV = environment("templates")


def _py(value) -> str:
    """A Python literal; repr() of a float round-trips exactly."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_py(k)}: {_py(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_py(v) for v in value) + "]"
    return repr(value)


def _operands(inputs: list[dict]) -> str:
    return _py([r["t"] if not r.get("view") else r for r in inputs])


def _extras(node: dict) -> str:
    out = ""
    if node["params"]:
        out += f", params={_py(node['params'])}"
    if node["buffers"]:
        out += f", buffers={_py(node['buffers'])}"
    if node["attrs"]:
        out += f", attrs={_py(node['attrs'])}"
    if node["aux_of"]:
        out += f", aux_of={_py(node['aux_of'])}"
    return out


_ENV.filters.update(py=_py, operands=_operands, extras=_extras)


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


def _step_node(steps: list[dict], i: int, node: dict | None) -> dict | None:
    """The node as step i runs it: an in-place-capable op gets `attrs.dying` where the plan frees an operand next."""
    if node is None or steps[i]["action"] not in ("compute", "recompute") or node["op"] not in INPLACE:
        return node
    dying = dying_operands(steps, i, node)
    return dict(node, attrs={**node["attrs"], "dying": dying}) if dying else node


def render_python_plan(schedule: dict, out_dir: str, schedule_file: str = "schedule.json") -> str:
    nodes = schedule["graph"]["nodes"]
    by_name = {n["name"]: n for n in nodes}
    stages = [{"index": t, "node": n, "steps": []} for t, n in enumerate(nodes)]
    steps = schedule["steps"]
    for i, st in enumerate(steps):
        stages[st["stage"]]["steps"].append(dict(st, node=_step_node(steps, i, by_name.get(st["tensor"]))))
    threads = Target(**schedule["target"]).cpu_threads  # the profile's, or the field's own default
    text = _ENV.get_template("plan.py.j2").render(s=schedule, stages=stages, schedule_file=schedule_file,
                                                   content=content_hash(schedule), threads=threads)
    path = os.path.join(out_dir, "plan.py")
    with open(path, "w") as f:
        f.write(text)
    return path


def _own(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each tensor with a storage of its own, as safetensors needs; copied only where it shares one or views a
    part of one (a copy of every weight doubled a large model's memory while writing)."""
    out, seen = {}, set()
    for k, v in tensors.items():
        v = v.detach().contiguous()
        storage = v.untyped_storage()
        shared = storage.data_ptr() in seen or storage.nbytes() != v.nbytes or v.storage_offset() != 0
        seen.add(storage.data_ptr())
        out[k] = v.clone() if shared else v
    return out


def write_weights(params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], out_dir: str) -> str:
    """Initial weights as safetensors: `param/<name>` and `buffer/<name>`."""
    tensors = _own({**{f"param/{k}": v for k, v in params.items()}, **{f"buffer/{k}": v for k, v in buffers.items()}})
    path = os.path.join(out_dir, "weights.safetensors")
    save_file(tensors, path)
    return path
